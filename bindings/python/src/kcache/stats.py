"""Statistics as frozen dataclasses, copied from kcache's statistics structs."""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from ._lib import lib

T = TypeVar("T")


def from_struct(cls: type[T], struct: ctypes.Structure, **nested: Any) -> T:
    """``cls`` with each field copied from the struct's field of the same name."""
    values = {
        f.name: nested[f.name] if f.name in nested else getattr(struct, f.name)
        for f in dataclasses.fields(cls)
    }
    return cls(**values)


def memory_stats(struct: ctypes.Structure, loads: int) -> CacheStats:
    """A memory tier's counters with ``loads``, the values it loaded from a store (disk,
    remote), which the C struct cannot hold (it is embedded in each backend's): the caller
    counts them, or takes a backend's own count of them."""
    return from_struct(CacheStats, struct, loads=loads)


@dataclass(frozen=True)
class _Lookups:
    hits: int
    misses: int

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses); None before the first lookup."""
        if self.hits + self.misses == 0:
            return None
        return float(lib.kc_hit_rate(self.hits, self.misses))


@dataclass(frozen=True)
class CacheStats(_Lookups):
    """Counters of a memory cache (``kc_cache_statistics``); the last three are gauges.
    ``builds`` counts values built, ``loads`` values a tiered lookup loaded from a store."""

    builds: int
    loads: int
    build_failures: int
    waits: int
    discarded: int
    capacity_evictions: int
    device_evictions: int
    clears: int
    destroys: int
    destroy_errors: int
    entries: int
    weight: int
    leases: int


@dataclass(frozen=True)
class DiskStats(_Lookups):
    """Counters of a disk tier (``kc_persistence_statistics``)."""

    puts: int
    bytes_read: int
    bytes_written: int
    integrity_rejects: int
    io_errors: int
    evictions: int
    removes: int
    load_failures: int
    entries: int
    bytes: int
    scan_complete: bool
    lock_waits: int
    lock_timeouts: int
    lock_takeovers: int
    pending_writes: int
    failed_writes: int


@dataclass(frozen=True)
class GcReport:
    """What one ``Disk.gc`` removed, by reason (``kc_persistence_gc_report``)."""

    temp_files: int
    stale_schema: int
    stale_fingerprint: int
    corrupt: int
    kept: int
    bytes_freed: int
    undeletable: int
    lock_files: int
    old_format: int


@dataclass(frozen=True)
class OpenCLStats:
    """Counters of an OpenCL program cache (``kc_opencl_cache_statistics``)."""

    memory: CacheStats
    source_builds: int
    binary_loads: int
    binaries_rejected: int
    disk_hits: int
    disk_misses: int
    disk_errors: int
    #: Builds kcache could not key (a computed ``#include`` it cannot expand, an option that
    #: reads a file): compiled and cached nowhere; counted in ``source_builds`` too.
    passed_through: int
    disk: DiskStats
