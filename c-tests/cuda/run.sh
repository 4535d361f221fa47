#!/usr/bin/env bash
# Builds the CUDA C test against the debug libkcache.so (built first) or LIB_DIR, and the test
# driver library that stands in for libcuda.so.1 (no GPU is available in CI), built by the
# test-kit crate with the flags the Rust tests use. Runs the test once plain and once with
# AddressSanitizer + UndefinedBehaviorSanitizer on the C side.
# Usage: c-tests/cuda/run.sh [LIB_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
KC_LSAN_SUPPRESSIONS="$KC_ROOT/c-tests/cuda/lsan.supp"

kc_library debug "${1:-}"
FAKE_CUDA=$(cargo run --quiet -p kcache-testkit --bin stand-ins -- cuda)
kc_run() {
  local bin=$1 variant=$2
  "$bin/cuda_test" "$FAKE_CUDA" "$KC_WORK/$variant-disk"
  "$bin/cuda_test" unavailable
}
kc_suites "CUDA C tests" c-tests/cuda cuda -DKCACHE_FAKE_CUDA="$FAKE_CUDA"
