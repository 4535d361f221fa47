#!/usr/bin/env bash
# The C ABI checks: the committed header equals a fresh cbindgen generation, then the C tests
# (c-tests/CMakeLists.txt) against the release library, once plain and once with ASan+UBSan on
# the C side. Build directories: target/c-tests/core/{plain,sanitize}.
# Usage: c-tests/run.sh [LIB_DIR]  (default: cargo's release library, built first)
#
# Environment: KCACHE_STRESS_SECONDS (default 3) for the stress test; CBINDGEN (default
# cbindgen) for the generator, which must be the version pinned in cbindgen.toml.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
CBINDGEN="${CBINDGEN:-cbindgen}"
STRESS_SECONDS="${KCACHE_STRESS_SECONDS:-3}"

# --- the header is cbindgen's output, unedited and current ------------------------------------
pinned="$(sed -n 's/^# Generates .* Pinned: cbindgen \([0-9.]*\).*/\1/p' cbindgen.toml)"
[[ -n "$pinned" ]] || kc_fail "cbindgen.toml does not name its pinned cbindgen version"
have="$("$CBINDGEN" --version 2>/dev/null || true)"
[[ "$have" == "cbindgen $pinned" ]] ||
  kc_fail "need cbindgen $pinned (cargo install --locked cbindgen --version $pinned), found '${have:-none}'"
fresh="$KC_WORK/kcache.h"
"$CBINDGEN" --config cbindgen.toml --crate kcache --output "$fresh" 2>/dev/null ||
  kc_fail "cbindgen failed: run it by hand to see why"
if ! cmp -s "$fresh" include/kcache.h; then
  diff -u include/kcache.h "$fresh" | head -40 >&2 || true
  kc_fail "include/kcache.h is stale: cbindgen --config cbindgen.toml --crate kcache --output include/kcache.h"
fi
# The C API is kc_*/KC_*/KCACHE_* only: anything else means a module outside src/ffi leaked
# into the header (mark its `mod` line in src/lib.rs with `/// cbindgen:ignore`).
leaked="$(grep -E '^(#define|typedef|[a-z].*\()' include/kcache.h |
  grep -vE '^#define (KCACHE_|KC_)' |
  grep -vE '^typedef (enum|struct) kc_|^typedef [a-z_0-9 ]*\(\*kc_[a-z_0-9]*\)|^typedef .*[ *]kc_[a-z_0-9]*;$' |
  grep -vE '^[a-z_0-9 ]*[ *](kc_[a-z_0-9]*)\(' || true)"
[[ -z "$leaked" ]] || kc_fail "include/kcache.h declares names outside kc_/KC_/KCACHE_:"$'\n'"$leaked"
echo "include/kcache.h is current and declares only kc_/KC_/KCACHE_ names"

# --- the library and the C tests --------------------------------------------------------------
kc_library release "${1:-}"
kc_run() {
  ctest --test-dir "$1" --output-on-failure
}
kc_suites "C tests" c-tests core -DKCACHE_STRESS_SECONDS="$STRESS_SECONDS"
