# The README's commands. `make test` and `make demo` set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: test demo bench chaos clean redis-server wheel

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip

# Reinstalling (editable) rebuilds the compiled core whenever its source or the build files change.
$(INSTALLED): $(PY) pyproject.toml setup.py src/fastlease/_core.pyx src/fastlease/_engine.py src/fastlease/_engine.pxd
	$(PY) -m pip install -q -e . --group test --group bench
	touch $@

# Lint and strict typing first (seconds), then the suite.
test: $(INSTALLED) redis-server
	$(VENV)/bin/ruff check src tests bench setup.py
	$(VENV)/bin/mypy --strict src/fastlease
	$(PY) -m pytest

# The Redis tests start their own redis-server (a free 127.0.0.1 port, no persistence). Installed
# here when missing and we are root; otherwise a message, and those tests skip (they fail under CI=true).
redis-server:
	@if [ -n "$$REDIS_SERVER" ] || command -v redis-server >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing redis-server (apt-get)"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }; \
	else \
		echo "redis-server is missing: install it (sudo apt-get install -y redis-server) or set REDIS_SERVER;" \
		     "the Redis tests are skipped until then"; \
	fi

# Build the sdist and wheel, repair the wheel (auditwheel, manylinux_2_28 at most), install it into a clean
# venv outside the tree and run the server-free suite against it; then the sdist's no-compiler fallback.
wheel: $(PY)
	$(PY) -m pip install -q --group wheel 2>&1 | grep -v "^WARNING: Location" || true
	wheels/build_and_test.sh

demo: $(INSTALLED)
	$(VENV)/bin/fastlease demo

# The reliability harness, long: every store for SECONDS each (make test runs a bounded one).
SECONDS ?= 600
chaos: $(INSTALLED) redis-server
	$(PY) -m tests.chaos --store all --seconds $(SECONDS)

bench: $(INSTALLED)
	$(PY) bench/import_time.py
	$(PY) bench/memory_cycle.py
	$(PY) bench/dynamodb_cycle.py
	$(PY) bench/renewal_under_load.py
	$(PY) bench/handoff.py
	$(PY) bench/sqlite_cycle.py
	$(PY) bench/redis_cycle.py
	$(PY) bench/idempotency.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info src/fastlease/_core.c src/fastlease/_engine.c src/fastlease/*.so
