"""What every memory cache shares with its leases: the values it holds and its callbacks.

Values are Python objects; kcache holds an integer handle for each (its ``void *`` value) and
this table maps handles back to objects. The table and the callbacks live apart from the
``Cache`` object so that leases can outlive the cache (kcache destroys a leased value at its
last release, after ``kc_cache_free``) without a reference cycle between the two.

Each callback is made once per cache. A lookup passes a token as the callback context; the
token names the lookup's build function in ``calls``, so no callback object is made per lookup.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from . import _lib, _waiting
from ._errors import BUILD_FAILED, REENTRANT, DestroyFailedError, ReentrantError, error

V = TypeVar("V")

# Failed builds whose exception waiters may still ask for. A waiter asks right after its call
# returns, so only that many failures of other builds in between could push its own out; it
# then gets a BuildFailedError with the code instead of the build's exception.
_FAILURES_KEPT = 1024
_CODE_MASK = 0x7FFF_FFFF


class Call:
    """One lookup in progress: what builds its value (``build(key)``), what loads and
    serializes it for a tiered lookup, and what its serialize step made."""

    __slots__ = (
        "build", "key", "load", "serialize", "serialized", "serialize_error", "owner", "relay"
    )

    def __init__(
        self,
        build: Callable[[Any], Any],
        key: Any,
        load: Callable[[bytes], Any] | None = None,
        serialize: Callable[[Any], bytes] | None = None,
    ) -> None:
        self.build = build
        self.key = key
        self.load = load
        self.serialize = serialize
        self.serialized = b""
        self.serialize_error: BaseException | None = None
        # The thread that asked: its build runs there, and it raises a failed build's own
        # exception.
        self.owner = threading.get_ident()
        self.relay: _waiting.Relay | None = None

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the thread that asked (see ``_waiting``)."""
        if self.relay is None:
            return fn(*args)
        return self.relay.run_on_main(fn, *args)


def _for_waiter(exc: BaseException) -> BaseException:
    """A new exception of the build's type, with its arguments and attributes, whose cause is
    the build's own. Raising one shared object in every waiter would make each raise add its
    call path to that object's traceback; this way each caller's traceback is its own, and
    the build's (where it failed) is shown once, as the cause."""
    try:
        fresh = type(exc).__new__(type(exc), *exc.args)
        fresh.args = exc.args
        fresh.__dict__.update(getattr(exc, "__dict__", {}))
    except Exception:  # noqa: BLE001 - a type that cannot be made so: raise the original
        return exc
    fresh.__cause__ = exc
    return fresh


class Core(Generic[V]):
    def __init__(
        self,
        destroy: Callable[[V], object] | None,
        weigher: Callable[[V], int] | None,
    ) -> None:
        self.values: dict[int, V] = {}
        self.calls: dict[int, Call] = {}
        self._destroy = destroy
        self._weigher = weigher
        self._handles = itertools.count(1)
        self._tokens = itertools.count(1)
        self._codes = itertools.count(1)
        # A failed build's exception and the thread that ran the build, by failure code.
        self._failures: dict[int, tuple[BaseException, int]] = {}
        self._failures_lock = threading.Lock()
        self._local = threading.local()
        # Values the load callback made since the last reset: the statistics' ``loads``, which
        # the C struct of a memory tier has no field for.
        self._loads = 0
        self._loads_lock = threading.Lock()
        self.build_cb = _lib.BuildFn(self._on_build)
        self.load_cb = _lib.LoadFn(self._on_load)
        self.serialize_cb = _lib.SerializeFn(self._on_serialize)
        self.destroy_cb = _lib.DestroyFn(self._on_destroy)

    def lookup(
        self, call: Call, data: bytes, c_call: Callable[[int], int], out: ctypes.c_void_p
    ) -> None:
        """Makes the lookup of key ``data`` that ``c_call(token)`` does, writing a lease to
        ``out``, the token being the callbacks' context; raises its failure. On the main
        thread while other threads run, a helper makes it and Ctrl-C interrupts the wait
        (``_waiting``)."""
        token = next(self._tokens)
        self.calls[token] = call
        if not _waiting.wanted():
            try:
                status = c_call(token)
            finally:
                del self.calls[token]
            self.check(status)
            return

        lookup = (id(self), data)
        if lookup in _waiting.building:
            del self.calls[token]
            raise ReentrantError(REENTRANT, "a build asked its cache for the key it is building")

        def made_by_helper() -> BaseException | None:
            # kcache's error details are the calling thread's: read them on the helper.
            try:
                status = c_call(token)
            except BaseException as exc:  # noqa: BLE001 - raised on the main thread
                return exc
            return None if status == 0 else self.fail(status, call.owner)

        def finish(failure: BaseException | None, abandoned: bool) -> None:
            if abandoned and failure is None:
                _lib.lib.kc_lease_release(out.value)
            del self.calls[token]

        call.relay = _waiting.Relay(lookup)
        failure = call.relay.call(made_by_helper, finish)
        if failure is not None:
            raise failure

    def fail(self, status: int, thread: int | None = None) -> BaseException:
        """The exception a failed lookup of ``thread`` (default: this one) raises: the build's
        own in the thread that asked for the build, a fresh copy of it in each waiter (see
        ``_for_waiter``)."""
        if status == BUILD_FAILED:
            with self._failures_lock:
                failure = self._failures.get(_lib.lib.kc_last_build_error())
            if failure is not None:
                exc, builder = failure
                asker = threading.get_ident() if thread is None else thread
                return exc if builder == asker else _for_waiter(exc)
        err = error(status)
        if isinstance(err, DestroyFailedError):
            err.__cause__ = getattr(self._local, "destroy_error", None)
            self._local.destroy_error = None
        return err

    def take_loads(self, reset: bool = False) -> int:
        """The values loaded rather than built since the last reset; ``reset`` starts again."""
        with self._loads_lock:
            loads = self._loads
            if reset:
                self._loads = 0
            return loads

    def check(self, status: int) -> None:
        if status != 0:
            raise self.fail(status)

    def destroying(self, call: Callable[..., int], *args: Any) -> None:
        """Runs a kcache call that may destroy values and raises its failure, with the
        exception of the destroy function that failed during it as the cause."""
        # A failure counted elsewhere (a release, a discarded build) must not become the
        # cause of this call's.
        self._local.destroy_error = None
        self.check(call(*args))

    def _install(self, value: V, out_value: Any, out_weight: Any) -> None:
        weight = self._weigher(value) if self._weigher is not None else 0
        handle = next(self._handles)
        self.values[handle] = value
        out_value[0] = handle
        out_weight[0] = weight

    def _failed(self, exc: BaseException, builder: int) -> int:
        code = next(self._codes) & _CODE_MASK or 1
        with self._failures_lock:
            self._failures[code] = (exc, builder)
            while len(self._failures) > _FAILURES_KEPT:
                del self._failures[next(iter(self._failures))]
        return code

    # The callbacks below run on kcache's side of a call: nothing may escape them.

    def _on_build(self, ctx: int, _key: Any, _len: int, out_value: Any, out_weight: Any) -> int:
        call = self.calls[ctx]
        try:
            self._install(call.run(call.build, call.key), out_value, out_weight)
            return 0
        except BaseException as exc:  # noqa: BLE001 - handed to every caller of the key
            return self._failed(exc, call.owner)

    def _on_load(self, ctx: int, data: Any, length: int, out_value: Any, out_weight: Any) -> int:
        try:
            call = self.calls[ctx]
            assert call.load is not None
            value = call.run(call.load, ctypes.string_at(data, length))
            self._install(value, out_value, out_weight)
            with self._loads_lock:
                self._loads += 1
            return 0
        except BaseException:  # noqa: BLE001 - kcache removes the entry and builds instead
            return 1

    def _on_serialize(self, ctx: int, handle: int, buf: Any, length: Any) -> int:
        call = self.calls[ctx]
        try:
            if not buf:
                assert call.serialize is not None
                call.serialized = bytes(call.run(call.serialize, self.values[handle]))
            elif length[0] < len(call.serialized):
                return 1
            else:
                ctypes.memmove(buf, call.serialized, len(call.serialized))
            length[0] = len(call.serialized)
            return 0
        except BaseException as exc:  # noqa: BLE001 - reported once the lookup returns
            call.serialize_error = exc
            return 1

    def _on_destroy(self, _ctx: int, handle: int) -> int:
        try:
            value = self.values.pop(handle)
            if self._destroy is not None:
                self._destroy(value)
            return 0
        except BaseException as exc:  # noqa: BLE001 - reported by the call that ran it
            self._local.destroy_error = exc
            return 1

