#!/bin/sh
# Builds the OpenCL C example and test against target/debug/libkcache.so and runs them on the
# system's OpenCL implementation (PoCL in CI). Usage: c-tests/opencl/run.sh [LIB_DIR]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
lib_dir=${1:-$root/target/debug}
build=$root/target/c-tests/opencl
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Cargo names the library libkcache.so; programs linked against it ask for its SONAME.
stage=$build/lib
mkdir -p "$stage"
ln -sf "$lib_dir/libkcache.so" "$stage/libkcache.so"
soname=$(objdump -p "$lib_dir/libkcache.so" | awk '$1 == "SONAME" { print $2 }')
[ -z "$soname" ] || ln -sf "$lib_dir/libkcache.so" "$stage/$soname"

cmake -S "$root/c-tests/opencl" -B "$build" -DKCACHE_LIB_DIR="$stage" \
    ${KCACHE_INCLUDE_DIR:+-DKCACHE_INCLUDE_DIR="$KCACHE_INCLUDE_DIR"} >/dev/null
cmake --build "$build" >/dev/null

# PoCL's own kernel cache would make the cold path look warm; keep it out of the picture.
export POCL_KERNEL_CACHE=0
"$build/opencl_test" "$work/test-cache"
KCACHE_OPENCL_LIBRARY=/nonexistent/libOpenCL.so.1 "$build/opencl_test" unavailable
echo "opencl_test unavailable: ok"

# The documented example: the first run compiles, the second loads the binary from disk.
"$build/opencl_example" "$work/example-cache"
"$build/opencl_example" "$work/example-cache" | tee "$work/second.txt"
grep -q "compiled from source: 0, loaded from disk: 1" "$work/second.txt"
