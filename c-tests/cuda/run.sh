#!/usr/bin/env bash
# Builds the CUDA C test and the test driver library (which stands in for libcuda.so.1, as no
# GPU is available in CI) against the debug libkcache.so (built first) or LIB_DIR, and runs the
# test, once plain and once with AddressSanitizer + UndefinedBehaviorSanitizer on the C side.
# Usage: c-tests/cuda/run.sh [LIB_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
KC_LSAN_SUPPRESSIONS="$KC_ROOT/c-tests/cuda/lsan.supp"

kc_library debug "${1:-}"
kc_run() {
  local bin=$1 variant=$2
  "$bin/cuda_test" "$bin/libfake_cuda.so" "$KC_WORK/$variant-disk"
  "$bin/cuda_test" unavailable
  echo "cuda_test unavailable: ok"
}
kc_suites "CUDA C tests" c-tests/cuda cuda
