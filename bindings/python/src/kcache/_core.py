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

from . import _lib
from ._errors import BUILD_FAILED, DestroyFailedError, error

V = TypeVar("V")

# Failed builds whose exception waiters may still ask for. A waiter asks right after its call
# returns, so only that many failures of other builds in between could push its own out; it
# then gets a BuildFailedError with the code instead of the build's exception.
_FAILURES_KEPT = 1024
_CODE_MASK = 0x7FFF_FFFF


class Call:
    """One lookup in progress: what builds its value (``build(key)``), what loads and
    serializes it for a tiered lookup, and what its serialize step made."""

    __slots__ = ("build", "key", "load", "serialize", "serialized", "serialize_error")

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
        # Values the load callback made since the last reset: the memory tier counts them
        # among its builds, the binding's statistics do not.
        self._loads = 0
        self._loads_lock = threading.Lock()
        self.build_cb = _lib.BuildFn(self._on_build)
        self.load_cb = _lib.LoadFn(self._on_load)
        self.serialize_cb = _lib.SerializeFn(self._on_serialize)
        self.destroy_cb = _lib.DestroyFn(self._on_destroy)

    def start(self, call: Call) -> int:
        """Registers a lookup; returns the token to pass as the callbacks' context."""
        token = next(self._tokens)
        self.calls[token] = call
        return token

    def finish(self, token: int) -> None:
        del self.calls[token]

    def fail(self, status: int) -> BaseException:
        """The exception a failed lookup raises: the build's own in the thread that ran the
        build, a fresh copy of it in each waiter (see ``_for_waiter``)."""
        if status == BUILD_FAILED:
            with self._failures_lock:
                failure = self._failures.get(_lib.lib.kc_last_build_error())
            if failure is not None:
                exc, builder = failure
                return exc if builder == threading.get_ident() else _for_waiter(exc)
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

    def _failed(self, exc: BaseException) -> int:
        code = next(self._codes) & _CODE_MASK or 1
        with self._failures_lock:
            self._failures[code] = (exc, threading.get_ident())
            while len(self._failures) > _FAILURES_KEPT:
                del self._failures[next(iter(self._failures))]
        return code

    # The callbacks below run on kcache's side of a call: nothing may escape them.

    def _on_build(self, ctx: int, _key: Any, _len: int, out_value: Any, out_weight: Any) -> int:
        try:
            call = self.calls[ctx]
            self._install(call.build(call.key), out_value, out_weight)
            return 0
        except BaseException as exc:  # noqa: BLE001 - handed to every caller of the key
            return self._failed(exc)

    def _on_load(self, ctx: int, data: Any, length: int, out_value: Any, out_weight: Any) -> int:
        try:
            load = self.calls[ctx].load
            assert load is not None
            self._install(load(ctypes.string_at(data, length)), out_value, out_weight)
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
                call.serialized = bytes(call.serialize(self.values[handle]))
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

