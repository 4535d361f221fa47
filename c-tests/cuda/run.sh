#!/usr/bin/env bash
# Builds the CUDA C tests against the debug libkcache.so (built first) or LIB_DIR, and the test
# driver library that stands in for libcuda.so.1 (no GPU is available in CI), built by the
# test-kit crate with the flags the Rust tests use. Runs the tests (shared_persistence shares its
# persistent tiers with an OpenCL cache on PoCL too) once plain and once with
# AddressSanitizer + UndefinedBehaviorSanitizer on the C side.
# Usage: c-tests/cuda/run.sh [LIB_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
# shared_persistence runs OpenCL (PoCL) too: both suppression lists.
KC_LSAN_SUPPRESSIONS="$KC_WORK/lsan.supp"
cat "$KC_ROOT/c-tests/cuda/lsan.supp" "$KC_ROOT/c-tests/opencl/lsan.supp" >"$KC_LSAN_SUPPRESSIONS"

kc_library debug "${1:-}"
FAKE_CUDA=$(cargo run --quiet -p kcache-testkit --bin stand-ins -- cuda)
kc_run() {
  local bin=$1 variant=$2
  "$bin/cuda_test" "$FAKE_CUDA" "$KC_WORK/$variant-disk"
  "$bin/cuda_test" unavailable
  "$bin/shared_persistence" "$FAKE_CUDA" "$KC_WORK/$variant-shared"
}
kc_suites "CUDA C tests" c-tests/cuda cuda -DKCACHE_FAKE_CUDA="$FAKE_CUDA"
