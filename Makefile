# The README's commands. `make test` and `make demo` set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: test demo bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip

# Reinstalling (editable) rebuilds the compiled core whenever its source or the build files change.
$(INSTALLED): $(PY) pyproject.toml setup.py src/fastlease/_core.pyx
	$(PY) -m pip install -q -e . --group test --group bench
	touch $@

test: $(INSTALLED)
	$(PY) -m pytest

demo: $(INSTALLED)
	$(VENV)/bin/fastlease demo

bench: $(INSTALLED)
	$(PY) bench/memory_cycle.py
	$(PY) bench/dynamodb_cycle.py
	$(PY) bench/renewal_under_load.py
	$(PY) bench/handoff.py
	$(PY) bench/sqlite_cycle.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info src/fastlease/_core.c src/fastlease/*.so
