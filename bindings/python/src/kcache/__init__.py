"""kcache: a concurrency-safe cache of compiled GPU kernels, from Python.

- ``Cache``: a memory cache of Python values, one build per key however many threads ask,
  leases (``with cache.find_or_build(key, build) as value: ...``), device eviction.
- ``Disk``, ``KeyBuilder``, ``TieredCache``: values kept on disk for the next process.
- ``kcache.opencl.get_program``: PyOpenCL programs compiled once per machine.
- ``render_metrics()``: Prometheus text; kcache's log goes to ``logging`` (logger ``kcache``).

Every call that can wait or build releases the GIL; build functions run with it held.
"""

from __future__ import annotations

from . import _lib, log
from ._errors import (
    BuildFailedError,
    CacheClearedError,
    DestroyFailedError,
    DeviceDestroyedError,
    IntegrityError,
    InvalidArgumentError,
    KcacheError,
    NotFoundError,
    ReentrantError,
    UnavailableError,
    UntrustedError,
)
from .cache import Cache, Lease
from .disk import Disk
from .key import Field, KeyBuilder
from .metrics import render_metrics
from .stats import CacheStats, DiskStats, GcReport, OpenCLStats
from .tiered import TieredCache

KEY_LEN = _lib.KEY_LEN

log._install()


def library_version() -> str:
    """The version of the C library in use (``kc_version``)."""
    return str(_lib.lib.kc_version().decode())


__all__ = [
    "KEY_LEN",
    "BuildFailedError",
    "Cache",
    "CacheClearedError",
    "CacheStats",
    "DestroyFailedError",
    "DeviceDestroyedError",
    "Disk",
    "DiskStats",
    "Field",
    "GcReport",
    "IntegrityError",
    "InvalidArgumentError",
    "KcacheError",
    "KeyBuilder",
    "Lease",
    "NotFoundError",
    "OpenCLStats",
    "ReentrantError",
    "TieredCache",
    "UnavailableError",
    "UntrustedError",
    "library_version",
    "render_metrics",
]
