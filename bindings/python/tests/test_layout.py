"""The ctypes structs against include/kcache.h: same fields, same order, same sizes."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from kcache import _lib

HEADER = Path(__file__).resolve().parents[3] / "include" / "kcache.h"

STRUCTS = {
    "kc_buffer": _lib.Buffer,
    "kc_cache_options": _lib.CacheOptions,
    "kc_cache_statistics": _lib.CacheStatistics,
    "kc_persistence_options": _lib.DiskOptions,
    "kc_persistence_statistics": _lib.DiskStatistics,
    "kc_persistence_gc_report": _lib.DiskGcReport,
    "kc_entry_descriptor": _lib.EntryDescriptor,
    "kc_tiered_callbacks": _lib.TieredCallbacks,
    "kc_opencl_options": _lib.OpenclOptions,
    "kc_opencl_cache_statistics": _lib.OpenclCacheStatistics,
}


def header_fields(name: str) -> list[str]:
    text = HEADER.read_text()
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
    assert body is not None, f"{name} not in the header"
    code = re.sub(r"//[^\n]*", "", body.group(1))
    return re.findall(r"(\w+)\s*(?:\[[^\]]*\])?;", code)


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_fields_match_the_header(name: str) -> None:
    assert [f[0] for f in STRUCTS[name]._fields_] == header_fields(name)


@pytest.mark.parametrize(
    "default, struct",
    [
        (_lib.lib.kc_cache_options_default, _lib.CacheOptions),
        (_lib.lib.kc_persistence_options_default, _lib.DiskOptions),
        (_lib.lib.kc_opencl_options_default, _lib.OpenclOptions),
    ],
)
def test_sizes_match_the_library(default: object, struct: type) -> None:
    assert default().struct_size == ctypes.sizeof(struct)  # type: ignore[operator]


def test_statistics_sizes_match_the_library(tmp_path: Path) -> None:
    import kcache

    cache = kcache.Cache[int]()
    out = _lib.CacheStatistics(struct_size=ctypes.sizeof(_lib.CacheStatistics))
    assert _lib.lib.kc_cache_stats(cache._handle(), ctypes.byref(out)) == 0
    assert out.struct_size == ctypes.sizeof(_lib.CacheStatistics)
    disk = kcache.Disk(tmp_path / "kc")
    dout = _lib.DiskStatistics(struct_size=ctypes.sizeof(_lib.DiskStatistics))
    assert _lib.lib.kc_persistence_stats(disk._handle(), ctypes.byref(dout)) == 0
    assert dout.struct_size == ctypes.sizeof(_lib.DiskStatistics)
