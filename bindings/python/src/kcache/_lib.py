"""The C library, its structs and its function prototypes, through ctypes.

ctypes calls through ``CDLL`` release the GIL for the whole foreign call, so a thread waiting
inside kcache for another thread's build never blocks that build; callbacks made with
``CFUNCTYPE`` take the GIL back before running Python code.

The structs mirror ``include/kcache.h`` field by field; the tests compare each one with the
header, so a field added, removed or reordered there fails them.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

KEY_LEN = 32
FINGERPRINT_LEN = 8
NO_DEVICE = -1
DISK_DEFAULT_TEMP_MAX_AGE_S = 900

BuildFn = ctypes.CFUNCTYPE(
    c_int, c_void_p, POINTER(c_uint8), c_size_t, POINTER(c_void_p), POINTER(c_uint64)
)
DestroyFn = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p)
DestroyErrorFn = ctypes.CFUNCTYPE(None, c_void_p, c_int)
LoadFn = ctypes.CFUNCTYPE(
    c_int, c_void_p, POINTER(c_uint8), c_size_t, POINTER(c_void_p), POINTER(c_uint64)
)
LogFn = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)
SerializeFn = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, POINTER(c_uint8), POINTER(c_size_t))


class Buffer(Structure):
    _fields_ = [
        ("data", POINTER(c_uint8)),
        ("len", c_size_t),
        ("build_time_ns", c_uint64),
        ("owner", c_void_p),
    ]


class CacheOptions(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_entries", c_uint64),
        ("max_weight", c_uint64),
        ("invalidated_by_clear", c_bool),
        ("destroy", DestroyFn),
        ("destroy_ctx", c_void_p),
        ("on_destroy_error", DestroyErrorFn),
        ("on_destroy_error_ctx", c_void_p),
    ]


_CACHE_COUNTERS = [
    "hits",
    "misses",
    "builds",
    "build_failures",
    "waits",
    "discarded",
    "capacity_evictions",
    "device_evictions",
    "clears",
    "destroys",
    "destroy_errors",
    "entries",
    "weight",
    "leases",
]


class CacheStatistics(Structure):
    _fields_ = [("struct_size", c_size_t)] + [(name, c_uint64) for name in _CACHE_COUNTERS]


# kc_persistence_options: the disk tier's fields, then the remote tier's.
class DiskOptions(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("dir", c_char_p),
        ("max_size", c_uint64),
        ("max_files", c_uint64),
        ("key", c_char_p),
        ("key_len", c_size_t),
        ("relaxed_durability", c_bool),
        ("ignore_env", c_bool),
        ("require_key", c_bool),
        ("lock_timeout_ms", c_uint64),
        ("lock_liveness_ms", c_uint64),

    ("remote_url", c_char_p),
    ("remote_read_only", c_bool),
    ("remote_allow_unkeyed", c_bool),
    ("remote_timeout_ms", c_uint64),
    ("remote_ttl_s", c_uint64),
    ("remote_prefix", c_char_p),
    ("remote_max_entry_size", c_uint64),
    ("remote_lease_wait_ms", c_uint64),
    ("remote_ca_file", c_char_p),
    ("remote_cert_file", c_char_p),
        ("remote_key_file", c_char_p),
    ]


class DiskStatistics(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("puts", c_uint64),
        ("bytes_read", c_uint64),
        ("bytes_written", c_uint64),
        ("integrity_rejects", c_uint64),
        ("io_errors", c_uint64),
        ("evictions", c_uint64),
        ("removes", c_uint64),
        ("load_failures", c_uint64),
        ("entries", c_uint64),
        ("bytes", c_uint64),
        ("scan_complete", c_bool),
        ("lock_waits", c_uint64),
        ("lock_timeouts", c_uint64),
        ("lock_takeovers", c_uint64),
        ("pending_writes", c_uint64),
        ("failed_writes", c_uint64),
        ("remote", c_bool),
        ("remote_hits", c_uint64),
        ("remote_misses", c_uint64),
        ("remote_rejects", c_uint64),
        ("remote_errors", c_uint64),
        ("remote_timeouts", c_uint64),
        ("remote_skipped", c_uint64),
        ("remote_breaker_trips", c_uint64),
        ("remote_breaker_open", c_bool),
        ("remote_leases", c_uint64),
        ("remote_lease_waits", c_uint64),
        ("remote_lease_timeouts", c_uint64),
        ("remote_puts", c_uint64),
        ("remote_bytes_read", c_uint64),
        ("remote_bytes_written", c_uint64),
        # New in 3.1: the object store's counters.
        ("s3", c_bool),
        ("s3_breaker_open", c_bool),
        ("s3_hits", c_uint64),
        ("s3_misses", c_uint64),
        ("s3_rejects", c_uint64),
        ("s3_errors", c_uint64),
        ("s3_timeouts", c_uint64),
        ("s3_skipped", c_uint64),
        ("s3_breaker_trips", c_uint64),
        ("s3_leases", c_uint64),
        ("s3_lease_waits", c_uint64),
        ("s3_lease_timeouts", c_uint64),
        ("s3_puts", c_uint64),
        ("s3_bytes_read", c_uint64),
        ("s3_bytes_written", c_uint64),
    ]


class DiskGcReport(Structure):
    _fields_ = [("struct_size", c_size_t)] + [
        (name, c_uint64)
        for name in (
            "temp_files",
            "stale_schema",
            "stale_fingerprint",
            "corrupt",
            "kept",
            "bytes_freed",
            "undeletable",
            "lock_files",
            "old_format",
        )
    ]


class EntryDescriptor(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_char_p),
        ("device", c_char_p),
        ("name", c_char_p),
    ]


class TieredCallbacks(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("build", BuildFn),
        ("load", LoadFn),
        ("serialize", SerializeFn),
        ("ctx", c_void_p),
    ]


class OpenclOptions(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_entries", c_uint64),
        ("max_weight", c_uint64),
    ]


class OpenclCacheStatistics(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("memory", CacheStatistics),
        ("source_builds", c_uint64),
        ("binary_loads", c_uint64),
        ("binaries_rejected", c_uint64),
        ("disk_hits", c_uint64),
        ("disk_misses", c_uint64),
        ("disk_errors", c_uint64),
        ("passed_through", c_uint64),
    ]


def _find_library() -> str:
    # An explicit path wins (a build tree, an installed copy); else the copy this package
    # was built with, next to this file.
    explicit = os.environ.get("KCACHE_PYTHON_LIBRARY")
    if explicit:
        return explicit
    return str(Path(__file__).with_name("libkcache.so"))


lib = ctypes.CDLL(_find_library())

_P = POINTER
_status = c_int
_PROTOTYPES: dict[str, tuple[object, list[object]]] = {
    # library
    "kc_version": (c_char_p, []),
    "kc_status_name": (c_char_p, [c_int]),
    "kc_last_error_message": (c_char_p, []),
    "kc_last_build_error": (c_int, []),
    "kc_hit_rate": (c_double, [c_uint64, c_uint64]),
    "kc_buffer_free": (None, [_P(Buffer)]),
    "kc_set_log_callback": (None, [LogFn, c_void_p]),
    "kc_metrics_render": (_status, [c_char_p, c_size_t, _P(c_size_t)]),
    # memory tier
    "kc_cache_options_default": (CacheOptions, []),
    "kc_cache_new": (_status, [_P(CacheOptions), _P(c_void_p)]),
    "kc_cache_free": (None, [c_void_p]),
    "kc_cache_find_or_build": (
        _status,
        [c_void_p, c_char_p, c_size_t, c_int64, BuildFn, c_void_p, _P(c_void_p)],
    ),
    "kc_cache_get": (_status, [c_void_p, c_char_p, c_size_t, _P(c_void_p)]),
    "kc_cache_remove": (_status, [c_void_p, c_char_p, c_size_t]),
    "kc_cache_evict_device": (_status, [c_void_p, c_int64]),
    "kc_cache_clear": (_status, [c_void_p]),
    "kc_cache_len": (c_size_t, [c_void_p]),
    "kc_cache_stats": (_status, [c_void_p, _P(CacheStatistics)]),
    "kc_cache_reset_stats": (_status, [c_void_p]),
    "kc_lease_value": (c_void_p, [c_void_p]),
    "kc_lease_weight": (c_uint64, [c_void_p]),
    "kc_lease_clone": (c_void_p, [c_void_p]),
    "kc_lease_release": (None, [c_void_p]),
    # disk tier
    "kc_persistence_options_default": (DiskOptions, []),
    "kc_persistence_open": (_status, [_P(DiskOptions), _P(c_void_p)]),
    "kc_persistence_none": (c_void_p, []),
    "kc_persistence_free": (None, [c_void_p]),
    "kc_persistence_put_described": (
        _status,
        [c_void_p, c_char_p, c_char_p, c_size_t, c_uint64, _P(EntryDescriptor)],
    ),
    "kc_persistence_get": (_status, [c_void_p, c_char_p, _P(Buffer)]),
    "kc_persistence_remove": (_status, [c_void_p, c_char_p]),
    "kc_persistence_gc": (_status, [c_void_p, c_char_p, c_size_t, c_uint64, _P(DiskGcReport)]),
    "kc_persistence_stats": (_status, [c_void_p, _P(DiskStatistics)]),
    "kc_persistence_reset_stats": (_status, [c_void_p]),
    "kc_persistence_fingerprint": (_status, [c_void_p, _P(c_uint8)]),
    "kc_persistence_flush": (_status, [c_void_p]),
    "kc_persistence_wait_scan": (_status, [c_void_p]),
    # keys
    "kc_key_builder_new": (_status, [_P(c_void_p)]),
    "kc_key_builder_set": (_status, [c_void_p, c_uint32, c_char_p, c_size_t]),
    "kc_key_builder_option": (_status, [c_void_p, c_char_p, c_size_t, c_char_p, c_size_t]),
    "kc_key_builder_extra": (_status, [c_void_p, c_char_p, c_size_t, c_char_p, c_size_t]),
    "kc_key_builder_ordered_option": (_status, [c_void_p, c_char_p, c_size_t]),
    "kc_key_builder_dependency": (
        _status,
        [c_void_p, c_char_p, c_size_t, c_char_p, c_size_t],
    ),
    "kc_key_builder_finish": (_status, [c_void_p, _P(c_uint8)]),
    "kc_key_builder_free": (None, [c_void_p]),
    # tiered lookup
    "kc_tiered_find_or_build_described": (
        _status,
        [
            c_void_p,
            c_char_p,
            c_size_t,
            c_int64,
            c_void_p,
            c_char_p,
            _P(TieredCallbacks),
            _P(EntryDescriptor),
            _P(c_void_p),
        ],
    ),
    # OpenCL
    "kc_opencl_available": (_status, []),
    "kc_opencl_options_default": (OpenclOptions, []),
    "kc_opencl_cache_new": (_status, [_P(OpenclOptions), c_void_p, _P(c_void_p)]),
    "kc_opencl_cache_free": (None, [c_void_p]),
    "kc_opencl_cache_find_or_build_program": (
        _status,
        [
            c_void_p,
            c_void_p,
            c_size_t,
            _P(c_void_p),
            _P(c_char_p),
            _P(c_size_t),
            c_size_t,
            c_char_p,
            _P(c_void_p),
            _P(Buffer),
        ],
    ),
    "kc_opencl_cache_evict_context": (_status, [c_void_p, c_void_p, _P(c_size_t)]),
    "kc_opencl_cache_evict_device": (_status, [c_void_p, c_void_p, _P(c_size_t)]),
    "kc_opencl_cache_clear": (_status, [c_void_p]),
    "kc_opencl_cache_flush": (_status, [c_void_p]),
    "kc_opencl_cache_stats": (_status, [c_void_p, _P(OpenclCacheStatistics)]),
    "kc_opencl_cache_reset_stats": (_status, [c_void_p]),
}

for _name, (_restype, _argtypes) in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes
