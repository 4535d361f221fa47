#!/bin/sh
# Builds the Vulkan C example and test against target/debug/libkcache.so and runs them on the
# system's Vulkan driver (lavapipe in CI). Usage: c-tests/vulkan/run.sh [LIB_DIR]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
lib_dir=${1:-$root/target/debug}
build=$root/target/c-tests/vulkan
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Cargo names the library libkcache.so; programs linked against it ask for its SONAME.
stage=$build/lib
mkdir -p "$stage"
ln -sf "$lib_dir/libkcache.so" "$stage/libkcache.so"
soname=$(objdump -p "$lib_dir/libkcache.so" | awk '$1 == "SONAME" { print $2 }')
[ -z "$soname" ] || ln -sf "$lib_dir/libkcache.so" "$stage/$soname"

cmake -S "$root/c-tests/vulkan" -B "$build" -DKCACHE_LIB_DIR="$stage" \
    ${KCACHE_INCLUDE_DIR:+-DKCACHE_INCLUDE_DIR="$KCACHE_INCLUDE_DIR"} >/dev/null
cmake --build "$build" >/dev/null

"$build/vulkan_test" "$work/test-cache" "$build/scale.spv"

# The README's example is example.c, byte for byte.
awk '
  /^<!-- snippet: c-tests\/vulkan\/example.c -->$/ { state = 1; next }
  state == 1 && /^```c$/ { state = 2; next }
  state == 2 && /^```$/ { exit }
  state == 2 { print }
' "$root/README.md" > "$work/readme-example.c"
if ! cmp -s "$work/readme-example.c" "$root/c-tests/vulkan/example.c"; then
  echo "README.md: the Vulkan example differs from c-tests/vulkan/example.c" >&2
  exit 1
fi

# The documented example: the first process finds no pipeline-cache data on disk, the second
# (a fresh process) finds the first one's, validates its header and hands it to the driver.
"$build/vulkan_example" "$work/example-cache" "$build/scale.spv" | tee "$work/first.txt"
grep -q "loaded 0, missing 1, rejected 0" "$work/first.txt"
"$build/vulkan_example" "$work/example-cache" "$build/scale.spv" | tee "$work/second.txt"
grep -q "loaded 1, missing 0, rejected 0" "$work/second.txt"
grep -q "pipelines created: 1, memory hits: 1" "$work/second.txt"
