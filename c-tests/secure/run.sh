#!/usr/bin/env bash
# Secure-execution tests: a setuid-root and a setgid program using kcache, linked statically
# with libkcache.a (the dynamic loader ignores LD_LIBRARY_PATH for such programs), run as the
# unprivileged user nobody with an environment that names nobody's own library for OpenCL,
# CUDA and NVRTC, a cache directory, a key file and a size. kcache must load no such library,
# create nothing the environment names, refuse the default disk tier and use only the
# directory the program passes (KCACHE_DISABLE and KCACHE_REQUIRE_KEY, which only take away,
# are read). Then the same program, unprivileged, run as root that switches to nobody and as
# nobody that makes itself non-dumpable: those read their environment and key file. Needs root,
# the nobody user and setpriv; where setuid programs cannot run here, says so and exits 0.
# Usage: c-tests/secure/run.sh [LIB_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

skip() {
  echo "secure-execution tests skipped: $*"
  exit 0
}
[[ $(id -u) -eq 0 ]] || skip "installing setuid binaries needs root"
id nobody >/dev/null 2>&1 || skip "no user nobody"
SETPRIV=$(command -v setpriv) || skip "no setpriv"
NOGROUP=$(id -gn nobody)

kc_library debug "${1:-}"
[[ -f "$KC_LIB_DIR/libkcache.a" ]] || kc_fail "no libkcache.a in $KC_LIB_DIR"

# A directory where setuid bits take effect: not on a nosuid mount.
suid_capable() {
  ! findmnt -n -o OPTIONS --target "$1" | tr ',' '\n' | grep -qx nosuid
}
BASE=""
for candidate in "$KC_WORK" "$KC_TARGET" /var/tmp; do
  if [[ -d "$candidate" ]] && suid_capable "$candidate"; then
    BASE=$(mktemp -d "$candidate/kc-secure.XXXXXX")
    break
  fi
done
[[ -n "$BASE" ]] || skip "no directory outside a nosuid mount"
trap 'rm -rf "$KC_WORK" "$BASE"' EXIT
# nobody must reach the programs: let it through the private work directory (not list it).
chmod 755 "$BASE"
if [[ "$(dirname "$BASE")" == "$KC_WORK" ]]; then
  chmod 711 "$KC_WORK"
fi

BIN="$BASE/bin"              # root's programs
USER_DIR="$BASE/user"        # nobody's files: the library it names, the marker, its cache
ROOT_ONLY="$BASE/root-only"  # what the environment names for the cache: only root may create there
mkdir -m 755 "$BIN" "$USER_DIR"
mkdir -m 700 "$ROOT_ONLY"
chown nobody "$USER_DIR"
MARKER="$USER_DIR/loaded"
LIB="$USER_DIR/libnobody.so"

CFLAGS=(-Wall -Wextra -Wpedantic -Werror)
native=$(
  cd "$BASE" && : >probe.rs &&
    rustc --crate-type staticlib --print native-static-libs -o probe.a probe.rs 2>&1 |
    sed -n 's/.*native-static-libs: //p'
)
[[ -n "$native" ]] || kc_fail "rustc did not print the native libraries of a static library"
# shellcheck disable=SC2086 # one word per library
cc -std=c99 -D_POSIX_C_SOURCE=200809L "${CFLAGS[@]}" -I"${KCACHE_INCLUDE_DIR:-$KC_ROOT/include}" \
  -o "$BIN/kc_secure_test" c-tests/secure/secure_test.c "$KC_LIB_DIR/libkcache.a" $native
cc -std=c99 "${CFLAGS[@]}" -shared -fPIC -DMARKER="\"$MARKER\"" -o "$LIB" c-tests/secure/marker.c
chown nobody "$LIB"
# The test-kit's build of the CUDA stand-in (the one every CUDA test loads), copied where nobody
# can read it.
install -m 755 "$(cargo run --quiet -p kcache-testkit --bin stand-ins -- cuda)" "$BIN/libfake_cuda.so"
install -o root -g root -m 4755 "$BIN/kc_secure_test" "$BIN/kc_secure_setuid"
install -o root -g root -m 2755 "$BIN/kc_secure_test" "$BIN/kc_secure_setgid"

# as_nobody [VAR=VALUE...] PROGRAM ARG...: runs PROGRAM as nobody with nobody's environment.
as_nobody() {
  local extra=()
  while [[ "$1" == *=* ]]; do
    extra+=("$1")
    shift
  done
  env -i PATH=/usr/bin:/bin HOME="$ROOT_ONLY/home" XDG_CACHE_HOME="$ROOT_ONLY/xdg" \
    KCACHE_DIR="$ROOT_ONLY/env-cache" KCACHE_KEY_FILE=/etc/shadow KCACHE_MAX_SIZE=1K \
    KCACHE_REQUIRE_KEY=1 KCACHE_OPENCL_LIBRARY="$LIB" KCACHE_CUDA_LIBRARY="$LIB" \
    KCACHE_NVRTC_LIBRARY="$LIB" KCACHE_LOG=debug "${extra[@]}" \
    "$SETPRIV" --reuid=nobody --regid="$NOGROUP" --clear-groups "$@"
}

# The marker reveals a load: without privileges the environment's library is loaded.
as_nobody "$BIN/kc_secure_test" control "$USER_DIR/unused" "$BIN/libfake_cuda.so"
[[ -f "$MARKER" ]] || kc_fail "control: the environment's library left no marker"
rm -f "$MARKER"

check_nothing_loaded() {
  [[ ! -e "$MARKER" ]] || kc_fail "$1: a library named by the environment was loaded"
}
# None of the cache directories the environment names. (Only kcache's: an OpenCL driver loaded
# by its default name may keep its own cache under $XDG_CACHE_HOME.)
check_nothing_created() {
  local path
  for path in "$ROOT_ONLY/env-cache" "$ROOT_ONLY/home/.cache/kcache" "$ROOT_ONLY/xdg/kcache"; do
    [[ ! -e "$path" ]] || kc_fail "$1: created $path, which the environment names"
  done
}

as_nobody "$BIN/kc_secure_setuid" secure "$ROOT_ONLY/explicit" "$BIN/libfake_cuda.so"
check_nothing_loaded setuid
[[ -d "$ROOT_ONLY/explicit" && $(stat -c %U "$ROOT_ONLY/explicit") == root ]] ||
  kc_fail "setuid: the program's directory was not created"
check_nothing_created setuid
echo "setuid: ok"

as_nobody KCACHE_DISABLE=1 "$BIN/kc_secure_setuid" disabled "$ROOT_ONLY/disabled" \
  "$BIN/libfake_cuda.so"
[[ ! -e "$ROOT_ONLY/disabled" ]] || kc_fail "KCACHE_DISABLE=1: the directory was created"
echo "setuid with KCACHE_DISABLE=1: ok"

# setgid: the effective user is nobody, so its explicit directory is one nobody may create.
as_nobody "$BIN/kc_secure_setgid" secure "$USER_DIR/explicit" "$BIN/libfake_cuda.so"
check_nothing_loaded setgid
[[ -d "$USER_DIR/explicit" ]] || kc_fail "setgid: the program's directory was not created"
check_nothing_created setgid
echo "setgid: ok"
# Processes that drop privileges themselves are no setuid programs: they read their environment
# and nobody's key file. One starts as root and switches to nobody; one starts as nobody (no
# privilege gained at exec) and makes itself non-dumpable.
SERVICE_KEY="$USER_DIR/service.key"
head -c 32 /dev/urandom >"$SERVICE_KEY"
chmod 600 "$SERVICE_KEY"
chown nobody "$SERVICE_KEY"
dropped_env=(env -i PATH=/usr/bin:/bin KCACHE_DIR="$USER_DIR/dropped-cache"
  KCACHE_KEY_FILE="$SERVICE_KEY" KCACHE_REQUIRE_KEY=1 KCACHE_LOG=debug)
"${dropped_env[@]}" "$SETPRIV" --clear-groups "$BIN/kc_secure_test" setuid - -
[[ -d "$USER_DIR/dropped-cache" && $(stat -c %U "$USER_DIR/dropped-cache") == nobody ]] ||
  kc_fail "setuid(): the environment's directory was not created by nobody"
"${dropped_env[@]}" "$SETPRIV" --reuid=nobody --regid="$NOGROUP" --clear-groups \
  "$BIN/kc_secure_test" undumpable - -
echo "dropped privileges: ok"
echo "secure-execution tests passed"
