#!/usr/bin/env bash
# Packaging tests. Builds and installs kcache with CMake into a temporary prefix the documented
# way, checks the installed tree and library (SONAME, kc_* exports only, no GPU runtime or Rust
# standard library in NEEDED), then builds and runs every consumer project of this directory
# against it: CMake (shared, static, C++17) and Makefiles with pkg-config (shared, --static).
# Finally moves the prefix and builds the consumers again from the new place. Also checks that
# the documentation's snippets are these projects, byte for byte.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
JOBS="${KCACHE_JOBS:-2}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kcache-packaging.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

ABI_VERSION="$(sed -n 's/^abi-version *= *"\([0-9]*\.[0-9]*\.[0-9]*\)".*/\1/p' "$ROOT/Cargo.toml")"
ABI_MAJOR="${ABI_VERSION%%.*}"
SONAME="libkcache.so.$ABI_MAJOR"
REALNAME="libkcache.so.$ABI_VERSION"
[[ -n "$ABI_VERSION" ]] || { echo "no abi-version in Cargo.toml" >&2; exit 1; }

# Consumers compile with warnings as errors: the header must be clean for them. Only they get
# these flags (cargo would pass CFLAGS on to the C code of dependencies).
CONSUMER_FLAGS="-O2 -Wall -Wextra -Werror"

CHECKS=0
step() { printf '\n-- %s\n' "$*"; }
pass() {
  CHECKS=$((CHECKS + 1))
  echo "ok: $*"
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Every "<!-- snippet: PATH -->" line of README.md and docs/*.md is followed by a fenced block
# that must equal the file PATH (relative to the repository root); the consumer projects below are
# all shown.
check_readme_snippets() {
  cmake -DROOT="$ROOT" -P "$ROOT/c-tests/cmake/readme-snippet.cmake" || fail "documentation snippets differ from their files"
  local listed
  listed="$(cat "$ROOT/README.md" "$ROOT"/docs/*.md | grep -c '^<!-- snippet: c-tests/consumers/' || true)"
  [[ $listed -ge 5 ]] || fail "the documentation shows $listed consumer snippets, expected at least 5"
  pass "documentation snippets equal their files ($listed consumer projects among them)"
}

# Copies a consumer project (following the main.c link) to a scratch directory.
copy_project() {
  local name=$1 dest=$2
  rm -rf "$dest"
  mkdir -p "$dest"
  cp -L "$HERE/$name"/* "$dest/"
}

needed_of() {
  readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
}

# Builds a CMake consumer against PREFIX, runs it and checks how it linked kcache.
run_cmake_consumer() {
  local name=$1 prefix=$2 linkage=$3 tag=${4:-}
  local src="$WORK/src-$name$tag" bin="$WORK/bin-$name$tag"
  copy_project "$name" "$src"
  CFLAGS="$CONSUMER_FLAGS" CXXFLAGS="$CONSUMER_FLAGS" \
    cmake -S "$src" -B "$bin" -DCMAKE_PREFIX_PATH="$prefix" >"$WORK/log" 2>&1 ||
    { cat "$WORK/log" >&2; fail "$name: configure against $prefix"; }
  cmake --build "$bin" -j "$JOBS" >"$WORK/log" 2>&1 || { cat "$WORK/log" >&2; fail "$name: build"; }
  check_linkage "$name" "$bin/app" "$linkage"
  "$bin/app" || fail "$name: program failed"
  pass "$name$tag: built against $prefix, ran, $linkage"
}

# Builds a Makefile consumer with pkg-config from PREFIX, runs it and checks how it linked.
run_make_consumer() {
  local name=$1 prefix=$2 linkage=$3 tag=${4:-}
  local src="$WORK/src-$name$tag"
  copy_project "$name" "$src"
  CFLAGS="$CONSUMER_FLAGS" PKG_CONFIG_PATH="$prefix/lib/pkgconfig" make -C "$src" >"$WORK/log" 2>&1 ||
    { cat "$WORK/log" >&2; fail "$name: make"; }
  check_linkage "$name" "$src/app" "$linkage"
  "$src/app" || fail "$name: program failed"
  pass "$name$tag: built with pkg-config from $prefix, ran, $linkage"
}

check_linkage() {
  local name=$1 app=$2 linkage=$3 needed
  needed="$(needed_of "$app")"
  case "$linkage" in
    shared) grep -qx "$SONAME" <<<"$needed" || fail "$name: $app does not need $SONAME: $needed" ;;
    static) ! grep -q '^libkcache' <<<"$needed" || fail "$name: $app needs a shared libkcache: $needed" ;;
  esac
}

step "documentation snippets"
check_readme_snippets

step "build, test and install with CMake (the documented commands)"
cmake -S "$ROOT" -B "$WORK/build" >"$WORK/log" 2>&1 || { cat "$WORK/log" >&2; fail "configure kcache"; }
cmake --build "$WORK/build" -j "$JOBS"
if [[ -f "$ROOT/c-tests/CMakeLists.txt" ]]; then
  ctest --test-dir "$WORK/build" --output-on-failure -j "$JOBS" || fail "ctest in the CMake build"
  tests="$(ctest --test-dir "$WORK/build" -N | sed -n 's/^Total Tests: //p')"
  [[ "$tests" -gt 0 ]] || fail "ctest found no C tests in the CMake build"
  pass "ctest --test-dir build: $tests C tests passed"
fi
cmake --install "$WORK/build" --prefix "$WORK/prefix" >"$WORK/log" 2>&1 ||
  { cat "$WORK/log" >&2; fail "install kcache"; }
pass "cmake configure, build, install into a fresh prefix"

step "installed tree"
P="$WORK/prefix"
for f in "lib/$REALNAME" lib/libkcache.a include/kcache.h lib/pkgconfig/kcache.pc \
  lib/cmake/kcache/kcacheConfig.cmake lib/cmake/kcache/kcacheConfigVersion.cmake; do
  [[ -f "$P/$f" && ! -L "$P/$f" ]] || fail "missing installed file $f"
done
[[ "$(readlink "$P/lib/$SONAME")" == "$REALNAME" ]] || fail "lib/$SONAME should link to $REALNAME"
[[ "$(readlink "$P/lib/libkcache.so")" == "$SONAME" ]] || fail "lib/libkcache.so should link to $SONAME"
cmp -s "$ROOT/include/kcache.h" "$P/include/kcache.h" || fail "installed kcache.h differs from include/kcache.h"
file -L "$P/lib/libkcache.so" | grep -q 'ELF .* shared object' || fail "libkcache.so is not an ELF shared object"
grep -q "lib/$REALNAME" "$ROOT/docs/packaging.md" || fail "docs/packaging.md's install table does not show lib/$REALNAME"
pass "lib/$REALNAME, $SONAME -> $REALNAME, libkcache.so -> $SONAME, libkcache.a, kcache.h, kcache.pc, CMake package"
[[ -x "$P/bin/kcache" ]] || fail "missing installed program bin/kcache"
# Whole outputs first: `grep -q` stops reading early, which would break the pipe.
help_text="$("$P/bin/kcache" --help)" || fail "bin/kcache --help"
grep -q "kcache disk cache" <<<"$help_text" || fail "bin/kcache --help"
mkdir -m 700 "$WORK/cache"
stats_json="$("$P/bin/kcache" --dir "$WORK/cache" stats --json)" || fail "bin/kcache stats"
grep -q '"entries": 0' <<<"$stats_json" || fail "bin/kcache stats"
pass "bin/kcache runs: --help, stats on an empty directory"
# The OpenCL layer, found by the installed command from its own prefix: clinfo (which builds a
# program) prints the same under it, and its build lands in the cache.
[[ -f "$P/lib/libkcache_opencl_layer.so" ]] || fail "missing installed OpenCL layer lib/libkcache_opencl_layer.so"
mkdir -m 700 "$WORK/layer-cache"
plain_clinfo="$(clinfo)" || fail "clinfo"
layered_clinfo="$(KCACHE_DIR="$WORK/layer-cache" "$P/bin/kcache" run -- clinfo)" ||
  fail "bin/kcache run -- clinfo"
[[ "$plain_clinfo" == "$layered_clinfo" ]] || fail "clinfo prints something else under the installed layer"
layer_stats="$("$P/bin/kcache" --dir "$WORK/layer-cache" stats --json)" || fail "bin/kcache stats"
grep -q '"entries": 1' <<<"$layer_stats" || fail "clinfo's build is not in the cache after kcache run"
pass "bin/kcache run -- clinfo: the same output through the installed layer, its build cached"
# The manual page and completions, generated by the installed command's build at install time.
man_page="$P/share/man/man1/kcache.1"
[[ -s "$man_page" ]] || fail "missing installed manual page share/man/man1/kcache.1"
grep -q '^\.TH kcache 1' "$man_page" || fail "share/man/man1/kcache.1 is not kcache's manual page"
grep -q 'config' "$man_page" || fail "the manual page does not list the config subcommand"
bash_completion="$P/share/bash-completion/completions/kcache"
[[ -s "$bash_completion" ]] || fail "missing installed bash completion"
bash -c "source '$bash_completion' && complete -p kcache" >/dev/null 2>&1 ||
  fail "the bash completion does not register a completion for kcache"
grep -q 'max-size' "$bash_completion" || fail "the bash completion does not complete setting names"
head -n1 "$P/share/zsh/site-functions/_kcache" | grep -q '^#compdef kcache' ||
  fail "missing or wrong zsh completion share/zsh/site-functions/_kcache"
grep -q '^complete -c kcache' "$P/share/fish/vendor_completions.d/kcache.fish" ||
  fail "missing or wrong fish completion share/fish/vendor_completions.d/kcache.fish"
grep -q 'share/man/man1/kcache.1' "$WORK/build/install_manifest.txt" ||
  fail "the manual page is not in install_manifest.txt"
pass "man1/kcache.1 and the bash, zsh and fish completions installed"

cmake -DLIBRARY="$P/lib/$REALNAME" -DSONAME="$SONAME" -P "$ROOT/cmake/check-library.cmake" ||
  fail "installed library check"
# The installed library is small; its debug information is a file of its own that it names.
lib_size="$(stat -c %s "$P/lib/$REALNAME")"
[[ $lib_size -le 8000000 ]] || fail "lib/$REALNAME is $lib_size bytes, more than 8 MB"
debug_file="$P/lib/$REALNAME.debug"
[[ -f "$debug_file" ]] || fail "missing installed debug information lib/$REALNAME.debug"
! file "$P/lib/$REALNAME" | grep -q 'with debug_info' || fail "lib/$REALNAME has its debug information"
file "$debug_file" | grep -q 'with debug_info' || fail "lib/$REALNAME.debug has no debug information"
build_id() { readelf -n "$1" | sed -n 's/.*Build ID: //p'; }
[[ -n "$(build_id "$P/lib/$REALNAME")" && "$(build_id "$P/lib/$REALNAME")" == "$(build_id "$debug_file")" ]] ||
  fail "lib/$REALNAME.debug is not from the same build as lib/$REALNAME"
objcopy --dump-section .gnu_debuglink="$WORK/debuglink" "$P/lib/$REALNAME" "$WORK/debuglink.so" ||
  fail "lib/$REALNAME has no .gnu_debuglink"
# The section is the file's name, NUL-padded to 4 bytes, then the file's CRC-32 (little-endian).
python3 - "$WORK/debuglink" "$debug_file" <<'PY' || fail "lib/$REALNAME's debuglink does not name its debug file"
import os, struct, sys, zlib
link = open(sys.argv[1], "rb").read()
name = link[: link.index(b"\0")].decode()
(crc,) = struct.unpack("<I", link[-4:])
data = open(sys.argv[2], "rb").read()
assert name == os.path.basename(sys.argv[2]), name
assert crc == zlib.crc32(data), (crc, zlib.crc32(data))
PY
pass "lib/$REALNAME: $lib_size bytes; its debug information apart, lib/$REALNAME.debug ($(stat -c %s "$debug_file") bytes, same build ID, debuglink name and CRC)"
# The same facts with the usual tools, so a failure here is easy to reproduce by hand.
readelf -d "$P/lib/$REALNAME" | grep -q "(SONAME).*\[$SONAME\]" || fail "SONAME is not $SONAME"
foreign="$(nm -D --defined-only "$P/lib/$REALNAME" | awk '{print $NF}' | grep -v '^kc_' || true)"
[[ -z "$foreign" ]] || fail "exports outside kc_*: $foreign"
if needed_of "$P/lib/$REALNAME" | grep -Ei 'opencl|vulkan|cuda|nvrtc|libstd|rust'; then
  fail "a GPU runtime or the Rust standard library is in NEEDED"
fi
pass "SONAME $SONAME; exports only kc_* ($(nm -D --defined-only "$P/lib/$REALNAME" | wc -l) symbols); NEEDED: $(needed_of "$P/lib/$REALNAME" | tr '\n' ' ')"

cmake --install "$WORK/build" --prefix "$WORK/stripped" --strip >"$WORK/log" 2>&1 ||
  { cat "$WORK/log" >&2; fail "install --strip"; }
cmake -DLIBRARY="$WORK/stripped/lib/$REALNAME" -DSONAME="$SONAME" -P "$ROOT/cmake/check-library.cmake" ||
  fail "stripped library check"
! file "$WORK/stripped/lib/$REALNAME" | grep -q 'with debug_info' || fail "--strip left debug info"
pass "cmake --install --strip: $(stat -c %s "$WORK/stripped/lib/$REALNAME") bytes instead of $(stat -c %s "$P/lib/$REALNAME"), exports intact"

step "pkg-config metadata"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
[[ "$(pkg-config --modversion kcache)" == "$ABI_VERSION" ]] || fail "kcache.pc Version is not $ABI_VERSION"
pkg-config --static --libs kcache | grep -q -- '-lpthread' || fail "kcache.pc lacks the static link flags"
unset PKG_CONFIG_PATH
pass "kcache.pc: Version $ABI_VERSION, Libs.private: $(sed -n 's/^Libs.private: //p' "$P/lib/pkgconfig/kcache.pc")"

step "CMake package version"
mkdir -p "$WORK/src-version"
cat >"$WORK/src-version/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(version_check LANGUAGES NONE)
find_package(kcache $((ABI_MAJOR + 1)) CONFIG QUIET)
if(kcache_FOUND)
  message(FATAL_ERROR "a request for ABI $((ABI_MAJOR + 1)) accepted kcache \${kcache_VERSION}")
endif()
find_package(kcache $ABI_VERSION CONFIG REQUIRED)
foreach(target kcache::shared kcache::static kcache::kcache)
  if(NOT TARGET \${target})
    message(FATAL_ERROR "missing imported target \${target}")
  endif()
endforeach()
EOF
cmake -S "$WORK/src-version" -B "$WORK/bin-version" -DCMAKE_PREFIX_PATH="$P" >"$WORK/log" 2>&1 ||
  { cat "$WORK/log" >&2; fail "CMake package version check"; }
pass "find_package(kcache $ABI_VERSION) finds kcache::shared/static/kcache; kcache $((ABI_MAJOR + 1)) is refused"

step "consumers"
run_cmake_consumer cmake-shared "$P" shared
run_cmake_consumer cmake-static "$P" static
run_cmake_consumer cmake-cxx "$P" shared
run_make_consumer make-shared "$P" shared
run_make_consumer make-static "$P" static
run_make_consumer make-static "$WORK/stripped" static "-stripped"
rm -rf "$WORK/stripped"

step "relocated prefix"
mv "$P" "$WORK/moved"
M="$WORK/moved"
if grep -rIl -- "$P" "$M"; then
  fail "installed text files still name the original prefix"
fi
run_cmake_consumer cmake-shared "$M" shared "-moved"
run_cmake_consumer cmake-static "$M" static "-moved"
run_make_consumer make-shared "$M" shared "-moved"

printf '\npackaging: %d checks passed\n' "$CHECKS"
