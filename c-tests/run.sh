#!/usr/bin/env bash
# The C ABI checks: the header declares only kcache's names, then the C tests
# (c-tests/CMakeLists.txt) against the release library, once plain and once with ASan+UBSan on
# the C side. Build directories: target/c-tests/core/{plain,sanitize}.
# Usage: c-tests/run.sh [LIB_DIR]  (default: cargo's release library, built first)
# That the header is cbindgen's current output is tests/header.rs (cargo test --test header).
#
# Environment: KCACHE_STRESS_SECONDS (default 3) for the stress test.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
STRESS_SECONDS="${KCACHE_STRESS_SECONDS:-3}"

# --- the header declares kcache's names only --------------------------------------------------
# The C API is kc_*/KC_*/KCACHE_* only: anything else means a module outside src/ffi leaked
# into the header (mark its `mod` line in src/lib.rs with `/// cbindgen:ignore`).
leaked="$(grep -E '^(#define|typedef|[a-z].*\()' include/kcache.h |
  grep -vE '^#define (KCACHE_|KC_)' |
  grep -vE '^typedef (enum|struct) kc_|^typedef [a-z_0-9 ]*\(\*kc_[a-z_0-9]*\)|^typedef .*[ *]kc_[a-z_0-9]*;$' |
  grep -vE '^[a-z_0-9 ]*[ *](kc_[a-z_0-9]*)\(' || true)"
[[ -z "$leaked" ]] || kc_fail "include/kcache.h declares names outside kc_/KC_/KCACHE_:"$'\n'"$leaked"
echo "include/kcache.h declares only kc_/KC_/KCACHE_ names"

# --- the library and the C tests --------------------------------------------------------------
kc_library release "${1:-}"
kc_run() {
  ctest --test-dir "$1" --output-on-failure
}
kc_suites "C tests" c-tests core -DKCACHE_STRESS_SECONDS="$STRESS_SECONDS"
