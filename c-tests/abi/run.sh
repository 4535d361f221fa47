#!/usr/bin/env bash
# The ABI kept within a major, two ways, against the debug libkcache.so (built first) or LIB_DIR:
# 1. a program built against each released header of the current major (c-tests/abi/releases,
#    the headers taken from the repository's history) runs on the new library, once plain and
#    once with AddressSanitizer + UndefinedBehaviorSanitizer on the C side (old_header.c says
#    what it checks);
# 2. libabigail's abidiff compares the library with the last release's ABI (the newest
#    c-tests/abi/kcache-*.abi, written by scripts/abi-baseline): added functions and fields appended to the structs that may grow
#    pass; anything else fails (docs/packaging.md, "Versions", says how to refresh the baseline).
# Usage: c-tests/abi/run.sh [LIB_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
# The program loads OpenCL (PoCL), the CUDA test driver and Vulkan (lavapipe).
KC_LSAN_SUPPRESSIONS="$KC_WORK/lsan.supp"
cat "$KC_ROOT"/c-tests/{opencl,cuda,vulkan}/lsan.supp >"$KC_LSAN_SUPPRESSIONS"
KC_LSAN_FULL_STACKS=1

abi="$KC_ROOT/c-tests/abi"
headers="$KC_TARGET/c-tests/abi/headers"
releases=()
while read -r version commit; do
  [[ -z "$version" || "$version" == \#* ]] && continue
  if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    kc_fail "release $version's commit $commit is not in this clone's history (a shallow" \
      "clone?): fetch it (git fetch --unshallow) to test the ABI against the released headers"
  fi
  mkdir -p "$headers/$version"
  git show "$commit:include/kcache.h" >"$headers/$version/kcache.h"
  releases+=("$version")
done <"$abi/releases"
[[ ${#releases[@]} -gt 0 ]] || kc_fail "no release listed in $abi/releases"

kc_library debug "${1:-}"
FAKE_CUDA=$(cargo run --quiet -p kcache-testkit --bin stand-ins -- cuda)
kc_run() {
  local bin=$1 variant=$2 release
  for release in "${releases[@]}"; do
    "$bin/old_header_$release" "$FAKE_CUDA" "$KC_WORK/$variant-$release" "$bin/scale.spv"
  done
}
kc_suites "Programs built against the released ${releases[*]} headers" "$abi" abi \
  -DKCACHE_RELEASE_HEADERS="$headers" -DKCACHE_RELEASES="$(
    IFS=';'
    echo "${releases[*]}"
  )"

baseline=$(ls "$abi"/kcache-*.abi | sort -V | tail -n 1)
echo "== abidiff $(basename "$baseline") $KC_LIB_DIR/libkcache.so"
set +e
abidiff --no-added-syms --suppressions "$abi/abi.supp" "$baseline" "$KC_LIB_DIR/libkcache.so"
rc=$?
set -e
# abidiff's exit status is a bit field: 1 an error, 2 a usage error, 4 an ABI change, 8 an
# incompatible one. With additions and appended fields suppressed, any bit fails.
[[ $rc -eq 0 ]] || kc_fail "abidiff against $(basename "$baseline"): exit $rc (see above)"
echo "abidiff against $(basename "$baseline"): no change but additions"
