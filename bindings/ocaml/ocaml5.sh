#!/usr/bin/env bash
# The OCaml binding's tests under OCaml 5 (domains): Debian 13's OCaml 5.3 and dune, in a
# Debian 13 root of their own, against the library built here (it needs glibc 2.34 at most,
# and Debian 13 has 2.41). The root is made once with mmdebstrap (about 600 MB and 30 s with a
# network to Debian's mirrors; root needed, to chroot) and reused while it is there.
# Environment: KCACHE_OCAML5_ROOT (default /var/cache/kcache/trixie-ocaml5), CARGO_TARGET_DIR.
# Usage: bindings/ocaml/ocaml5.sh LIB_DIR   (LIB_DIR holds libkcache.so)
source "$(dirname "${BASH_SOURCE[0]}")/../../c-tests/common.sh"

lib_dir=${1:?usage: ocaml5.sh LIB_DIR}
root=${KCACHE_OCAML5_ROOT:-/var/cache/kcache/trixie-ocaml5}
packages=ocaml,ocaml-dune,ocaml-findlib,gcc,libc6-dev,pkg-config

[[ $(id -u) -eq 0 ]] || kc_fail "OCaml 5's tests run in a chroot: run as root"
# A root is used once it is complete: mmdebstrap writes a new one beside it, then it is moved.
if [[ ! -x "$root/usr/bin/dune" ]]; then
  echo "making a Debian 13 root with OCaml 5 at $root (once)"
  rm -rf "$root.new"
  mkdir -p "$(dirname "$root")"
  mmdebstrap --quiet --variant=apt --include="$packages" trixie "$root.new" ||
    kc_fail "mmdebstrap could not make the Debian 13 root"
  rm -rf "$root"
  mv "$root.new" "$root"
fi

# What the binding's discover.sh looks for, as in the repository: the binding, include/,
# Cargo.toml and the library. A copy, so nothing of the chroot's builds lands in the tree.
work=/tmp/kcache-ocaml5.$$
trap 'rm -rf "$root$work" "$KC_WORK"' EXIT
mkdir -p "$root$work/target/debug"
(cd "$KC_ROOT" && git ls-files -z --cached --others --exclude-standard bindings/ocaml include Cargo.toml |
  xargs -0 cp --parents -t "$root$work")
cp "$lib_dir/libkcache.so" "$root$work/target/debug/"
chroot "$root" ocamlfind ocamlopt -version | grep -q '^5\.' || kc_fail "the root's OCaml is not OCaml 5"
chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root TMPDIR=/tmp CARGO_TARGET_DIR="$work/target" \
  dune build @runtest --root "$work/bindings/ocaml" --display short 2>&1 ||
  kc_fail "the OCaml binding's tests under OCaml $(chroot "$root" ocamlfind ocamlopt -version)"
echo "ok: the OCaml binding's tests under OCaml $(chroot "$root" ocamlfind ocamlopt -version), in $root"
