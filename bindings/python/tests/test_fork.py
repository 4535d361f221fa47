"""fork() over open caches: ``multiprocessing.Pool`` with the fork start method, ``os.fork``, and a
pre-forking parent. Each scenario runs in a Python process of its own under a timeout, so that a
child that hangs fails the test instead of the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

COMMON = textwrap.dedent(
    """
    import json, os, sys, time
    import kcache

    directory = sys.argv[1]

    def open_tiered():
        disk = kcache.Disk(directory)
        tiered = kcache.TieredCache(kcache.Cache(), disk, load=bytes.decode,
                                    serialize=str.encode, backend="fork-test")
        return disk, tiered

    def lookup(tiered, key):
        with tiered.find_or_build(key, lambda k: k.upper()) as value:
            return value

    def on_disk(keys):
        with kcache.Disk(directory) as disk:
            return sorted(k for k in keys if disk.get(tiered.disk_key(k)) is not None)

    def wait_child(pid):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"
    """
)

POOL = COMMON + textwrap.dedent(
    """
    import multiprocessing

    disk, tiered = open_tiered()
    lookup(tiered, "parent")

    def work(key):
        started = time.monotonic()
        value = lookup(tiered, key)
        tiered.disk.flush()
        return value, round((time.monotonic() - started) * 1000)

    keys = ["a", "b", "c", "d"]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map_async(work, keys).get(timeout=60)
    print(json.dumps({"values": [v for v, _ in results], "ms": max(ms for _, ms in results),
                      "on_disk": on_disk(keys + ["parent"])}))
    """
)

OS_FORK = COMMON + textwrap.dedent(
    """
    disk, tiered = open_tiered()
    lookup(tiered, "parent")
    pid = os.fork()
    if pid == 0:
        # No flush, no close: the interpreter's end writes what the child built.
        lookup(tiered, "child")
        sys.exit(0)
    code = wait_child(pid)
    print(json.dumps({"child": code, "on_disk": on_disk(["parent", "child"])}))
    """
)

PRE_FORK = COMMON + textwrap.dedent(
    """
    disk, tiered = open_tiered()
    lookup(tiered, "warm-up")
    disk.flush()
    workers = []
    for worker in range(4):
        pid = os.fork()
        if pid == 0:
            keys = [f"w{worker}-{i}" for i in range(3)]
            for key in keys:
                lookup(tiered, key)
            tiered.disk.flush()
            os._exit(0 if on_disk(keys) == keys else 3)
        workers.append(pid)
    codes = [wait_child(pid) for pid in workers]
    keys = [f"w{w}-{i}" for w in range(4) for i in range(3)]
    print(json.dumps({"workers": codes, "on_disk": len(on_disk(keys))}))
    """
)


def run(script: str, directory: Path) -> dict[str, object]:
    """Runs ``script`` on ``directory``; a watchdog bounds it (a hang fails, not blocks)."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", script, str(directory)],
            check=False, capture_output=True, text=True, env=dict(os.environ), timeout=120,
        )
    except subprocess.TimeoutExpired:
        return {"hung": True}
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_a_fork_pool_over_a_tiered_cache_writes_every_entry(tmp_path: Path) -> None:
    result = run(POOL, tmp_path / "kc")
    assert result.get("values") == ["A", "B", "C", "D"], result
    assert result["on_disk"] == ["a", "b", "c", "d", "parent"]


def test_an_os_fork_child_writes_what_it_built_at_its_end(tmp_path: Path) -> None:
    result = run(OS_FORK, tmp_path / "kc")
    assert result == {"child": 0, "on_disk": ["child", "parent"]}


def test_a_pre_forking_parent_s_workers_write_their_entries(tmp_path: Path) -> None:
    result = run(PRE_FORK, tmp_path / "kc")
    assert result == {"workers": [0, 0, 0, 0], "on_disk": 12}
