#!/usr/bin/env bash
# Builds the OpenCL C example and test against the debug libkcache.so (built first) or LIB_DIR
# and runs them on the system's OpenCL implementation (PoCL in CI), once plain and once with
# AddressSanitizer + UndefinedBehaviorSanitizer on the C side.
# Usage: c-tests/opencl/run.sh [LIB_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# PoCL's own kernel cache would make the cold path look warm; keep it out of the picture.
export POCL_KERNEL_CACHE=0
KC_LSAN_SUPPRESSIONS="$KC_ROOT/c-tests/opencl/lsan.supp"
# The suppressions name a PoCL function, so the whole allocation stack must be recorded.
KC_LSAN_FULL_STACKS=1

kc_check_readme_snippet c-tests/opencl/example.c
kc_library debug "${1:-}"
kc_run() {
  local bin=$1 variant=$2
  # The test compiles a broken kernel on purpose: PoCL prints "1 error generated." for it.
  "$bin/opencl_test" "$KC_WORK/$variant-test-cache"
  KCACHE_OPENCL_LIBRARY=/nonexistent/libOpenCL.so.1 "$bin/opencl_test" unavailable

  # The documented example: the first run compiles, the second loads the binary from disk.
  "$bin/opencl_example" "$KC_WORK/$variant-example-cache"
  "$bin/opencl_example" "$KC_WORK/$variant-example-cache" | tee "$KC_WORK/$variant-second.txt"
  grep -q "compiled from source: 0, loaded from disk: 1" "$KC_WORK/$variant-second.txt"

  # A program that returns from main (or calls exit) without freeing its cache still writes
  # its kernels: the next process loads them all. Its cache is leaked on purpose.
  for mode in return exit; do
    ASAN_OPTIONS=detect_leaks=0 "$bin/exit_without_free" "$mode" "$KC_WORK/$variant-exit-$mode"
    "$bin/exit_without_free" check "$KC_WORK/$variant-exit-$mode"
  done
  # A forked child flushes without writing the binary its parent holds back.
  "$bin/fork_held_back" "$KC_WORK/$variant-fork"

  # Under the layer, one thread launches while releases publish the binaries held back (its
  # program's among them): no abort, right values, every program stored.
  local layered="$KC_WORK/$variant-layered"
  KCACHE_DIR="$layered" XDG_CACHE_HOME="$KC_WORK/$variant-xdg" \
    "$KC_TARGET/debug/kcache" run -- "$bin/launch_while_publishing" 6
  local stored
  stored=$(find "$layered" -name '*.kce' | wc -l)
  [[ "$stored" -eq 7 ]] || kc_fail "$variant: $stored programs stored under the layer, not 7"
}
kc_suites "OpenCL C tests" c-tests/opencl opencl
