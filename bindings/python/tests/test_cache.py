"""The memory cache: single flight, exceptions, leases, eviction, statistics."""

from __future__ import annotations

import gc
import threading
import traceback
from collections.abc import Callable

import pytest
from conftest import run_each, run_threads, wait_until

import kcache

THREADS = 8


def constant(value: int) -> Callable[[object], int]:
    return lambda key: value


def test_a_hit_reuses_the_value_and_counts() -> None:
    builds: list[bytes] = []

    def build(key: object) -> str:
        builds.append(key)  # type: ignore[arg-type]
        return "kernel"

    with kcache.Cache[str](weigher=len) as cache:
        with cache.find_or_build(b"saxpy", build, device=0) as value:
            assert value == "kernel"
        lease = cache.find_or_build(b"saxpy", build)
        assert lease.value == "kernel"
        assert lease.weight == 6
        stats = cache.stats()
        assert builds == [b"saxpy"]
        assert (stats.hits, stats.misses, stats.builds) == (1, 1, 1)
        assert (stats.entries, stats.weight, stats.leases) == (1, 6, 1)
        assert stats.hit_rate == 0.5
        second = lease.clone()
        lease.release()
        lease.release()  # a second release does nothing
        assert cache.stats().leases == 1
        assert second.value == "kernel"
        second.release()
        with pytest.raises(ValueError):
            second.weight
        assert cache.stats().leases == 0
        assert len(cache) == 1


@pytest.mark.parametrize("key", [3, 3.5, None, ["k"]])
def test_a_key_that_is_not_bytes_or_str_is_a_type_error(key: object) -> None:
    cache = kcache.Cache[int]()
    with pytest.raises(TypeError, match="bytes or str"):
        cache.find_or_build(key, lambda k: 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.get(key)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        kcache.KeyBuilder().option(key)  # type: ignore[arg-type]
    # Nothing was built under any key, b"\0\0\0" included.
    assert (len(cache), cache.stats().misses) == (0, 0)


def test_str_and_bytes_keys_are_the_same_key() -> None:
    cache = kcache.Cache[int]()
    cache.find_or_build("añb", lambda k: 1).release()
    with cache.find_or_build("añb".encode(), lambda k: 2) as value:
        assert value == 1


def test_threads_on_one_key_share_one_build() -> None:
    cache = kcache.Cache[object]()
    built: list[object] = []

    def build(key: object) -> object:
        # Every other thread is waiting inside kcache: possible only if they released the GIL.
        wait_until(lambda: cache.stats().waits == THREADS - 1, "all threads waiting")
        value = object()
        built.append(value)
        return value

    def lookup() -> object:
        with cache.find_or_build("k", build) as value:
            return value

    results = run_threads(THREADS, lookup)
    assert len(built) == 1
    assert results == [built[0]] * THREADS
    stats = cache.stats()
    assert (stats.builds, stats.misses, stats.waits) == (1, 1, THREADS - 1)


class Boom(Exception):
    pass


def test_a_build_exception_reaches_the_builder_and_every_waiter() -> None:
    cache = kcache.Cache[int]()
    raised: list[Boom] = []

    def build(key: object) -> int:
        wait_until(lambda: cache.stats().waits == THREADS - 1, "all threads waiting")
        exc = Boom("no compiler")
        raised.append(exc)
        raise exc

    results = run_threads(THREADS, lambda: cache.find_or_build("k", build))
    assert len(raised) == 1
    # The builder raises the build's exception; each waiter a copy caused by it.
    assert sum(r is raised[0] for r in results) == 1
    for r in results:
        assert type(r) is Boom and r.args == ("no compiler",)
        assert r is raised[0] or r.__cause__ is raised[0]
        # One clean traceback per caller: its own call path once, not once per raise.
        frames = traceback.extract_tb(r.__traceback__)
        assert [f.name for f in frames].count("find_or_build") == 1
    stats = cache.stats()
    assert (stats.build_failures, stats.entries) == (1, 0)
    # The key is not poisoned: the next lookup builds again.
    with cache.find_or_build("k", lambda k: 7) as value:
        assert value == 7


def test_a_lease_keeps_an_evicted_value_alive() -> None:
    destroyed: list[str] = []
    cache = kcache.Cache[str](destroy=destroyed.append)
    lease = cache.find_or_build("a", lambda k: "A", device=3)
    cache.find_or_build("b", lambda k: "B", device=4).release()
    cache.evict_device(3)
    assert destroyed == [] and len(cache) == 1
    assert lease.value == "A"
    lease.release()
    assert destroyed == ["A"]
    cache.clear()
    assert destroyed == ["A", "B"]
    stats = cache.stats()
    assert (stats.device_evictions, stats.clears, stats.destroys) == (1, 1, 2)


def test_a_lease_outlives_its_cache() -> None:
    destroyed: list[str] = []
    cache = kcache.Cache[str](destroy=destroyed.append)
    lease = cache.find_or_build("a", lambda k: "A")
    cache.find_or_build("b", lambda k: "B").release()
    cache.close()
    assert destroyed == ["B"]
    with pytest.raises(ValueError):
        len(cache)
    assert lease.value == "A"
    del cache
    gc.collect()
    lease.release()
    assert destroyed == ["B", "A"]


def test_a_forgotten_lease_is_released_when_collected() -> None:
    cache = kcache.Cache[str]()
    cache.find_or_build("a", lambda k: "A")  # lease dropped at once
    gc.collect()
    assert cache.stats().leases == 0


def test_get_remove_and_capacity() -> None:
    destroyed: list[int] = []
    cache = kcache.Cache[int](max_entries=2, destroy=destroyed.append)
    assert cache.get("a") is None
    for i, key in enumerate("abc"):
        cache.find_or_build(key, constant(i)).release()
    assert len(cache) == 2
    assert cache.stats().capacity_evictions == 1
    assert len(destroyed) == 1
    kept = [k for k in "abc" if cache.get(k) is not None]
    gc.collect()
    assert len(kept) == 2
    assert cache.remove(kept[0]) is True
    assert cache.remove(kept[0]) is False
    assert len(cache) == 1


def test_an_eviction_during_the_build_discards_the_value() -> None:
    destroyed: list[str] = []
    cache = kcache.Cache[str](destroy=destroyed.append)

    def build(key: object) -> str:
        cache.evict_device(1)
        return "stale"

    with pytest.raises(kcache.DeviceDestroyedError) as info:
        cache.find_or_build("k", build, device=1)
    assert info.value.status_name == "KC_ERR_DEVICE_DESTROYED"
    assert destroyed == ["stale"]
    assert cache.stats().discarded == 1


def test_a_lookup_without_a_device_never_inherits_another_callers_eviction() -> None:
    destroyed: list[str] = []
    cache = kcache.Cache[str](destroy=destroyed.append)
    building = threading.Event()

    def build_for_device_3(key: object) -> str:
        building.set()
        # The other lookup joins this build; then device 3 goes while it is in flight.
        wait_until(lambda: cache.stats().waits == 1, "the other lookup waiting")
        cache.evict_device(3)
        return "for device 3"

    def lookup_for_device_3() -> object:
        with cache.find_or_build("k", build_for_device_3, device=3) as value:
            return value

    def lookup_without_device() -> object:
        building.wait()
        with cache.find_or_build("k", lambda k: "its own") as value:
            return value

    results = run_each([lookup_for_device_3, lookup_without_device])
    assert isinstance(results[0], kcache.DeviceDestroyedError)
    # The eviction was not of anything the second lookup named: it builds for itself.
    assert results[1] == "its own"
    assert destroyed == ["for device 3"]
    stats = cache.stats()
    assert (stats.discarded, stats.waits, stats.misses, stats.entries) == (1, 0, 2, 1)


def test_a_clear_during_the_build_of_an_invalidated_cache() -> None:
    cache = kcache.Cache[str](invalidated_by_clear=True)

    def build(key: object) -> str:
        cache.clear()
        return "stale"

    with pytest.raises(kcache.CacheClearedError):
        cache.find_or_build("k", build)


def test_a_build_asking_for_its_own_key_is_an_error() -> None:
    cache = kcache.Cache[int]()
    inner: list[int] = []

    def build(key: object) -> int:
        with cache.find_or_build("other", lambda k: 2) as other:  # another key is fine
            inner.append(other)
        cache.find_or_build("k", lambda k: 1)
        return 0

    with pytest.raises(kcache.ReentrantError):
        cache.find_or_build("k", build)
    assert inner == [2]


def test_a_failing_destroy_is_reported_with_its_exception() -> None:
    def destroy(value: str) -> None:
        raise OSError(f"cannot unload {value}")

    cache = kcache.Cache[str](destroy=destroy)
    cache.find_or_build("a", lambda k: "A").release()
    with pytest.raises(kcache.DestroyFailedError) as info:
        cache.clear()
    assert isinstance(info.value.__cause__, OSError)
    assert cache.stats().destroy_errors == 1


def test_a_destroy_failing_at_a_release_is_counted_not_raised() -> None:
    def destroy(value: str) -> None:
        if value == "A":
            raise OSError("cannot unload A")

    cache = kcache.Cache[str](destroy=destroy)
    lease = cache.find_or_build("a", lambda k: "A")
    cache.find_or_build("b", lambda k: "B").release()
    assert cache.remove("a") is True
    lease.release()  # destroys A here: the failure has no caller to reach
    assert cache.stats().destroy_errors == 1
    cache.clear()  # destroys B, which succeeds: the earlier failure is not raised here
    assert cache.stats().destroys == 2


def test_reset_stats_keeps_the_gauges() -> None:
    cache = kcache.Cache[int]()
    lease = cache.find_or_build("a", lambda k: 1)
    cache.reset_stats()
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.builds) == (0, 0, 0)
    assert (stats.entries, stats.leases) == (1, 1)
    assert stats.hit_rate is None
    lease.release()


def test_an_invalid_device_is_a_value_error() -> None:
    cache = kcache.Cache[int]()
    with pytest.raises(ValueError):
        cache.find_or_build("a", lambda k: 1, device=-5)
