#!/bin/sh
# Builds the CUDA C test and the test driver library (which stands in for libcuda.so.1, as no
# GPU is available in CI) against target/debug/libkcache.so, and runs the test.
# Usage: c-tests/cuda/run.sh [LIB_DIR]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
lib_dir=${1:-$root/target/debug}
build=$root/target/c-tests/cuda
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Cargo names the library libkcache.so; programs linked against it ask for its SONAME.
stage=$build/lib
mkdir -p "$stage"
ln -sf "$lib_dir/libkcache.so" "$stage/libkcache.so"
soname=$(objdump -p "$lib_dir/libkcache.so" | awk '$1 == "SONAME" { print $2 }')
[ -z "$soname" ] || ln -sf "$lib_dir/libkcache.so" "$stage/$soname"

cmake -S "$root/c-tests/cuda" -B "$build" -DKCACHE_LIB_DIR="$stage" \
    ${KCACHE_INCLUDE_DIR:+-DKCACHE_INCLUDE_DIR="$KCACHE_INCLUDE_DIR"} >/dev/null
cmake --build "$build" >/dev/null

"$build/cuda_test" "$build/libfake_cuda.so" "$work/disk"
"$build/cuda_test" unavailable
echo "cuda_test unavailable: ok"
