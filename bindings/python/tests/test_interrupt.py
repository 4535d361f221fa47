"""Ctrl-C reaches a main thread waiting for another thread's build, and builds asked for by
the main thread run on it even when a helper makes the call into kcache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import kcache

INTERRUPTED = textwrap.dedent(
    """
    import json, os, signal, threading, time
    import kcache

    # Python installs no KeyboardInterrupt handler when it starts with SIGINT ignored, as a
    # test run started in the background of a script (`scripts/test &`) or under nohup does.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    cache = kcache.Cache()
    started, release = threading.Event(), threading.Event()

    def slow_build(key):
        started.set()
        release.wait(60)  # the build ends when the main thread says so
        return 1

    builder = threading.Thread(target=lambda: cache.find_or_build("k", slow_build).release())
    builder.start()
    started.wait()
    sent = []

    def interrupt():
        while cache.stats().waits != 1:  # the main thread waits for the build
            time.sleep(0.001)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt).start()
    try:
        cache.find_or_build("k", lambda k: 2)
        outcome = "returned"
    except KeyboardInterrupt:
        outcome = "interrupted"
    arrived = time.monotonic()
    build_running = not release.is_set()
    release.set()
    builder.join()
    # The helper that made the interrupted call gives its lease back once the build ends.
    deadline = time.monotonic() + 60
    while cache.stats().leases and time.monotonic() < deadline:
        time.sleep(0.001)
    with cache.find_or_build("k", lambda k: 3) as value:
        pass
    print(json.dumps({"outcome": outcome, "build_running": build_running,
                      "latency_ms": (arrived - sent[0]) * 1000, "leases": cache.stats().leases,
                      "value": value, "builds": cache.stats().builds}))
    """
)


def test_ctrl_c_interrupts_a_wait_for_another_thread_s_build() -> None:
    out = subprocess.run(
        [sys.executable, "-c", INTERRUPTED], capture_output=True, text=True, timeout=120,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    print(f"KeyboardInterrupt arrived {result['latency_ms']:.1f} ms after SIGINT")
    # Before the build ended: the wait was interrupted, not the build waited out.
    assert (result["outcome"], result["build_running"]) == ("interrupted", True)
    assert (result["leases"], result["value"], result["builds"]) == (0, 1, 1)


def test_with_other_threads_the_main_thread_still_runs_its_builds() -> None:
    idle = threading.Event()
    other = threading.Thread(target=idle.wait)
    other.start()
    try:
        cache = kcache.Cache[str]()
        ran_on: list[threading.Thread] = []

        def build(key: object) -> str:
            ran_on.append(threading.current_thread())
            # A lookup from inside the build, made by another helper.
            with cache.find_or_build("inner", lambda k: "i") as inner:
                return f"outer+{inner}"

        with cache.find_or_build("outer", build) as value:
            assert value == "outer+i"
        assert ran_on == [threading.main_thread()]

        class Boom(Exception):
            pass

        raised: list[Boom] = []

        def failing(key: object) -> str:
            raised.append(Boom("no"))
            raise raised[0]

        with pytest.raises(Boom) as info:
            cache.find_or_build("failing", failing)
        assert info.value is raised[0]

        # A build asking for its own key fails as it does without other threads.
        def reentrant(key: object) -> str:
            return cache.find_or_build("again", lambda k: "x").value

        with pytest.raises(kcache.ReentrantError):
            cache.find_or_build("again", reentrant)
        assert cache.stats().leases == 0
    finally:
        idle.set()
        other.join()
