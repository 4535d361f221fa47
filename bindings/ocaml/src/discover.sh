#!/bin/sh
# Finds kcache's C library for the binding and prints, for dune, one S-expression list of flags:
#   discover.sh cflags   the C compiler's flags (where kcache.h is)
#   discover.sh libs     the linker's flags (where libkcache.so is, and -lkcache)
#   discover.sh rpath    ocamlfind flags that put that directory in an executable's run path
#                        (for the tests and examples here only: users' programs get none)
# Inside the kcache repository with the library built (`cargo build --lib`), that library and
# include/; else the installed kcache that pkg-config knows (kcache.pc; PKG_CONFIG_PATH for a
# prefix pkg-config does not search).
set -eu
what=$1

# The repository: two levels above this dune project, when the library was built there.
repo=${DUNE_SOURCEROOT:-}/../..
libdir=
if [ -n "${DUNE_SOURCEROOT:-}" ] && [ -f "$repo/include/kcache.h" ] &&
  grep -q '^name = "kcache"$' "$repo/Cargo.toml" 2>/dev/null; then
  repo=$(cd "$repo" && pwd)
  target=${CARGO_TARGET_DIR:-$repo/target}
  case $target in /*) ;; *) target=$repo/$target ;; esac
  # The debug library, else the release one; KCACHE_CARGO_PROFILE=release picks the latter.
  for profile in ${KCACHE_CARGO_PROFILE:-debug} release; do
    if [ -z "$libdir" ] && [ -f "$target/$profile/libkcache.so" ]; then
      libdir=$target/$profile
    fi
  done
fi
if [ -n "$libdir" ]; then
  cflags="-I$repo/include"
  libs="-L$libdir -lkcache"
elif pkg-config --exists kcache 2>/dev/null; then
  cflags=$(pkg-config --cflags kcache)
  libs=$(pkg-config --libs kcache)
  libdir=$(pkg-config --variable=libdir kcache)
else
  echo "kcache's C library was not found. Install it (cmake --install, docs/packaging.md) where" \
    "pkg-config finds kcache.pc (set PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for another prefix)," \
    "or build it in the repository around this binding: cargo build --lib" >&2
  exit 1
fi

# One S-expression atom per word, quoted.
sexp() {
  printf '('
  for word in "$@"; do
    printf ' "%s"' "$(printf '%s' "$word" | sed 's/[\\"]/\\&/g')"
  done
  printf ' )\n'
}

# Word splitting of pkg-config's output is what pkg-config's users do.
# shellcheck disable=SC2086
case $what in
  cflags) sexp $cflags ;;
  libs) sexp $libs ;;
  rpath) sexp -ccopt "-Wl,-rpath,$libdir" ;;
  *)
    echo "usage: discover.sh cflags|libs|rpath" >&2
    exit 2
    ;;
esac
