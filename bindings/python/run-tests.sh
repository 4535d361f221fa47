#!/usr/bin/env bash
# Installs the Python package the way a user does (pip, from the repository: cargo builds
# libkcache and the kcache command into the wheel) into a fresh virtual environment, then runs
# its tests with pytest on the system's OpenCL implementation (PoCL in CI), after checking the
# type hints with mypy. The environment sees Debian's packages (--system-site-packages:
# pytest, pyopencl, numpy, setuptools, wheel, build), so pip needs no index. The packaging
# tests (tests/test_packaging.py) run `python -m build`, `pip wheel` and `pip install -e` in
# environments of their own; every cargo run shares one target directory.
# Usage: bindings/python/run-tests.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
TARGET="$CARGO_TARGET_DIR"
VENV="$TARGET/python-venv"
# Debian's interpreter, whose site-packages hold Debian's pyopencl and pytest.
PYTHON="${KCACHE_TEST_PYTHON:-/usr/bin/python3}"

# The package's type hints, checked strictly, and the tests type-checked as its users.
(
  cd bindings/python
  "$PYTHON" -m mypy --cache-dir "$TARGET/mypy-cache" src/kcache
  MYPYPATH=src "$PYTHON" -m mypy --cache-dir "$TARGET/mypy-cache" tests
)

rm -rf "$VENV"
"$PYTHON" -m venv --system-site-packages "$VENV"
"$VENV/bin/pip" install --quiet --no-index --no-build-isolation ./bindings/python
"$VENV/bin/python" -c 'import kcache; print("kcache", kcache.library_version(), "from", kcache.__file__)'

# PoCL's own kernel cache would hide whether a program came from kcache's disk tier.
export POCL_KERNEL_CACHE=0
# Run from the tests' directory so that the installed package, not the sources, is imported.
cd bindings/python/tests
"$VENV/bin/python" -m pytest -q -p no:cacheprovider .
