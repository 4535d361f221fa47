"""``TieredCache``: memory, then disk, then build, for values of any runtime."""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Callable
from typing import Generic, TypeVar

from . import _lib
from ._core import Call
from .cache import Cache, Key, Lease, device_id
from .disk import Disk, _disk_key, descriptor
from .key import KeyBuilder, key_bytes

V = TypeVar("V")
lib = _lib.lib


class TieredCache(Generic[V]):
    """Looks a value up in ``cache``; on a miss loads it from ``disk`` with ``load``, else
    builds it and writes ``serialize(value)`` back to disk for the next process.

    The disk read runs inside the memory tier's single flight (concurrent callers of one key
    read or build once); a disk miss waits for another process building the same entry in
    the same directory. A payload ``load`` raises on is removed and the value built. ``disk``
    None: memory only. ``backend`` names the entries' backend for ``kcache ls`` and goes into
    the disk keys derived here.
    """

    def __init__(
        self,
        cache: Cache[V],
        disk: Disk | None,
        *,
        load: Callable[[bytes], V],
        serialize: Callable[[V], bytes],
        backend: str = "custom",
    ) -> None:
        self.cache = cache
        self.disk = disk
        self.backend = backend
        self._load = load
        self._serialize = serialize
        core = cache._core
        # One set of callbacks for every lookup; each lookup's context is its token.
        self._callbacks = _lib.TieredCallbacks(
            struct_size=ctypes.sizeof(_lib.TieredCallbacks),
            build=core.build_cb,
            load=core.load_cb,
            serialize=core.serialize_cb,
        )

    def disk_key(self, key: Key) -> bytes:
        """The disk key a lookup of ``key`` uses when none is given: the backend and the key's
        bytes as the source of a ``KeyBuilder``."""
        return KeyBuilder(backend=self.backend, source=key_bytes(key)).finish()

    def find_or_build(
        self,
        key: Key,
        build: Callable[[Key], V],
        device: int | None = None,
        *,
        disk_key: bytes | None = None,
        device_name: str | None = None,
        name: str | None = None,
    ) -> Lease[V]:
        """A lease on the value for ``key``: from memory, else from disk (the entry under
        ``disk_key``, 32 bytes; default ``self.disk_key(key)``), else ``build(key)``.
        ``device_name`` and ``name`` describe the entry written (``kcache ls``). A build's
        exception is raised in this caller and every waiter, as for ``Cache.find_or_build``."""
        data = key_bytes(key)
        l2_key = _disk_key(disk_key) if disk_key is not None else self.disk_key(data)
        core = self.cache._core
        call = Call(build, key, self._load, self._serialize)
        desc = descriptor(self.backend, device_name, name)
        cache = self.cache._handle()
        disk = lib.kc_persistence_none() if self.disk is None else self.disk._handle()
        out = ctypes.c_void_p()

        def c_call(token: int) -> int:
            callbacks = _lib.TieredCallbacks.from_buffer_copy(self._callbacks)
            callbacks.ctx = token
            return lib.kc_tiered_find_or_build_described(  # type: ignore[no-any-return]
                cache, data, len(data), device_id(device), disk, l2_key,
                ctypes.byref(callbacks), None if desc is None else ctypes.byref(desc),
                ctypes.byref(out),
            )

        core.lookup(call, data, c_call, out)
        if call.serialize_error is not None:
            warnings.warn(
                f"kcache: serialize raised {call.serialize_error!r}; the entry was not written",
                RuntimeWarning,
                stacklevel=2,
            )
        return Lease(core, out.value)  # type: ignore[arg-type]
