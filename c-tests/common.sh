# Sourced by the run.sh scripts of c-tests/ (bash). A script picks the library with kc_library,
# defines kc_run BUILD_DIR VARIANT (runs what the project built; VARIANT is plain or sanitize)
# and calls kc_suites, which configures and builds its CMake project twice, plain and with
# AddressSanitizer + UndefinedBehaviorSanitizer on the C side, and runs each build.
#
# Provides: KC_ROOT (the repository, also the working directory), KC_WORK (a private scratch
# directory, removed on exit), kc_fail, kc_library, kc_check_readme_snippet, kc_suites.
# Environment: KCACHE_INCLUDE_DIR (default include/), KCACHE_JOBS (default 2), CARGO_TARGET_DIR.
# A script may set KC_LSAN_SUPPRESSIONS (a LeakSanitizer suppression file) and KC_LSAN_FULL_STACKS
# (record complete allocation stacks) before kc_suites.
set -euo pipefail

KC_CALLER_DIR=$PWD
KC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$KC_ROOT"
KC_TARGET="${CARGO_TARGET_DIR:-$KC_ROOT/target}"
[[ "$KC_TARGET" == /* ]] || KC_TARGET="$KC_ROOT/$KC_TARGET"
KC_WORK="$(mktemp -d)"
trap 'rm -rf "$KC_WORK"' EXIT

kc_fail() {
  echo "$0: $*" >&2
  exit 1
}

# kc_library PROFILE [LIB_DIR]: sets KC_LIB_DIR to LIB_DIR when given, else builds cargo's PROFILE
# (release or debug) library and uses that.
kc_library() {
  local profile=$1 dir=${2:-}
  if [[ -n "$dir" ]]; then
    [[ "$dir" == /* ]] || dir="$KC_CALLER_DIR/$dir"
  else
    case "$profile" in
      release) cargo build --quiet --lib --release ;;
      debug) cargo build --quiet --lib ;;
      *) kc_fail "kc_library: unknown profile $profile" ;;
    esac
    dir="$KC_TARGET/$profile"
  fi
  [[ -f "$dir/libkcache.so" ]] || kc_fail "no libkcache.so in $dir"
  KC_LIB_DIR=$dir
}

# kc_check_readme_snippet PATH: README.md or a docs/*.md page shows the file PATH byte for byte,
# and every other snippet of those pages equals its file too.
kc_check_readme_snippet() {
  cmake -DROOT="$KC_ROOT" -DSNIPPET="$1" -P "$KC_ROOT/c-tests/cmake/readme-snippet.cmake"
}

# One variant: configure, build, then kc_run with the sanitizers' options set. Runs in a subshell
# with errexit on, so any failing command in kc_run fails the variant.
kc_variant() {
  local project=$1 name=$2 variant=$3
  shift 3
  local build="$KC_TARGET/c-tests/$name/$variant" sanitize=OFF log="$KC_WORK/$name-$variant.log"
  if [[ "$variant" == sanitize ]]; then
    sanitize=ON
    export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    if [[ -n "${KC_LSAN_SUPPRESSIONS:-}" ]]; then
      export LSAN_OPTIONS="suppressions=$KC_LSAN_SUPPRESSIONS:print_suppressions=0"
    fi
    if [[ -n "${KC_LSAN_FULL_STACKS:-}" ]]; then
      # Suppressions match the frames of an allocation's stack. The default frame-pointer
      # unwinder stops in the first library built without frame pointers, so only that
      # library's name is there to match; the unwinder that reads unwind tables records every
      # frame, at some cost per allocation, so a suppression can name a function.
      ASAN_OPTIONS+=:fast_unwind_on_malloc=0
    fi
  fi
  if ! cmake -S "$project" -B "$build" -DKCACHE_LIB_DIR="$KC_LIB_DIR" \
    -DKCACHE_INCLUDE_DIR="${KCACHE_INCLUDE_DIR:-$KC_ROOT/include}" -DKCACHE_SANITIZE="$sanitize" \
    "$@" >"$log" 2>&1 || ! cmake --build "$build" -j "${KCACHE_JOBS:-2}" >>"$log" 2>&1; then
    cat "$log" >&2
    kc_fail "$project: configure or build ($variant) failed"
  fi
  kc_run "$build" "$variant"
}

# kc_suites TITLE PROJECT_DIR NAME [CMAKE_ARG...]: both variants of the CMake project in
# PROJECT_DIR, built in target/c-tests/NAME/{plain,sanitize}. Both run even when the first fails:
# their failures tell different stories.
kc_suites() {
  local title=$1 project=$2 name=$3 variant rc failed=()
  shift 3
  [[ -n "${KC_LIB_DIR:-}" ]] || kc_fail "kc_suites: call kc_library first"
  for variant in plain sanitize; do
    if [[ "$variant" == plain ]]; then
      echo "== $title: plain"
    else
      echo "== $title: ASan+UBSan"
    fi
    set +e
    (
      set -e
      kc_variant "$project" "$name" "$variant" "$@"
    )
    rc=$?
    set -e
    [[ $rc -eq 0 ]] || failed+=("$variant")
  done
  [[ ${#failed[@]} -eq 0 ]] || kc_fail "$title failed: ${failed[*]}"
  echo "$title passed: plain and ASan+UBSan"
}
