"""Shared helpers of the binding's tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Polls ``condition``; a guard against hanging forever, not a timing assertion."""
    deadline = time.monotonic() + 60
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.001)


def run_threads(count: int, target: Callable[[], object]) -> list[object]:
    """Runs ``target`` on ``count`` threads; returns what each returned or raised."""
    return run_each([target] * count)


def run_each(targets: list[Callable[[], object]]) -> list[object]:
    """Runs each target on a thread of its own; returns what each returned or raised."""
    results: list[object] = [None] * len(targets)

    def run(i: int) -> None:
        try:
            results[i] = targets[i]()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
