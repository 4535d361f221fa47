"""The disk tier, keys and the tiered lookup, across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_threads, wait_until

import kcache


def test_put_get_remove(tmp_path: Path) -> None:
    key = kcache.KeyBuilder(backend="test", source="payload").finish()
    with kcache.Disk(tmp_path / "kc") as disk:
        assert disk.get(key) is None
        disk.put(key, b"\x00binary\xff", 1234, backend="test", name="k")
        assert disk.get(key) == b"\x00binary\xff"
        assert disk.remove(key) is True
        assert disk.remove(key) is False
        stats = disk.stats()
        assert (stats.puts, stats.hits, stats.misses, stats.removes) == (1, 1, 1, 1)
        assert disk.fingerprint() == bytes(8)
        disk.wait_scan()
        assert disk.gc().kept == 0


def test_a_disk_key_is_32_bytes(tmp_path: Path) -> None:
    with kcache.Disk(tmp_path / "kc") as disk, pytest.raises(ValueError):
        disk.get(b"short")


def test_a_relative_directory_is_refused() -> None:
    with pytest.raises(kcache.InvalidArgumentError):
        kcache.Disk("relative/dir")


def test_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(kcache.UntrustedError):
        kcache.Disk(shared)


def test_keys_depend_on_every_input_but_not_on_option_order() -> None:
    def key(*options: str, source: str = "src") -> bytes:
        builder = kcache.KeyBuilder(backend="b", device_name="d", source=source)
        for option in options:
            builder.option(option)
        return builder.finish()

    assert len(key()) == kcache.KEY_LEN
    assert key("-a", "-b") == key("-b", "-a")
    assert key("-a") != key("-b")
    assert key(source="other") != key()
    ordered = kcache.KeyBuilder(backend="b").ordered_option("-DX").ordered_option("-UX")
    reversed_ = kcache.KeyBuilder(backend="b").ordered_option("-UX").ordered_option("-DX")
    assert ordered.finish() != reversed_.finish()
    with pytest.raises(kcache.InvalidArgumentError):
        kcache.KeyBuilder().option("-a").option("-a").finish()


TIERED = textwrap.dedent(
    """
    import json, sys
    import kcache

    builds = []
    def build(key):
        builds.append(key)
        return key.upper()

    cache = kcache.Cache()
    with kcache.Disk(sys.argv[1]) as disk:
        tiered = kcache.TieredCache(
            cache, disk, load=lambda data: data.decode(),
            serialize=lambda value: value.encode(), backend="pytest",
        )
        with tiered.find_or_build("kernel", build, name="kernel") as value:
            pass
        disk.flush()
        stats = disk.stats()
    memory = cache.stats()
    print(json.dumps({"value": value, "builds": len(builds), "disk_hits": stats.hits,
                      "puts": stats.puts, "memory": [memory.builds, memory.loads]}))
    """
)


def run_tiered(directory: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", TIERED, str(directory)],
        check=True, capture_output=True, text=True, env=dict(os.environ),
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_a_second_process_loads_from_disk(tmp_path: Path) -> None:
    first = run_tiered(tmp_path / "kc")
    second = run_tiered(tmp_path / "kc")
    # The memory tier's statistics say what happened: built, then loaded (not built).
    assert first == {
        "value": "KERNEL", "builds": 1, "disk_hits": 0, "puts": 1, "memory": [1, 0],
    }
    assert second == {
        "value": "KERNEL", "builds": 0, "disk_hits": 1, "puts": 0, "memory": [0, 1],
    }


def test_tiered_threads_build_once_and_a_bad_payload_is_rebuilt(tmp_path: Path) -> None:
    cache = kcache.Cache[str]()
    disk = kcache.Disk(tmp_path / "kc")
    builds: list[object] = []

    def build(key: object) -> str:
        wait_until(lambda: cache.stats().waits == 3, "all threads waiting")
        builds.append(key)
        return "v"

    def refuse(data: bytes) -> str:
        raise ValueError("not mine")

    tiered = kcache.TieredCache(cache, disk, load=refuse, serialize=str.encode)
    results = run_threads(4, lambda: tiered.find_or_build("k", build).value)
    assert results == ["v"] * 4 and len(builds) == 1
    disk.flush()
    cache.clear()
    builds_before = len(builds)
    with tiered.find_or_build("k", lambda k: "rebuilt") as value:
        assert value == "rebuilt"
    assert len(builds) == builds_before
    assert disk.stats().load_failures == 1


def test_a_serialize_exception_is_a_warning(tmp_path: Path) -> None:
    def serialize(value: str) -> bytes:
        raise TypeError("not serializable")

    disk = kcache.Disk(tmp_path / "kc")
    tiered = kcache.TieredCache(kcache.Cache[str](), disk, load=bytes.decode, serialize=serialize)
    with pytest.warns(RuntimeWarning, match="not serializable"):
        lease = tiered.find_or_build("k", lambda k: "v")
    assert lease.value == "v"
    disk.flush()
    assert disk.stats().puts == 0
