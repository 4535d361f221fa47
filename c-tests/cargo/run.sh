#!/usr/bin/env bash
# The library as a cargo user gets it: `cargo build --release`, then a C program compiled with
# -I include -L target/release -lkcache, run once with an rpath and once with LD_LIBRARY_PATH.
# Both must start: the program may ask the dynamic loader only for files cargo wrote.
# Usage: c-tests/cargo/run.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# A cargo user's environment: nothing asks build.rs for the installed library's SONAME.
unset KCACHE_SONAME
cargo build --quiet --release
lib="$KC_TARGET/release"
[[ -f "$lib/libkcache.so" ]] || kc_fail "no libkcache.so in $lib after cargo build --release"

CC="${CC:-cc}"
flags=(-std=c99 -Wall -Wextra -Wpedantic -Werror -I "$KC_ROOT/include")
"$CC" "${flags[@]}" -o "$KC_WORK/with-rpath" c-tests/example.c -L "$lib" -lkcache \
  -Wl,-rpath,"$lib"
"$CC" "${flags[@]}" -o "$KC_WORK/plain" c-tests/example.c -L "$lib" -lkcache

"$KC_WORK/with-rpath" >"$KC_WORK/with-rpath.txt" ||
  kc_fail "the program linked with -Wl,-rpath,$lib did not run: $(cat "$KC_WORK/with-rpath.txt")"
LD_LIBRARY_PATH="$lib" "$KC_WORK/plain" >"$KC_WORK/plain.txt" ||
  kc_fail "the program run with LD_LIBRARY_PATH=$lib did not run: $(cat "$KC_WORK/plain.txt")"
for out in with-rpath plain; do
  grep -q "builds=1 hits=2" "$KC_WORK/$out.txt" ||
    kc_fail "$out: unexpected output: $(cat "$KC_WORK/$out.txt")"
done
echo "C program on the cargo-built library: runs with an rpath and with LD_LIBRARY_PATH"
