#!/usr/bin/env bash
# Builds the Vulkan C example and tests against the debug libkcache.so (built first) or LIB_DIR
# and runs them on the system's Vulkan driver (lavapipe in CI), once plain and once with
# AddressSanitizer + UndefinedBehaviorSanitizer on the C side.
# Usage: c-tests/vulkan/run.sh [LIB_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
KC_LSAN_SUPPRESSIONS="$KC_ROOT/c-tests/vulkan/lsan.supp"

kc_check_readme_snippet c-tests/vulkan/example.c
kc_library debug "${1:-}"
# In the sanitizer run, lavapipe is preloaded (after the ASan runtime, which must come first) so
# that it stays mapped after vkDestroyInstance unloads it: the frames of a leak it reports then
# keep their module name, which is what lsan.supp matches.
kc_keep_driver_loaded() {
  local icd lib asan
  for icd in /usr/share/vulkan/icd.d/lvp_icd.*.json; do
    lib=$(sed -n 's/.*"library_path": *"\([^"]*\)".*/\1/p' "$icd")
    asan=$("${CC:-cc}" -print-file-name=libasan.so)
    if [[ -f "$lib" && "$asan" == /* ]]; then
      export LD_PRELOAD="$asan $lib"
    fi
    return
  done
}
kc_run() {
  local bin=$1 variant=$2 out="$KC_WORK/$variant"
  [[ "$variant" == sanitize ]] && kc_keep_driver_loaded
  "$bin/vulkan_test" "$out-test-cache" "$bin/scale.spv"
  "$bin/vulkan_teardown" "$bin/scale.spv"

  # The documented example: the first process finds no pipeline-cache data on disk, the second
  # (a fresh process) finds the first one's, validates its header and hands it to the driver.
  "$bin/vulkan_example" "$out-example-cache" "$bin/scale.spv" | tee "$out-first.txt"
  grep -q "loaded 0, missing 1, rejected 0" "$out-first.txt"
  "$bin/vulkan_example" "$out-example-cache" "$bin/scale.spv" | tee "$out-second.txt"
  grep -q "loaded 1, missing 0, rejected 0" "$out-second.txt"
  grep -q "pipelines created: 1, memory hits: 1" "$out-second.txt"
}
kc_suites "Vulkan C tests" c-tests/vulkan vulkan
