"""The memory cache: ``Cache`` and the ``Lease`` its lookups return."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Generic, TypeVar

from . import _lib
from ._core import Call, Core
from ._errors import NOT_FOUND, NotFoundError, check
from ._owned import Owned
from .key import Bytes, key_bytes
from .stats import CacheStats, memory_stats

V = TypeVar("V")
Key = Bytes
lib = _lib.lib


def device_id(device: int | None) -> int:
    return _lib.NO_DEVICE if device is None else device


class Lease(Owned, Generic[V]):
    """A hold on one cached value: the value is not destroyed while a lease on it exists, even
    if it is evicted or the cache is cleared or closed meanwhile.

    Release it with ``release()`` or by leaving its ``with`` block, which gives the value::

        with cache.find_or_build(key, build) as value:
            use(value)

    A lease still held when it is garbage-collected is released then.
    """

    __slots__ = ("_core", "value")
    _what = "lease"

    def __init__(self, core: Core[V], ptr: int) -> None:
        self._core = core
        self._ptr = ptr
        #: The cached value, as the build function returned it.
        self.value: V = core.values[lib.kc_lease_value(ptr)]

    @property
    def weight(self) -> int:
        """The weight the cache's ``weigher`` gave the value (0 without one)."""
        return int(lib.kc_lease_weight(self._handle()))

    def clone(self) -> Lease[V]:
        """Another lease on the same value, released separately."""
        return Lease(self._core, lib.kc_lease_clone(self._handle()))

    def release(self) -> None:
        """Gives the value back; destroys it if it has left the cache and this was its last
        lease. A second call does nothing."""
        self.close()

    def _free(self, ptr: int) -> None:
        lib.kc_lease_release(ptr)

    def __enter__(self) -> V:  # type: ignore[override]
        return self.value

    def __repr__(self) -> str:
        state = "released" if self.closed else "held"
        return f"<kcache.Lease {state} {self.value!r}>"


class Cache(Owned, Generic[V]):
    """A thread-safe cache of Python values built once per key.

    Concurrent lookups of one key run one build; the others wait for it (without holding the
    GIL) and get the same value, or the same exception. ``destroy`` runs once per value, when
    it has left the cache and no lease holds it; ``weigher`` gives a value's weight for
    ``max_weight``. ``invalidated_by_clear``: a build in flight across ``clear()`` is
    discarded and its callers get ``CacheClearedError``.

    ``close()`` (or leaving a ``with`` block) frees the cache; it must be the last call on it.
    Leases still held stay valid.
    """

    _what = "cache"

    def __init__(
        self,
        *,
        max_entries: int = 0,
        max_weight: int = 0,
        invalidated_by_clear: bool = False,
        destroy: Callable[[V], object] | None = None,
        weigher: Callable[[V], int] | None = None,
    ) -> None:
        self._core: Core[V] = Core(destroy, weigher)
        opts = lib.kc_cache_options_default()
        opts.max_entries = max_entries
        opts.max_weight = max_weight
        opts.invalidated_by_clear = invalidated_by_clear
        opts.destroy = self._core.destroy_cb
        self._create(lib.kc_cache_new, ctypes.byref(opts))

    def find_or_build(
        self, key: Key, build: Callable[[Key], V], device: int | None = None
    ) -> Lease[V]:
        """A lease on the value for ``key``; on a miss ``build(key)`` makes it. ``device`` is
        an id >= 0 that ``evict_device`` uses, or None. An exception raised by ``build`` is
        raised in this caller and in every caller that waited for that build."""
        data = key_bytes(key)
        core = self._core
        handle = self._handle()
        out = ctypes.c_void_p()
        core.lookup(
            Call(build, key),
            data,
            lambda token: lib.kc_cache_find_or_build(  # type: ignore[no-any-return]
                handle, data, len(data), device_id(device), core.build_cb, token,
                ctypes.byref(out),
            ),
            out,
        )
        return Lease(core, out.value)  # type: ignore[arg-type]

    def get(self, key: Key) -> Lease[V] | None:
        """A lease on the value for ``key`` if the cache holds one; never builds or waits."""
        data = key_bytes(key)
        out = ctypes.c_void_p()
        status = lib.kc_cache_get(self._handle(), data, len(data), ctypes.byref(out))
        if status == NOT_FOUND:
            return None
        check(status)
        return Lease(self._core, out.value)  # type: ignore[arg-type]

    def remove(self, key: Key) -> bool:
        """Removes the entry for ``key``; False if there was none."""
        data = key_bytes(key)
        try:
            self._core.destroying(lib.kc_cache_remove, self._handle(), data, len(data))
        except NotFoundError:
            return False
        return True

    def evict_device(self, device: int) -> None:
        """Evicts every value built for ``device``; its builds in flight fail with
        ``DeviceDestroyedError``. Leased values are destroyed at their last release."""
        self._core.destroying(lib.kc_cache_evict_device, self._handle(), device)

    def clear(self) -> None:
        """Removes every entry; leased values are destroyed at their last release."""
        self._core.destroying(lib.kc_cache_clear, self._handle())

    def stats(self) -> CacheStats:
        out = _lib.CacheStatistics(struct_size=ctypes.sizeof(_lib.CacheStatistics))
        check(lib.kc_cache_stats(self._handle(), ctypes.byref(out)))
        return memory_stats(out, self._core.take_loads())

    def reset_stats(self) -> None:
        """Zeroes the event counters; ``entries``, ``weight`` and ``leases`` stay."""
        check(lib.kc_cache_reset_stats(self._handle()))
        self._core.take_loads(reset=True)

    def __len__(self) -> int:
        return int(lib.kc_cache_len(self._handle()))

    def _free(self, ptr: int) -> None:
        # Destroys every value no lease holds; the others at their last release.
        lib.kc_cache_free(ptr)
