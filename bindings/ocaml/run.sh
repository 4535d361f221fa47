#!/usr/bin/env bash
# Builds the debug library with cargo (a no-op when it is current), then the OCaml binding
# against it and runs its tests (`dune test`). The dune build directory is a scratch one, so the
# tree stays clean.
# Environment: CARGO_TARGET_DIR (where cargo builds), KCACHE_INCLUDE_DIR (default include/).
# Usage: bindings/ocaml/run.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../c-tests/common.sh"

kc_library debug
export KCACHE_LIB_DIR="$KC_LIB_DIR"
export KCACHE_INCLUDE_DIR="${KCACHE_INCLUDE_DIR:-$KC_ROOT/include}"
dune test --root bindings/ocaml --build-dir "$KC_WORK/dune" --display short 2>&1
