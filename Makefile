# The README's commands. `make test` and `make demo` set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# The version-dependent tests (pytest -m all_pythons) also run on these pyenv versions, after the main
# suite, each in a venv of its own made with that interpreter: .venv-3.12 for 3.12.1. EXTRA_PYTHONS= runs none.
EXTRA_PYTHONS ?= 3.12.1 3.13.0
# The files that hold the all_pythons tests: those runs collect only these (collecting the whole suite to
# select a few files' tests took 5 s per interpreter). tests/test_all_pythons.py checks that no other has any.
ALL_PYTHONS_TESTS := tests/test_all_pythons.py tests/test_pulse.py tests/test_renewal_gil.py tests/test_renewal_process.py
# What an install builds from: a change to any of them reinstalls (and so rebuilds) every venv's core.
BUILD_INPUTS := pyproject.toml setup.py src/fastlease/_core.pyx src/fastlease/_core.pxd src/fastlease/_pulse.h \
	$(wildcard src/fastlease/_engine/*.py src/fastlease/_engine/*.pxd) src/fastlease/_engine/source_crc.h

.PHONY: test test-all-pythons demo bench chaos clean redis-server postgresql wheel

# The first run is a silent minute (venv, pip, compiling the core): each step says so before it starts.
$(PY):
	@echo "creating $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip

# Reinstalling (editable) rebuilds the compiled core whenever its source or the build files change.
$(INSTALLED): $(PY) $(BUILD_INPUTS)
	@echo "installing fastlease into $(VENV) and compiling its core: about a minute, and pip is quiet meanwhile"
	$(PY) -m pip install -q -e . --group test --group bench
	touch $@

# The venv of one of EXTRA_PYTHONS (.venv-3.12: 3.12.1), the package installed editable, so that its
# compiled core is built for that interpreter. The extensions sit side by side in src/fastlease/ (the
# .so names carry the version), so no venv's build replaces another's. Each build re-cythonizes the
# shared .c files, so two must not overlap: these come after the main venv's (order-only), one at a time.
.venv-%/.installed: $(BUILD_INPUTS) | $(INSTALLED)
	@if [ ! -x .venv-$*/bin/python ]; then \
		version='$(filter $*.%,$(EXTRA_PYTHONS))'; [ -n "$$version" ] || \
			{ echo "no version $*.x in EXTRA_PYTHONS ($(EXTRA_PYTHONS))" >&2; exit 1; }; \
		set -x; PYENV_VERSION=$$version python3 -m venv .venv-$* && .venv-$*/bin/python -m pip install -q -U pip; \
	fi
	.venv-$*/bin/python -m pip install -q -e . --group test
	touch $@

# Shell: the versions of EXTRA_PYTHONS that this machine lacks, in $$missing: an error under CI=true,
# elsewhere a message (their runs are skipped). For a version pyenv lacks, `PYENV_VERSION=X python3`
# quietly runs another python3, so the interpreter itself must report X.
CHECK_PYTHONS = missing=; for version in $(EXTRA_PYTHONS); do \
	[ "$$(PYENV_VERSION=$$version python3 -c 'import platform; print(platform.python_version())' 2>/dev/null)" \
	  = "$$version" ] || missing="$$missing $$version"; done; \
	if [ -n "$$missing" ] && [ "$$CI" = true ]; then \
		echo "error: make test runs the all_pythons tests on Python$$missing too, missing here:" \
		     "install it with 'pyenv install$$missing', or set EXTRA_PYTHONS" >&2; exit 1; \
	elif [ -n "$$missing" ]; then \
		echo "Python$$missing missing here (install it with 'pyenv install$$missing'): its all_pythons tests are skipped"; fi

# The commit subjects, lint and strict typing first (seconds), then the suite, then the all_pythons
# tests on EXTRA_PYTHONS. Under CI=true, a missing interpreter or a missing git history fails before
# the suite, not 8 minutes later.
test: $(INSTALLED) redis-server postgresql
	@if [ "$$CI" = true ]; then $(CHECK_PYTHONS); fi
	$(PY) .ci/check-commit-subjects
	$(VENV)/bin/ruff check src tests bench setup.py
	$(VENV)/bin/mypy --strict src/fastlease
	$(PY) -m pytest
	@$(MAKE) --no-print-directory test-all-pythons

# Only the all_pythons tests, on each of EXTRA_PYTHONS (building its venv first when needed).
test-all-pythons: $(INSTALLED)
	@$(CHECK_PYTHONS); for version in $(EXTRA_PYTHONS); do \
		case " $$missing " in *" $$version "*) continue;; esac; \
		venv=.venv-$${version%.*}; \
		$(MAKE) --no-print-directory -q $$venv/.installed || $(MAKE) --no-print-directory $$venv/.installed || exit 1; \
		echo "$$venv/bin/python -m pytest -m all_pythons $(ALL_PYTHONS_TESTS)"; \
		$$venv/bin/python -m pytest -m all_pythons $(ALL_PYTHONS_TESTS) || exit 1; \
	done

# Shell: the executable $(1) (or $$$(2) set) is there; else, as root with apt-get, install the Debian
# package $(3) that has it; else say so, and that the $(4) tests skip until then (they fail under CI=true).
APT_INSTALL = DEBIAN_FRONTEND=noninteractive apt-get install -y -q
ENSURE_TOOL = if [ -n "$$$(2)" ] || command -v $(1) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(1) (apt-get install $(3))"; \
		$(APT_INSTALL) $(3) >/dev/null 2>&1 || { apt-get update -q >/dev/null && $(APT_INSTALL) $(3) >/dev/null; }; \
	else \
		echo "$(1) is missing: install it (sudo apt-get install -y $(3)) or set $(2);" \
		     "the $(4) tests are skipped until then"; \
	fi

# The Redis tests start their own redis-server (a free 127.0.0.1 port, no persistence), and the Redis
# Cluster tests three of them, joined by redis-cli (Debian's redis-tools, which redis-server pulls in).
redis-server:
	@$(call ENSURE_TOOL,redis-server,REDIS_SERVER,redis-server,Redis)
	@$(call ENSURE_TOOL,redis-cli,REDIS_CLI,redis-tools,Redis Cluster)

# The PostgreSQL tests make a throwaway cluster (initdb, the server on a free 127.0.0.1 port). Debian's
# package puts initdb in /usr/lib/postgresql/<version>/bin, not on PATH: fastlease.testing looks there.
# Installed here when missing and we are root; otherwise a message, and those tests skip (they fail under CI=true).
postgresql:
	@if [ -n "$$PG_BINDIR" ] || command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing postgresql (apt-get)"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; }; \
	else \
		echo "PostgreSQL is missing: install it (sudo apt-get install -y postgresql) or set PG_BINDIR to the" \
		     "directory of its initdb; the PostgreSQL tests are skipped until then"; \
	fi

# Build the sdist and wheel, repair the wheel (auditwheel, manylinux_2_28 at most), install it into a clean
# venv outside the tree and run the server-free suite against it; then the sdist's no-compiler fallback.
wheel: $(PY)
	$(PY) -m pip install -q --group wheel 2>&1 | grep -v "^WARNING: Location" || true
	wheels/build_and_test.sh

demo: $(INSTALLED)
	$(VENV)/bin/fastlease demo

# The reliability harness, long: every store (the Redis Cluster too) for SECONDS each (make test runs a
# bounded one).
SECONDS ?= 600
chaos: $(INSTALLED) redis-server postgresql
	$(PY) -m tests.chaos --store all --seconds $(SECONDS)
	$(PY) -m tests.chaos --election --store all --seconds $(SECONDS)
	$(PY) -m tests.chaos --semaphore --store all --seconds $(SECONDS)
	$(PY) -m tests.chaos --gil --store all --seconds $(SECONDS)

bench: $(INSTALLED) postgresql
	$(PY) bench/import_time.py
	$(PY) bench/memory_cycle.py
	$(PY) bench/dynamodb_cycle.py
	$(PY) bench/wait_cpu.py
	$(PY) bench/renewal_under_load.py
	$(PY) bench/renewal_memory.py
	$(PY) bench/handoff.py
	$(PY) bench/sqlite_cycle.py
	$(PY) bench/redis_cycle.py
	$(PY) bench/idempotency.py
	$(PY) bench/postgres_cycle.py
	$(PY) bench/election.py
	$(PY) bench/semaphore.py
	$(PY) bench/celery_tasks.py

clean:
	rm -rf $(VENV) .venv-[0-9]* build dist src/*.egg-info src/fastlease/_core.c src/fastlease/_engine/*.c src/fastlease/*.so src/fastlease/_engine/*.so
