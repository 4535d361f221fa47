#!/usr/bin/env bash
# Builds the disk tier C tests against the debug libkcache.so (built first) or LIB_DIR and runs
# them, plain and under ASan+UBSan, each in a fresh private work directory: kc_test_disk, then
# kc_test_fork (fork() from busy caches; starts a redis-server), then
# flight.sh, whose kc_flight_worker processes share one directory (and which reads that
# directory back with the `kcache` command, built here).
# Usage: c-tests/disk/run.sh [LIB_DIR]
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

kc_library debug "${1:-}"
cargo build --quiet -p kcache-cli
export KCACHE_COMMAND="$KC_TARGET/debug/kcache"
kc_run() {
  local build=$1 variant=$2
  mkdir -m 700 "$KC_WORK/$variant"
  # The test opens its caches with ignore_env; clear the variables anyway so nothing outside
  # the work directory can be touched.
  env -u KCACHE_DIR -u KCACHE_KEY_FILE -u KCACHE_MAX_SIZE -u KCACHE_DISABLE \
    "$build/kc_test_disk" "$KC_WORK/$variant"
  echo "kc_test_disk ($variant): ok"
  mkdir -m 700 "$KC_WORK/$variant-fork"
  "$build/kc_test_fork" "$KC_WORK/$variant-fork"
  echo "kc_test_fork ($variant): ok"
  c-tests/disk/flight.sh "$build/kc_flight_worker" "$KC_WORK/$variant-flight"
  echo "flight.sh ($variant): ok"
}
kc_suites "disk tier C tests" c-tests/disk disk
