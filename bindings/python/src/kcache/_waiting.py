"""Lookups of the main thread that Ctrl-C interrupts while they wait for another thread.

A lookup waiting inside kcache for another thread's build holds no GIL, but Python runs signal
handlers only when the main thread comes back from C: ``KeyboardInterrupt`` would arrive when
that build ends. So when the main thread looks up while other threads run, a helper thread
makes the call into kcache and the main thread waits for it where signals reach it (a blocking
``SimpleQueue.get``). The lookup's build, load and serialize functions still run on the main
thread: the helper hands each one over and waits for its outcome, so they find the thread
state (a current GPU context, thread-locals) they would have found. Interrupted, the main
thread leaves at once; the helper finishes the call alone and gives back what it got.

A program with no other thread (the common single-threaded script) calls kcache directly: no
other thread of it can be building what it would wait for.
"""

from __future__ import annotations

import _thread
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_main = threading.main_thread().ident
# Helpers started in this process, and those waiting for a lookup to make.
_helpers = 0
_idle: list[_Helper] = []
_lock = threading.Lock()
# The lookups whose functions the main thread is running for a helper, innermost last (only
# the main thread reads or changes it). kcache refuses a build that asks for its own key
# (KC_ERR_REENTRANT) by thread; a helper is another thread, so the binding checks here.
building: list[object] = []


class Interrupted(KeyboardInterrupt):
    """What a build handed to the main thread gets when that thread was interrupted first."""


class _Helper(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="kcache-lookup", daemon=True)
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            self.jobs.get()()
            with _lock:
                _idle.append(self)


def _submit(job: Callable[[], None]) -> None:
    global _helpers
    with _lock:
        helper = _idle.pop() if _idle else None
        if helper is None:
            _helpers += 1
    if helper is None:
        helper = _Helper()
        helper.start()
    helper.jobs.put(job)


def _forget_helpers() -> None:
    # A forked child has none of the parent's threads.
    global _helpers, _lock, _main
    _main = threading.get_ident()  # the forking thread is the child's main thread
    _helpers = 0
    _idle.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_helpers)


def wanted() -> bool:
    """Whether a lookup on this thread should be made by a helper: on the main thread while
    other Python threads (``_thread._count()``: the main thread not included) run."""
    return threading.get_ident() == _main and _thread._count() > _helpers


class Relay:
    """One lookup made by a helper for the main thread: the helper's requests to run a
    function there, and the lookup's end, reach the main thread through ``inbox``."""

    __slots__ = ("_inbox", "_lock", "_abandoned", "_lookup")

    def __init__(self, lookup: object) -> None:
        #: What names the lookup in ``building`` while its functions run.
        self._lookup = lookup
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._abandoned = False

    def run_on_main(self, fn: Callable[..., Any], *args: Any) -> Any:
        """On the helper: ``fn(*args)`` run by the main thread; returns or raises as it did."""
        reply: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        with self._lock:
            if self._abandoned:
                raise Interrupted("the lookup was interrupted")
            self._inbox.put(("run", fn, args, reply))
        ok, outcome = reply.get()
        if ok:
            return outcome
        raise outcome

    def call(self, c_call: Callable[[], T], finish: Callable[[T, bool], None]) -> T:
        """On the main thread: ``c_call()`` made by a helper; returns what it returned.
        ``finish`` runs once after it returns, with whether the main thread had left."""

        def job() -> None:
            result = c_call()  # must not raise: nobody would hear of it
            with self._lock:
                if not self._abandoned:
                    self._inbox.put(("done", result))
                    return
            finish(result, True)

        _submit(job)
        while True:
            try:
                item = self._inbox.get()
            except BaseException:
                self._abandon(finish)
                raise
            if item[0] == "done":
                finish(item[1], False)
                return item[1]  # type: ignore[no-any-return]
            _, fn, args, reply = item
            building.append(self._lookup)
            try:
                reply.put((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - the helper's call raises it
                reply.put((False, exc))
            finally:
                building.pop()

    def _abandon(self, finish: Callable[[Any, bool], None]) -> None:
        with self._lock:
            self._abandoned = True
        # What the helper sent before it saw that: requests get the interruption, and an
        # ended lookup is finished here.
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "done":
                finish(item[1], True)
            else:
                item[3].put((False, Interrupted("the lookup was interrupted")))
