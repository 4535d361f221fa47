#!/bin/sh
# Builds the disk tier C test against target/debug/libkcache.so and runs it, plain and under
# ASan+UBSan, each in a fresh private work directory. Usage: c-tests/disk/run.sh [LIB_DIR]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -eq 0 ]; then
  (cd "$root" && cargo build --lib --quiet)
fi
lib_dir=${1:-$root/target/debug}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Cargo names the library libkcache.so; programs linked against it ask for its SONAME.
stage=$root/target/c-tests/disk-lib
mkdir -p "$stage"
ln -sf "$lib_dir/libkcache.so" "$stage/libkcache.so"
soname=$(objdump -p "$lib_dir/libkcache.so" | awk '$1 == "SONAME" { print $2 }')
[ -z "$soname" ] || ln -sf "$lib_dir/libkcache.so" "$stage/$soname"

for variant in plain sanitize; do
  build=$root/target/c-tests/disk-$variant
  sanitize=OFF
  [ "$variant" = plain ] || sanitize=ON
  cmake -S "$root/c-tests/disk" -B "$build" -DKCACHE_LIB_DIR="$stage" \
      -DKCACHE_SANITIZE="$sanitize" \
      ${KCACHE_INCLUDE_DIR:+-DKCACHE_INCLUDE_DIR="$KCACHE_INCLUDE_DIR"} >/dev/null
  cmake --build "$build" >/dev/null
  mkdir -m 700 "$work/$variant"
  # The test opens its caches with ignore_env; clear the variables anyway so nothing outside
  # the work directory can be touched.
  env -u KCACHE_DIR -u KCACHE_KEY_FILE -u KCACHE_MAX_SIZE -u KCACHE_DISABLE \
      ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$build/kc_test_disk" "$work/$variant"
  echo "kc_test_disk ($variant): ok"
done
