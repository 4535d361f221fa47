#!/usr/bin/env bash
# The OCaml binding's tests, built the ways a user builds it, with no variable set by hand:
# 1. From the repository: `dune build @runtest` against the library `cargo build --lib` made
#    (src/discover.sh finds it), in a scratch dune build directory so the tree stays clean.
# 2. After kcache is installed with CMake (release library, into a scratch prefix): a copy of the
#    binding outside the repository finds it through pkg-config (kcache.pc) and passes its tests;
#    installed with `dune install`, it builds a user's program that carries no run path and
#    runs.
# 3. Under OCaml 5 (Debian 13's, in a root of its own that ocaml5.sh makes once): the same
#    tests, the stress test on domains. The opam files pass `opam lint`.
# Environment: CARGO_TARGET_DIR (where cargo builds), KCACHE_JOBS (default 2).
# Usage: bindings/ocaml/run.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../c-tests/common.sh"

OCAML_DIR="$KC_ROOT/bindings/ocaml"
JOBS="${KCACHE_JOBS:-2}"
# Only what the binding finds by itself: no pkg-config path, no variables of the old build.
unset KCACHE_LIB_DIR KCACHE_INCLUDE_DIR KCACHE_CARGO_PROFILE PKG_CONFIG_PATH
ok() { echo "ok: $*"; }

echo "-- from the repository"
kc_library debug
dune build @runtest --root "$OCAML_DIR" --build-dir "$KC_WORK/dune" --display short 2>&1
grep -qF "\"-L$KC_LIB_DIR\"" "$KC_WORK/dune/default/src/c_library_flags.sexp" ||
  kc_fail "the binding did not link the repository's library $KC_LIB_DIR"
ok "dune build @runtest from the repository, against $KC_LIB_DIR"

echo "-- after kcache is installed"
prefix="$KC_WORK/prefix"
cmake -S "$KC_ROOT" -B "$KC_WORK/cmake" -DKCACHE_BUILD_COMMAND=OFF -DKCACHE_BUILD_TESTS=OFF \
  >"$KC_WORK/log" 2>&1 || { cat "$KC_WORK/log" >&2; kc_fail "configure kcache"; }
cmake --build "$KC_WORK/cmake" -j "$JOBS" >"$KC_WORK/log" 2>&1 ||
  { cat "$KC_WORK/log" >&2; kc_fail "build kcache"; }
cmake --install "$KC_WORK/cmake" --prefix "$prefix" >"$KC_WORK/log" 2>&1 ||
  { cat "$KC_WORK/log" >&2; kc_fail "install kcache"; }
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# A copy outside the repository, as a user (or opam) has it: pkg-config is its only way.
copy="$KC_WORK/kcache-ocaml"
mkdir "$copy"
(cd "$OCAML_DIR" && git ls-files -z --cached --others --exclude-standard . | xargs -0 cp --parents -t "$copy")
dune build @runtest --root "$copy" --display short 2>&1
grep -qF "\"-L$(pkg-config --variable=libdir kcache)\"" "$copy/_build/default/src/c_library_flags.sexp" ||
  kc_fail "the binding did not link the installed library through pkg-config"
ok "dune build @runtest outside the repository, kcache found through pkg-config"
dune build @install --root "$copy" 2>&1
dune install --root "$copy" --prefix "$KC_WORK/ocaml" kcache >"$KC_WORK/log" 2>&1 ||
  { cat "$KC_WORK/log" >&2; kc_fail "dune install"; }

# A user's program: the quick start in a project of its own, on the installed binding.
app="$KC_WORK/app"
mkdir "$app"
cp "$OCAML_DIR/example/quickstart.ml" "$app/"
echo '(lang dune 2.9)' >"$app/dune-project"
printf '(executable\n (name quickstart)\n (libraries kcache threads.posix))\n' >"$app/dune"
OCAMLPATH="$KC_WORK/ocaml/lib" dune build --root "$app" ./quickstart.exe 2>&1
exe="$app/_build/default/quickstart.exe"
if readelf -d "$exe" | grep -E '\((RUNPATH|RPATH)\)'; then
  kc_fail "the user's program carries a run path"
fi
readelf -d "$exe" | grep -q '(NEEDED).*\[libkcache.so' || kc_fail "the user's program does not need libkcache"
out="$(LD_LIBRARY_PATH="$prefix/lib" "$exe")"
[[ "$out" == "builds=1 misses=1 waits+hits=3" ]] || kc_fail "the user's program printed: $out"
ok "a user's program on the installed binding: no RUNPATH or RPATH, runs ($out)"

echo "-- OCaml 5"
# The same tests (the stress test on domains) in a Debian 13 root with OCaml 5.3.
bash "$OCAML_DIR/ocaml5.sh" "$KC_LIB_DIR"
grep -q '"ocaml" {>= "4.13"}' "$OCAML_DIR/kcache.opam" || kc_fail "kcache.opam does not allow OCaml 5"

echo "-- opam"
# Errors fail; warnings (no homepage yet) are shown.
opam lint "$OCAML_DIR/kcache.opam" "$OCAML_DIR/conf-kcache.opam" 2>&1 || kc_fail "opam lint"
ok "opam lint kcache.opam conf-kcache.opam"
