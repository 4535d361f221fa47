#!/usr/bin/env bash
# Cross-process single flight through kc_tiered_find_or_build: flight_worker processes that
# miss one entry of one directory at the same moment. Of six, one builds and five load what it
# wrote, and the `kcache` command ($KCACHE_COMMAND) reads that back from the directory; when
# every build fails, each process reports its own failure and none hangs; with a tiny lock
# timeout, processes behind a slow builder build themselves; a process waiting for a builder
# whose build forked a child that outlives it reads the entry once written, without waiting
# for the child; four processes with directories
# of their own and one redis-server build once between them.
# Usage: KCACHE_COMMAND=kcache flight.sh WORKER WORK_DIR (WORK_DIR must not exist yet)
set -euo pipefail
worker=$1 work=$2
mkdir -m 700 "$work"

fail() {
  echo "$0: $*" >&2
  exit 1
}

# launch GROUP COUNT DIR BUILD_MS BUILD_RESULT LOCK_TIMEOUT_MS [REMOTE_URL]: starts COUNT
# workers on the cache directory DIR ("{i}" in it: the worker's number), waits until all are
# ready, then lets them go at once. Their ids are left in `pids`; worker I of GROUP writes to
# $work/GROUP.I.out and .err.
launch() {
  local group=$1 count=$2 dir=$3 i ready
  shift 3
  pids=()
  for ((i = 0; i < count; i++)); do
    timeout 120 "$worker" "${dir//\{i\}/$i}" "$work/$group.$i.ready" "$work/$group.go" "$@" \
      >"$work/$group.$i.out" 2>"$work/$group.$i.err" &
    pids+=($!)
  done
  for ((ready = 0; ready < 600; ready++)); do
    [[ $(compgen -G "$work/$group.*.ready" | wc -l) -lt $count ]] || break
    sleep 0.1
  done
  touch "$work/$group.go"
}

# finish GROUP PID...: waits for the workers of GROUP, which must all succeed.
finish() {
  local group=$1 pid i=0 rc
  shift
  for pid in "$@"; do
    rc=0
    wait "$pid" || rc=$?
    if [[ $rc -ne 0 ]]; then
      cat "$work/$group.$i.err" >&2
      fail "$group: worker $i failed (status $rc)"
    fi
    i=$((i + 1))
  done
}

# sums GROUP: the sums of the counters the workers of GROUP printed, as they print them.
sums() {
  awk -F'[= ]' '{ b += $2; l += $4; w += $6; t += $8 }
    END { printf "builds=%d loads=%d waits=%d timeouts=%d\n", b, l, w, t }' "$work/$1".*.out
}

# expect LABEL WHAT PATTERN: WHAT matches the extended regular expression PATTERN, whole.
expect() {
  [[ $2 =~ ^$3$ ]] || fail "$1: got \"$2\", expected \"$3\""
  echo "$1: $2"
}

# await_lock DIR WHO: waits up to 30 s for a lock file in DIR, which WHO (a builder launched
# there) takes once it builds.
await_lock() {
  local i
  for ((i = 0; i < 600; i++)); do
    ! compgen -G "$1/.*.lock" >/dev/null || return 0
    sleep 0.05
  done
  fail "$2 holds no lock"
}

# settled DIR ENTRIES: once every process is done, DIR holds ENTRIES entries and no lock file
# (each is unlinked by its holder).
settled() {
  local entries
  entries=$(compgen -G "$1/*.kce" | wc -l || true)
  [[ $entries -eq $2 ]] || fail "$1: $entries entries, expected $2"
  if compgen -G "$1/.*.lock" >&2; then
    fail "$1: lock files left (above)"
  fi
}

# Six processes, one build of 300 ms: the others wait for it and load its entry.
launch single 6 "$work/single" 300 0 0
finish single "${pids[@]}"
expect "single flight" "$(sums single)" "builds=1 loads=5 waits=[0-5] timeouts=0"
settled "$work/single" 1

# What the command reads of that directory: one entry, written through kc_tiered_find_or_build
# (backend `custom`), and the six processes' counters added up.
"$KCACHE_COMMAND" --dir "$work/single" stats --json >"$work/single.stats.json"
"$KCACHE_COMMAND" --dir "$work/single" ls --json --backend custom >"$work/single.ls.json"
expect "kcache stats and ls" "$(python3 - "$work/single.stats.json" "$work/single.ls.json" <<'PY'
import json, sys
stats = json.load(open(sys.argv[1]))
ls = json.load(open(sys.argv[2]))
c = stats["counters"]
backends = {b["backend"]: b["entries"] for b in stats["backends"]}
print(f"entries={stats['entries']} listed={len(ls['entries'])} backends={backends} "
      f"builds={c['builds']} writes={c['disk_writes']} disk_hits={c['disk_hits']}")
PY
)" "entries=1 listed=1 backends=\{'custom': 1\} builds=1 writes=1 disk_hits=5"

# Every build fails: each process gets its own failure (the waiters build in turn) and no
# process loads anything.
launch failing 6 "$work/failing" 300 42 0
finish failing "${pids[@]}"
expect "failed builds" "$(sums failing)" "builds=6 loads=0 waits=[0-5] timeouts=0"
settled "$work/failing" 0

# A builder that takes 5 s and five processes that wait 50 ms at most: once the builder holds
# the entry's lock, each of the five times out and builds.
launch leader 1 "$work/timeout" 5000 0 0
leader=${pids[0]}
await_lock "$work/timeout" "the builder"
launch followers 5 "$work/timeout" 1000 0 50
finish followers "${pids[@]}"
for out in "$work"/followers.*.out; do
  expect "lock timeout, ${out##*/}" "$(cat "$out")" "builds=1 loads=0 waits=0 timeouts=1"
done
finish leader "$leader"
expect "lock timeout, the builder" "$(sums leader)" "builds=1 loads=0 waits=0 timeouts=0"
settled "$work/timeout" 1

# A builder whose build forks a child that outlives it (a child that would keep the lock's
# descriptor, and so the lock, were it not closed at the fork), and a process that waits for
# the entry with a 20 s lock timeout: it reads the entry once the builder has written it,
# instead of timing out and building.
FLIGHT_FORK_UNTIL="$work/fork.end" launch forker 1 "$work/fork" 1000 0 0
forker=${pids[0]}
await_lock "$work/fork" "the forking builder"
launch forkwait 1 "$work/fork" 1000 0 20000
finish forker "$forker"
finish forkwait "${pids[@]}"
touch "$work/fork.end"
expect "a builder's forked child" "$(sums forker)" "builds=1 loads=0 waits=0 timeouts=0"
expect "waiting behind a forked child" "$(sums forkwait)" "builds=0 loads=1 waits=1 timeouts=0"
settled "$work/fork" 1

# Across nodes: four workers with directories of their own and one redis-server on loopback
# (the remote tier through kc_persistence_options): one builds under the entry's lease, the others
# wait for it and load its entry from the store.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -m 700 "$work/redis"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work/redis" \
  >"$work/redis.log" 2>&1 &
redis=$!
trap 'kill "$redis" 2>/dev/null || true' EXIT
for ((i = 0; i < 500; i++)); do
  [[ $(redis-cli -p "$port" ping 2>/dev/null) != PONG ]] || break
  sleep 0.02
done
[[ $(redis-cli -p "$port" ping) == PONG ]] || fail "redis-server did not start"
launch remote 4 "$work/node.{i}" 300 0 0 "redis://127.0.0.1:$port/"
finish remote "${pids[@]}"
expect "across nodes" "$(sums remote)" "builds=1 loads=3 waits=0 timeouts=0"
for ((i = 0; i < 4; i++)); do
  settled "$work/node.$i" 1
done
