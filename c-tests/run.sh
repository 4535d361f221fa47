#!/usr/bin/env bash
# The C ABI checks: the committed header equals a fresh cbindgen generation, then the C tests
# (c-tests/CMakeLists.txt) against the release library, once plain and once with ASan+UBSan on
# the C side. Build directories: target/c-tests/{plain,sanitize}.
#
# Environment: KCACHE_STRESS_SECONDS (default 3) for the stress test; CBINDGEN (default
# cbindgen) for the generator, which must be the version pinned in cbindgen.toml.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CBINDGEN="${CBINDGEN:-cbindgen}"
STRESS_SECONDS="${KCACHE_STRESS_SECONDS:-3}"
JOBS="${KCACHE_JOBS:-2}"

fail() {
  echo "c-tests/run.sh: $*" >&2
  exit 1
}

# --- the header is cbindgen's output, unedited and current ------------------------------------
pinned="$(sed -n 's/^# Generates .* Pinned: cbindgen \([0-9.]*\).*/\1/p' cbindgen.toml)"
[[ -n "$pinned" ]] || fail "cbindgen.toml does not name its pinned cbindgen version"
have="$("$CBINDGEN" --version 2>/dev/null || true)"
[[ "$have" == "cbindgen $pinned" ]] ||
  fail "need cbindgen $pinned (cargo install --locked cbindgen --version $pinned), found '${have:-none}'"
fresh="$(mktemp)"
trap 'rm -f "$fresh"' EXIT
"$CBINDGEN" --config cbindgen.toml --crate kcache --output "$fresh" 2>/dev/null ||
  fail "cbindgen failed: run it by hand to see why"
if ! cmp -s "$fresh" include/kcache.h; then
  diff -u include/kcache.h "$fresh" | head -40 >&2 || true
  fail "include/kcache.h is stale: cbindgen --config cbindgen.toml --crate kcache --output include/kcache.h"
fi
# The C API is kc_*/KC_*/KCACHE_* only: anything else means a module outside src/ffi leaked
# into the header (mark its `mod` line in src/lib.rs with `/// cbindgen:ignore`).
leaked="$(grep -E '^(#define|typedef|[a-z].*\()' include/kcache.h |
  grep -vE '^#define (KCACHE_|KC_)' |
  grep -vE '^typedef (enum|struct) kc_|^typedef [a-z_0-9 ]*\(\*kc_[a-z_0-9]*\)|^typedef .*[ *]kc_[a-z_0-9]*;$' |
  grep -vE '^[a-z_0-9 ]*[ *](kc_[a-z_0-9]*)\(' || true)"
[[ -z "$leaked" ]] || fail "include/kcache.h declares names outside kc_/KC_/KCACHE_:"$'\n'"$leaked"
echo "include/kcache.h is current and declares only kc_/KC_/KCACHE_ names"

# --- the library and the C tests --------------------------------------------------------------
cargo build --release --lib
LIB_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/release"
[[ "$LIB_DIR" == /* ]] || LIB_DIR="$ROOT/$LIB_DIR"

run_suite() {
  local name=$1
  shift
  local dir="target/c-tests/$name"
  echo "== C tests: $name"
  cmake -S c-tests -B "$dir" -DKCACHE_LIB_DIR="$LIB_DIR" \
    -DKCACHE_INCLUDE_DIR="$ROOT/include" -DKCACHE_STRESS_SECONDS="$STRESS_SECONDS" "$@" >/dev/null &&
    cmake --build "$dir" -j "$JOBS" &&
    ctest --test-dir "$dir" --output-on-failure
}

# Both configurations run even when the first fails: their failures tell different stories.
failed=()
run_suite plain -DKCACHE_SANITIZE=OFF || failed+=(plain)
run_suite sanitize -DKCACHE_SANITIZE=ON || failed+=("ASan+UBSan")
[[ ${#failed[@]} -eq 0 ]] || fail "C tests failed: ${failed[*]}"
echo "C tests passed: plain and ASan+UBSan"
