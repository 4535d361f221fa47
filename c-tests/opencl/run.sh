#!/bin/sh
# Builds the OpenCL C example and test against target/debug/libkcache.so (or LIB_DIR) and runs
# them on the system's OpenCL implementation (PoCL in CI), once plain and once with
# AddressSanitizer + UndefinedBehaviorSanitizer on the C side.
# Usage: c-tests/opencl/run.sh [LIB_DIR]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -eq 0 ]; then
  (cd "$root" && cargo build --quiet --lib)
fi
lib_dir=${1:-${CARGO_TARGET_DIR:-$root/target}/debug}
build=$root/target/c-tests/opencl
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Cargo names the library libkcache.so; programs linked against it ask for its SONAME.
stage=$build/lib
mkdir -p "$stage"
ln -sf "$lib_dir/libkcache.so" "$stage/libkcache.so"
soname=$(objdump -p "$lib_dir/libkcache.so" | awk '$1 == "SONAME" { print $2 }')
[ -z "$soname" ] || ln -sf "$lib_dir/libkcache.so" "$stage/$soname"

# PoCL's own kernel cache would make the cold path look warm; keep it out of the picture.
export POCL_KERNEL_CACHE=0
export LSAN_OPTIONS="suppressions=$root/c-tests/opencl/lsan.supp:print_suppressions=0"

for config in plain sanitize; do
  echo "== OpenCL C tests: $config"
  sanitize=OFF
  [ "$config" = plain ] || sanitize=ON
  cmake -S "$root/c-tests/opencl" -B "$build/$config" -DKCACHE_LIB_DIR="$stage" \
    -DKCACHE_SANITIZE=$sanitize >/dev/null
  cmake --build "$build/$config" >/dev/null
  bin=$build/$config

  # The test compiles a broken kernel on purpose: PoCL prints "1 error generated." for it.
  "$bin/opencl_test" "$work/$config-test-cache"
  KCACHE_OPENCL_LIBRARY=/nonexistent/libOpenCL.so.1 "$bin/opencl_test" unavailable
  echo "opencl_test unavailable: ok"

  # The documented example: the first run compiles, the second loads the binary from disk.
  "$bin/opencl_example" "$work/$config-example-cache"
  "$bin/opencl_example" "$work/$config-example-cache" | tee "$work/second.txt"
  grep -q "compiled from source: 0, loaded from disk: 1" "$work/second.txt"
done
