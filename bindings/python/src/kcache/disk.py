"""``Disk``: the disk tier, a directory of checked (or authenticated) entries of bytes."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

from . import _lib
from ._errors import NOT_FOUND, check
from ._owned import Owned
from .stats import DiskStats, GcReport, from_struct

lib = _lib.lib


def descriptor(
    backend: str | None, device: str | None, name: str | None
) -> _lib.EntryDescriptor | None:
    """What an entry holds, as ``kcache ls`` shows it; None when nothing is said."""
    if backend is None and device is None and name is None:
        return None
    return _lib.EntryDescriptor(
        struct_size=ctypes.sizeof(_lib.EntryDescriptor),
        backend=None if backend is None else backend.encode(),
        device=None if device is None else device.encode(),
        name=None if name is None else name.encode(),
    )


def _disk_key(key: bytes) -> bytes:
    if len(key) != _lib.KEY_LEN:
        raise ValueError(f"a disk key is {_lib.KEY_LEN} bytes (KeyBuilder.finish()), not {len(key)}")
    return bytes(key)


class Disk(Owned):
    """An open disk tier.

    ``dir`` is an absolute path; None takes ``KCACHE_DIR``, then ``$XDG_CACHE_HOME/kcache``,
    then ``~/.cache/kcache``. ``key`` (16 to 4096 bytes) authenticates entries with
    HMAC-SHA256; without it, ``KCACHE_KEY_FILE`` or unkeyed checksums. Opening fails with
    ``UnavailableError`` (disk turned off), ``UntrustedError`` (a directory others may write)
    or ``InvalidArgumentError``; a program should then go on with memory only. ``close()``
    waits for pending writes.
    """

    _what = "disk"

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        max_size: int = 0,
        key: bytes | None = None,
        relaxed_durability: bool = False,
        ignore_env: bool = False,
        require_key: bool = False,
        lock_timeout_ms: int = 0,
    ) -> None:
        opts = lib.kc_persistence_options_default()
        opts.dir = None if dir is None else os.fsencode(dir)
        opts.max_size = max_size
        opts.key = key
        opts.key_len = 0 if key is None else len(key)
        opts.relaxed_durability = relaxed_durability
        opts.ignore_env = ignore_env
        opts.require_key = require_key
        opts.lock_timeout_ms = lock_timeout_ms
        self._create(lib.kc_persistence_open, ctypes.byref(opts))

    def put(
        self,
        key: bytes,
        data: bytes,
        build_time_ns: int = 0,
        *,
        backend: str | None = None,
        device: str | None = None,
        name: str | None = None,
    ) -> None:
        """Writes the entry for ``key`` (32 bytes) atomically; ``backend``, ``device`` and
        ``name`` say what it holds (``kcache ls``)."""
        desc = descriptor(backend, device, name)
        check(
            lib.kc_persistence_put_described(
                self._handle(), _disk_key(key), bytes(data), len(data), build_time_ns,
                None if desc is None else ctypes.byref(desc),
            )
        )

    def get(self, key: bytes) -> bytes | None:
        """The verified payload for ``key``, or None when there is none. An entry that fails
        verification is removed and raises ``IntegrityError``."""
        buf = _lib.Buffer()
        status = lib.kc_persistence_get(self._handle(), _disk_key(key), ctypes.byref(buf))
        if status == NOT_FOUND:
            return None
        check(status)
        try:
            return ctypes.string_at(buf.data, buf.len)
        finally:
            lib.kc_buffer_free(ctypes.byref(buf))

    def remove(self, key: bytes) -> bool:
        """Removes the entry for ``key``; False if there was none."""
        status = lib.kc_persistence_remove(self._handle(), _disk_key(key))
        if status == NOT_FOUND:
            return False
        check(status)
        return True

    def gc(
        self,
        retain: Iterable[bytes] = (),
        temp_max_age_s: int = _lib.DISK_DEFAULT_TEMP_MAX_AGE_S,
    ) -> GcReport:
        """Sweeps the directory: crashed writers' temporary files, other key schemas, corrupt
        entries, and entries of operator keys other than this disk's and ``retain``'s
        fingerprints."""
        kept = list(retain)
        if any(len(f) != _lib.FINGERPRINT_LEN for f in kept):
            raise ValueError(f"a fingerprint is {_lib.FINGERPRINT_LEN} bytes")
        report = _lib.DiskGcReport(struct_size=ctypes.sizeof(_lib.DiskGcReport))
        check(
            lib.kc_persistence_gc(
                self._handle(), b"".join(kept) or None, len(kept), temp_max_age_s,
                ctypes.byref(report),
            )
        )
        return from_struct(GcReport, report)

    def fingerprint(self) -> bytes:
        """The fingerprint of the operator key this disk writes under (zeros without one)."""
        out = (ctypes.c_uint8 * _lib.FINGERPRINT_LEN)()
        check(lib.kc_persistence_fingerprint(self._handle(), out))
        return bytes(out)

    def flush(self) -> None:
        """Waits for every background write submitted so far."""
        check(lib.kc_persistence_flush(self._handle()))

    def wait_scan(self) -> None:
        """Waits for the directory scan that opening starts (so ``stats`` counts every entry)."""
        check(lib.kc_persistence_wait_scan(self._handle()))

    def stats(self) -> DiskStats:
        out = _lib.DiskStatistics(struct_size=ctypes.sizeof(_lib.DiskStatistics))
        check(lib.kc_persistence_stats(self._handle(), ctypes.byref(out)))
        return from_struct(DiskStats, out)

    def reset_stats(self) -> None:
        check(lib.kc_persistence_reset_stats(self._handle()))

    def _free(self, ptr: int) -> None:
        lib.kc_persistence_free(ptr)
