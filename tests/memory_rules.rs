//! The L1 contract, rule by rule, with deterministic interleavings (builds parked on barriers).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use kcache::memory::{Eviction, MemoryCache, Options};
use kcache::{BuildError, DestroyError, Error};

/// Records every destroyed value, and can be told to fail for some.
#[derive(Default)]
struct Ledger {
    destroyed: Mutex<Vec<u64>>,
    fail_on: Mutex<Vec<u64>>,
}

impl Ledger {
    fn destroyed(&self) -> Vec<u64> {
        let mut d = self.destroyed.lock().unwrap().clone();
        d.sort_unstable();
        d
    }
}

fn cache_with(options: Options) -> (Arc<MemoryCache<String, u64>>, Arc<Ledger>) {
    let ledger = Arc::new(Ledger::default());
    let l = Arc::clone(&ledger);
    let cache = MemoryCache::new(options, move |v: u64| {
        l.destroyed.lock().unwrap().push(v);
        if l.fail_on.lock().unwrap().contains(&v) {
            Err(DestroyError::new(7, format!("cannot destroy {v}")))
        } else {
            Ok(())
        }
    });
    (Arc::new(cache), ledger)
}

fn cache() -> (Arc<MemoryCache<String, u64>>, Arc<Ledger>) {
    cache_with(Options::default())
}

/// A cache of at most `max_entries` entries, evicting by `eviction`.
fn capped(max_entries: u64, eviction: Eviction) -> (Arc<MemoryCache<String, u64>>, Arc<Ledger>) {
    cache_with(Options {
        max_entries: Some(max_entries),
        eviction,
        ..Options::default()
    })
}

fn ok(v: u64) -> impl FnOnce() -> Result<(u64, u64), BuildError> {
    move || Ok((v, 1))
}

/// Two barriers a build parks on: the test thread learns that the build has started, and says
/// when it may finish.
#[derive(Clone)]
struct Park {
    started: Arc<Barrier>,
    release: Arc<Barrier>,
}

impl Park {
    fn new() -> Self {
        Self {
            started: Arc::new(Barrier::new(2)),
            release: Arc::new(Barrier::new(2)),
        }
    }

    /// Called by the build: meets the test thread at `started`, then at `release`.
    fn hold(&self) {
        self.started.wait();
        self.release.wait();
    }

    /// Looks "k" up for `device` on a thread of its own; on a miss the build parks, then returns
    /// what `build` returns.
    fn spawn_build(
        &self,
        c: &Arc<MemoryCache<String, u64>>,
        device: Option<i64>,
        build: impl FnOnce() -> Result<(u64, u64), BuildError> + Send + 'static,
    ) -> thread::JoinHandle<Result<u64, Error>> {
        let (c, park) = (c.clone(), self.clone());
        thread::spawn(move || {
            c.find_or_build("k", device, || {
                park.hold();
                build()
            })
            .map(|l| *l)
        })
    }
}

/// Looks "k" up for `device` on a thread of its own, building 1 on a miss.
fn spawn_waiter(
    c: &Arc<MemoryCache<String, u64>>,
    device: Option<i64>,
) -> thread::JoinHandle<Result<u64, Error>> {
    let c = c.clone();
    thread::spawn(move || c.find_or_build("k", device, ok(1)).map(|l| *l))
}

/// Returns once `waits` lookups in all have waited for a build in flight.
fn until_waits(c: &MemoryCache<String, u64>, waits: u64) {
    while c.stats().waits < waits {
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn hit_after_miss_runs_one_build() {
    let (c, _) = cache();
    let builds = AtomicUsize::new(0);
    for _ in 0..3 {
        let lease = c
            .find_or_build("k", None, || {
                builds.fetch_add(1, Ordering::SeqCst);
                Ok((42, 10))
            })
            .unwrap();
        assert_eq!(*lease, 42);
        assert_eq!(lease.weight(), 10);
        assert_eq!(lease.key(), "k");
    }
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    let s = c.stats();
    assert_eq!(
        (s.hits, s.misses, s.builds, s.entries, s.weight),
        (2, 1, 1, 1, 10)
    );
    assert_eq!(s.leases, 0);
    assert_eq!(c.len(), 1);
}

#[test]
fn build_error_is_returned_and_not_cached() {
    let (c, _) = cache();
    let err = c
        .find_or_build("k", None, || Err(BuildError::new(3, "syntax error")))
        .unwrap_err();
    assert_eq!(err, Error::Build(BuildError::new(3, "syntax error")));
    assert_eq!(c.len(), 0);
    assert_eq!(*c.find_or_build("k", None, ok(5)).unwrap(), 5);
    let s = c.stats();
    assert_eq!((s.build_failures, s.builds, s.misses), (1, 1, 2));
}

#[test]
fn single_flight_shares_value_between_waiters() {
    let (c, _) = cache();
    let builds = Arc::new(AtomicUsize::new(0));
    let park = Park::new();
    let builder = {
        let builds = builds.clone();
        park.spawn_build(&c, None, move || {
            builds.fetch_add(1, Ordering::SeqCst);
            Ok((9, 1))
        })
    };
    park.started.wait();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (c, builds) = (c.clone(), builds.clone());
            thread::spawn(move || {
                *c.find_or_build("k", None, || {
                    builds.fetch_add(1, Ordering::SeqCst);
                    Ok((100, 1))
                })
                .unwrap()
            })
        })
        .collect();
    until_waits(&c, 4);
    park.release.wait();
    assert_eq!(builder.join().unwrap(), Ok(9));
    for w in waiters {
        assert_eq!(w.join().unwrap(), 9);
    }
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    let s = c.stats();
    assert_eq!((s.builds, s.waits, s.misses), (1, 4, 1));
}

#[test]
fn single_flight_shares_the_error() {
    let (c, _) = cache();
    let park = Park::new();
    let builder = park.spawn_build(&c, None, || Err(BuildError::new(-11, "log")));
    park.started.wait();
    let waiter = spawn_waiter(&c, None);
    until_waits(&c, 1);
    park.release.wait();
    let expected = Error::Build(BuildError::new(-11, "log"));
    assert_eq!(builder.join().unwrap().unwrap_err(), expected);
    assert_eq!(waiter.join().unwrap().unwrap_err(), expected);
    assert_eq!(c.stats().build_failures, 1);
}

#[test]
fn panicking_builder_frees_waiters_and_key() {
    let (c, _) = cache();
    let park = Park::new();
    let builder = park.spawn_build(&c, None, || -> Result<(u64, u64), BuildError> {
        panic!("compiler crashed")
    });
    park.started.wait();
    let waiter = spawn_waiter(&c, None);
    until_waits(&c, 1);
    park.release.wait();
    assert!(
        builder.join().is_err(),
        "the panic continues in the builder's thread"
    );
    assert_eq!(waiter.join().unwrap(), Err(Error::BuildPanicked));
    assert_eq!(*c.find_or_build("k", None, ok(2)).unwrap(), 2);
    assert_eq!(c.stats().build_failures, 1);
}

/// Parks a build for `device` on barriers, runs `during` while it is parked, and returns what
/// the build's caller and one waiter for the same device got.
fn straddle(
    c: &Arc<MemoryCache<String, u64>>,
    device: Option<i64>,
    during: impl FnOnce(),
) -> (Result<u64, Error>, Result<u64, Error>) {
    shared_build(c, device, device, during)
}

#[test]
fn evict_during_build_discards_it() {
    let (c, ledger) = cache();
    let (built, waited) = straddle(&c, Some(3), || {
        assert_eq!(c.evict_device(3), Ok(0));
    });
    assert_eq!(built, Err(Error::DeviceDestroyed(3)));
    assert_eq!(waited, Err(Error::DeviceDestroyed(3)));
    assert_eq!(ledger.destroyed(), vec![77]);
    assert_eq!(c.len(), 0);
    let s = c.stats();
    assert_eq!((s.discarded, s.destroys, s.builds), (1, 1, 1));
    assert_eq!(
        *c.find_or_build("k", Some(3), ok(8)).unwrap(),
        8,
        "a later lookup rebuilds"
    );
}

#[test]
fn evict_of_another_device_does_not_discard() {
    let (c, ledger) = cache();
    let (built, _) = straddle(&c, Some(3), || {
        c.evict_device(4).unwrap();
    });
    assert_eq!(built, Ok(77));
    assert!(ledger.destroyed().is_empty());
    assert_eq!(c.len(), 1);
}

#[test]
fn clear_during_build_installs_on_owning_cache() {
    let (c, ledger) = cache();
    let (built, waited) = straddle(&c, None, || {
        c.clear().unwrap();
    });
    assert_eq!((built, waited), (Ok(77), Ok(77)));
    assert!(ledger.destroyed().is_empty());
    assert_eq!(c.len(), 1);
}

#[test]
fn clear_during_build_discards_on_borrowing_cache() {
    let (c, ledger) = cache_with(Options {
        invalidated_by_clear: true,
        ..Options::default()
    });
    let (built, waited) = straddle(&c, None, || {
        c.clear().unwrap();
    });
    assert_eq!(built, Err(Error::CacheCleared));
    assert_eq!(waited, Err(Error::CacheCleared));
    assert_eq!(ledger.destroyed(), vec![77]);
    assert_eq!(c.len(), 0);
    assert_eq!(c.stats().discarded, 1);
}

#[test]
fn discard_destroy_error_is_counted_not_returned() {
    let (c, ledger) = cache();
    ledger.fail_on.lock().unwrap().push(77);
    let (built, _) = straddle(&c, Some(1), || {
        c.evict_device(1).unwrap();
    });
    assert_eq!(built, Err(Error::DeviceDestroyed(1)));
    assert_eq!(c.stats().destroy_errors, 1);
}

#[test]
fn evict_device_bumps_epoch_and_unlinks_only_that_device() {
    let (c, ledger) = cache();
    c.find_or_build("a", Some(1), ok(1)).unwrap();
    c.find_or_build("b", Some(2), ok(2)).unwrap();
    c.find_or_build("c", None, ok(3)).unwrap();
    assert_eq!(c.evict_device(1), Ok(1));
    assert_eq!(ledger.destroyed(), vec![1]);
    assert_eq!(c.len(), 2);
    assert_eq!(c.stats().device_evictions, 1);
    assert_eq!(c.evict_device(9), Ok(0));
}

#[test]
fn evict_devices_unlinks_every_listed_device_and_returns_the_first_error() {
    let (c, ledger) = cache();
    let entries = [("a", 1, Some(1)), ("b", 2, Some(2)), ("c", 3, Some(3))];
    for (key, value, device) in entries
        .into_iter()
        .chain([("d", 4, Some(1)), ("e", 5, None)])
    {
        c.find_or_build(key, device, ok(value)).unwrap();
    }
    ledger.fail_on.lock().unwrap().extend([1, 3]);
    let evicted = c.evict_devices([3, 1, 9, 1]);
    assert!(
        matches!(&evicted, Err(Error::Destroy(e)) if e.code == 7),
        "{evicted:?}"
    );
    assert_eq!(ledger.destroyed(), vec![1, 3, 4], "every victim attempted");
    assert_eq!(c.len(), 2);
    let s = c.stats();
    assert_eq!(
        (s.device_evictions, s.destroys, s.destroy_errors),
        (3, 3, 2)
    );
    assert_eq!(c.evict_devices([2]), Ok(1));
    assert_eq!(c.evict_devices(Vec::new()), Ok(0));
    assert_eq!(c.len(), 1);
}

#[test]
fn evict_devices_discards_builds_in_flight_for_any_listed_device() {
    let (c, ledger) = cache();
    let (built, waited) = straddle(&c, Some(3), || {
        assert_eq!(c.evict_devices([2, 3]), Ok(0));
    });
    assert_eq!(built, Err(Error::DeviceDestroyed(3)));
    assert_eq!(waited, Err(Error::DeviceDestroyed(3)));
    assert_eq!(ledger.destroyed(), vec![77]);
    assert_eq!(c.stats().discarded, 1);
    let (built, _) = straddle(&c, Some(3), || {
        c.evict_devices([2, 4]).unwrap();
    });
    assert_eq!(built, Ok(77), "other devices' evictions leave it alone");
}

#[test]
fn clear_waits_for_leases_before_destroying() {
    let (c, ledger) = cache();
    let lease = c.find_or_build("k", None, ok(5)).unwrap();
    c.find_or_build("other", None, ok(6)).unwrap();
    assert_eq!(c.clear(), Ok(2));
    assert_eq!(
        ledger.destroyed(),
        vec![6],
        "the leased value survives the clear"
    );
    assert_eq!(c.len(), 0);
    assert_eq!(*lease, 5);
    assert_eq!(c.stats().leases, 1);
    let second = lease.clone();
    drop(lease);
    assert_eq!(ledger.destroyed(), vec![6]);
    drop(second);
    assert_eq!(ledger.destroyed(), vec![5, 6]);
    assert_eq!(c.stats().leases, 0);
}

#[test]
fn last_lease_destroys_on_the_releasing_thread() {
    let where_destroyed = Arc::new(Mutex::new(None));
    let w = Arc::clone(&where_destroyed);
    let c2: MemoryCache<String, u64> = MemoryCache::new(Options::default(), move |_| {
        *w.lock().unwrap() = Some(thread::current().id());
        Ok(())
    });
    let lease = c2.find_or_build("k", None, ok(1)).unwrap();
    c2.clear().unwrap();
    let releaser = thread::spawn(move || {
        drop(lease);
        thread::current().id()
    })
    .join()
    .unwrap();
    assert_eq!(*where_destroyed.lock().unwrap(), Some(releaser));
}

#[test]
fn released_cached_entry_is_not_destroyed() {
    let (c, ledger) = cache();
    drop(c.find_or_build("k", None, ok(5)).unwrap());
    drop(c.get("k").unwrap());
    assert!(ledger.destroyed().is_empty());
    assert_eq!(c.len(), 1);
}

#[test]
fn dropping_the_cache_defers_leased_values() {
    let (c, ledger) = cache();
    let lease = c.find_or_build("k", None, ok(1)).unwrap();
    c.find_or_build("j", None, ok(2)).unwrap();
    drop(c);
    assert_eq!(ledger.destroyed(), vec![2]);
    assert_eq!(*lease, 1);
    drop(lease);
    assert_eq!(ledger.destroyed(), vec![1, 2]);
}

#[test]
fn clear_attempts_every_victim_and_returns_first_error() {
    let (c, ledger) = cache();
    for (k, v) in [("a", 1), ("b", 2), ("c", 3), ("d", 4)] {
        c.find_or_build(k, None, ok(v)).unwrap();
    }
    ledger.fail_on.lock().unwrap().push(3);
    let err = c.clear().unwrap_err();
    assert_eq!(
        err,
        Error::Destroy(DestroyError::new(7, "cannot destroy 3"))
    );
    assert_eq!(ledger.destroyed(), vec![1, 2, 3, 4]);
    assert!(c.is_empty());
    let s = c.stats();
    assert_eq!((s.destroys, s.destroy_errors, s.clears), (4, 1, 1));
}

#[test]
fn deferred_destroy_error_goes_to_the_hook() {
    let reported = Arc::new(Mutex::new(Vec::new()));
    let r = Arc::clone(&reported);
    let (c, ledger) = cache_with(Options {
        on_destroy_error: Some(Arc::new(move |e: &DestroyError| {
            r.lock().unwrap().push(e.code)
        })),
        ..Options::default()
    });
    ledger.fail_on.lock().unwrap().push(1);
    let lease = c.find_or_build("k", None, ok(1)).unwrap();
    assert_eq!(
        c.clear(),
        Ok(1),
        "nothing destroyed yet, nothing failed yet"
    );
    drop(lease);
    assert_eq!(*reported.lock().unwrap(), vec![7]);
    assert_eq!(c.stats().destroy_errors, 1);
}

#[test]
fn destroy_may_reenter_the_cache() {
    type Slot = Mutex<Option<Arc<MemoryCache<String, u64>>>>;
    let slot: Arc<Slot> = Arc::new(Mutex::new(None));
    let seen = Arc::new(AtomicU64::new(0));
    let (s, n) = (Arc::clone(&slot), Arc::clone(&seen));
    let c = Arc::new(MemoryCache::new(Options::default(), move |v: u64| {
        if let Some(c) = s.lock().unwrap().as_ref() {
            // Re-entry from the destroy callback: lookups and builds both work.
            n.store(c.len() as u64 * 100 + v, Ordering::SeqCst);
            c.find_or_build("from-destroy", None, || Ok((0, 1)))
                .unwrap();
        }
        Ok(())
    }));
    *slot.lock().unwrap() = Some(Arc::clone(&c));
    c.find_or_build("k", None, ok(5)).unwrap();
    c.remove("k").unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 5);
    assert!(c.get("from-destroy").is_some());
    slot.lock().unwrap().take();
}

#[test]
fn reentrant_build_of_same_key_is_an_error() {
    let (c, _) = cache();
    let inner = Mutex::new(None);
    let outer = c
        .find_or_build("k", None, || {
            *inner.lock().unwrap() = Some(c.find_or_build("k", None, ok(2)).map(|l| *l));
            let other = c.find_or_build("other", None, ok(3)).unwrap();
            Ok((*other + 10, 1))
        })
        .unwrap();
    assert_eq!(*outer, 13);
    assert_eq!(inner.into_inner().unwrap(), Some(Err(Error::Reentrant)));
    assert_eq!(c.len(), 2);
}

#[test]
fn get_and_remove() {
    let (c, ledger) = cache();
    assert!(c.get("k").is_none());
    c.find_or_build("k", None, ok(4)).unwrap();
    assert_eq!(*c.get("k").unwrap(), 4);
    assert_eq!(c.remove("k"), Ok(true));
    assert_eq!(c.remove("k"), Ok(false));
    assert!(c.get("k").is_none());
    assert_eq!(ledger.destroyed(), vec![4]);
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (1, 3));
}

#[test]
fn remove_returns_destroy_error() {
    let (c, ledger) = cache();
    ledger.fail_on.lock().unwrap().push(4);
    c.find_or_build("k", None, ok(4)).unwrap();
    assert_eq!(
        c.remove("k"),
        Err(Error::Destroy(DestroyError::new(7, "cannot destroy 4")))
    );
    assert!(c.is_empty());
}

#[test]
fn entry_cap_evicts_least_recently_used() {
    // Plain CLOCK: under cost-aware eviction a build preempted for over a millisecond would
    // earn its entry an extra chance and change the order this test checks.
    let (c, ledger) = capped(2, Eviction::Clock);
    c.find_or_build("a", None, ok(1)).unwrap();
    c.find_or_build("b", None, ok(2)).unwrap();
    c.get("a").unwrap();
    c.find_or_build("c", None, ok(3)).unwrap();
    assert_eq!(
        ledger.destroyed(),
        vec![2],
        "b was not used since a was hit"
    );
    assert!(c.get("a").is_some() && c.get("c").is_some());
    assert_eq!(c.len(), 2);
    assert_eq!(c.stats().capacity_evictions, 1);
}

#[test]
fn weight_cap_evicts_until_under_and_admits_oversized_alone() {
    // Plain CLOCK, for the same reason as above.
    let (c, ledger) = cache_with(Options {
        max_weight: Some(100),
        eviction: Eviction::Clock,
        ..Options::default()
    });
    c.find_or_build("a", None, || Ok((1, 40))).unwrap();
    c.find_or_build("b", None, || Ok((2, 40))).unwrap();
    c.find_or_build("c", None, || Ok((3, 40))).unwrap();
    assert_eq!(ledger.destroyed(), vec![1]);
    assert_eq!(c.stats().weight, 80);
    let big = c.find_or_build("huge", None, || Ok((4, 500))).unwrap();
    assert_eq!(*big, 4);
    assert_eq!(ledger.destroyed(), vec![1, 2, 3]);
    assert_eq!(c.len(), 1);
    assert_eq!(c.stats().weight, 500);
}

#[test]
fn capacity_eviction_of_leased_entry_defers_destroy() {
    let (c, ledger) = capped(1, Eviction::CostAware);
    let a = c.find_or_build("a", None, ok(1)).unwrap();
    c.find_or_build("b", None, ok(2)).unwrap();
    assert!(c.get("a").is_none());
    assert!(ledger.destroyed().is_empty());
    drop(a);
    assert_eq!(ledger.destroyed(), vec![1]);
}

#[test]
fn hits_are_counted_exactly_across_threads_that_exit() {
    let (c, _) = cache();
    c.find_or_build("k", None, ok(1)).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            thread::spawn(move || {
                for _ in 0..1_000 {
                    assert_eq!(*c.find_or_build("k", None, ok(2)).unwrap(), 1);
                }
                assert!(c.get("absent").is_none());
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (4_000, 1 + 4));
    // A second cache on the same threads keeps its own counts.
    let (other, _) = cache();
    other.find_or_build("k", None, ok(1)).unwrap();
    assert_eq!(other.stats().misses, 1);
    assert_eq!(c.stats().misses, 5);
}

/// A build that takes at least `ms` milliseconds (sleep never returns early).
fn slow(v: u64, ms: u64) -> impl FnOnce() -> Result<(u64, u64), BuildError> {
    move || {
        thread::sleep(Duration::from_millis(ms));
        Ok((v, 1))
    }
}

/// A cache capped at two entries, after an expensive build and then two cheap ones.
fn expensive_then_two_cheap(eviction: Eviction) -> (Arc<MemoryCache<String, u64>>, Arc<Ledger>) {
    let (c, ledger) = capped(2, eviction);
    c.find_or_build("expensive", None, slow(1, 12)).unwrap();
    c.find_or_build("cheap", None, ok(2)).unwrap();
    c.find_or_build("newest", None, ok(3)).unwrap();
    (c, ledger)
}

#[test]
fn cost_aware_eviction_keeps_the_expensive_entry() {
    let (c, ledger) = expensive_then_two_cheap(Eviction::CostAware);
    assert_eq!(
        ledger.destroyed(),
        vec![2],
        "the older but costlier entry stays"
    );
    assert!(c.get("expensive").is_some());
}

#[test]
fn plain_clock_evicts_the_oldest_whatever_it_cost() {
    let (_c, ledger) = expensive_then_two_cheap(Eviction::Clock);
    assert_eq!(ledger.destroyed(), vec![1]);
}

#[test]
fn an_expensive_entry_goes_once_its_chances_are_spent() {
    let (c, ledger) = capped(1, Eviction::CostAware);
    // With a cap of one the newest entry always stays: the expensive entry's two chances
    // (class 2, 10–100 ms) only make the hand pass it twice before it goes.
    c.find_or_build("expensive", None, slow(1, 12)).unwrap();
    c.find_or_build("a", None, ok(2)).unwrap();
    assert_eq!(
        ledger.destroyed(),
        vec![1],
        "a cap of one keeps only the newest"
    );
    assert_eq!(c.len(), 1);
}

#[test]
fn probe_counts_a_hit_but_leaves_the_miss_to_find_or_build() {
    let (c, _) = cache();
    assert!(c.probe("k").is_none());
    assert_eq!(c.stats().misses, 0);
    c.find_or_build("k", None, ok(7)).unwrap();
    assert_eq!(*c.probe("k").unwrap(), 7);
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (1, 1));
}

/// A key whose hash is the same whatever its value: every lookup meets other keys' slots with
/// its own full hash, which the hit path's hash-only probe must not take for its own.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Colliding(u64);

impl std::hash::Hash for Colliding {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        0u8.hash(state);
    }
}

#[test]
fn keys_of_one_hash_are_told_apart() {
    let cache: Arc<MemoryCache<Colliding, u64>> =
        Arc::new(MemoryCache::new(Options::default(), |_| Ok(())));
    for k in 0..5 {
        cache
            .find_or_build(&Colliding(k), None, move || Ok((k * 10, 1)))
            .unwrap();
    }
    for k in 0..5 {
        let lease = cache
            .find_or_build(&Colliding(k), None, || unreachable!("built already"))
            .unwrap();
        assert_eq!((lease.key(), *lease), (&Colliding(k), k * 10));
        assert_eq!(cache.get(&Colliding(k)).map(|l| *l), Some(k * 10));
    }
    assert!(cache.get(&Colliding(9)).is_none());

    // A build in flight for another key of the same hash: a ready key is still a hit, with no
    // wait for that build.
    let park = Park::new();
    let builder = {
        let (cache, park) = (Arc::clone(&cache), park.clone());
        thread::spawn(move || {
            cache
                .find_or_build(&Colliding(7), None, || {
                    park.hold();
                    Ok((70, 1))
                })
                .map(|l| *l)
        })
    };
    park.started.wait();
    assert_eq!(
        *cache
            .find_or_build(&Colliding(3), None, || unreachable!("built already"))
            .unwrap(),
        30
    );
    assert!(cache.get(&Colliding(7)).is_none(), "a build is not ready");
    park.release.wait();
    assert_eq!(builder.join().unwrap().unwrap(), 70);

    let s = cache.stats();
    assert_eq!(
        (s.builds, s.hits, s.misses, s.waits, s.entries),
        (6, 11, 8, 0, 6)
    );
}

// Each caller's outcome is judged against its own window (its miss or its arrival at a build in
// flight, to the value): single-flight shares the work, never another caller's eviction or clear.

/// Parks a build of "k" for `builder_device`, lets a waiter for `waiter_device` join it, runs
/// `during`, then lets the build end; returns what the builder and the waiter got.
fn shared_build(
    c: &Arc<MemoryCache<String, u64>>,
    builder_device: Option<i64>,
    waiter_device: Option<i64>,
    during: impl FnOnce(),
) -> (Result<u64, Error>, Result<u64, Error>) {
    let park = Park::new();
    let waits_before = c.stats().waits;
    let builder = park.spawn_build(c, builder_device, || Ok((77, 1)));
    park.started.wait();
    let waiter = spawn_waiter(c, waiter_device);
    until_waits(c, waits_before + 1);
    during();
    park.release.wait();
    (builder.join().unwrap(), waiter.join().unwrap())
}

#[test]
fn waiter_without_device_builds_again_when_the_builders_device_is_evicted() {
    let (c, ledger) = cache();
    let (built, waited) = shared_build(&c, Some(3), None, || {
        assert_eq!(c.evict_device(3), Ok(0));
    });
    assert_eq!(built, Err(Error::DeviceDestroyed(3)));
    assert_eq!(
        waited,
        Ok(1),
        "the waiter's own build, not the builder's error"
    );
    assert_eq!(ledger.destroyed(), vec![77]);
    let lease = c.get("k").unwrap();
    assert!(lease.devices().is_empty());
    let s = c.stats();
    assert_eq!(
        (s.discarded, s.misses, s.waits, s.entries),
        (1, 2, 0, 1),
        "the waiter that built counts as a miss"
    );
}

#[test]
fn waiter_on_another_device_builds_again_when_the_builders_device_is_evicted() {
    let (c, ledger) = cache();
    let (built, waited) = shared_build(&c, Some(3), Some(4), || {
        c.evict_device(3).unwrap();
    });
    assert_eq!(built, Err(Error::DeviceDestroyed(3)));
    assert_eq!(waited, Ok(1));
    assert_eq!(ledger.destroyed(), vec![77]);
    assert_eq!(c.get("k").unwrap().devices(), [4]);
}

#[test]
fn waiter_whose_device_is_evicted_gets_device_destroyed_not_the_builders_value() {
    let (c, ledger) = cache();
    let (built, waited) = shared_build(&c, None, Some(3), || {
        c.evict_device(3).unwrap();
    });
    assert_eq!(built, Ok(77), "nothing the builder named was evicted");
    assert_eq!(waited, Err(Error::DeviceDestroyed(3)));
    assert!(
        c.get("k").unwrap().devices().is_empty(),
        "not recorded against the evicted device"
    );
    assert_eq!(c.evict_device(3), Ok(0));
    assert_eq!(c.len(), 1);
    assert!(ledger.destroyed().is_empty());
}

#[test]
fn value_is_recorded_against_every_device_it_was_returned_for() {
    let (c, ledger) = cache();
    let (built, waited) = shared_build(&c, None, Some(3), || {});
    assert_eq!((built, waited), (Ok(77), Ok(77)));
    assert_eq!(c.get("k").unwrap().devices(), [3]);
    assert_eq!(c.evict_device(3), Ok(1), "the waiter's device unlinks it");
    assert_eq!(ledger.destroyed(), vec![77]);

    let (built, waited) = shared_build(&c, Some(1), Some(2), || {});
    assert_eq!((built, waited), (Ok(77), Ok(77)));
    assert_eq!(c.get("k").unwrap().devices(), [1, 2]);
    assert_eq!(c.evict_device(2), Ok(1), "either device unlinks it");
    assert_eq!(c.len(), 0);
}

#[test]
fn each_waiter_of_one_device_is_judged_by_its_own_arrival() {
    let (c, _) = cache();
    let park = Park::new();
    let builder = park.spawn_build(&c, None, || Ok((77, 1)));
    park.started.wait();
    let before = spawn_waiter(&c, Some(3));
    until_waits(&c, 1);
    c.evict_device(3).unwrap();
    let after = spawn_waiter(&c, Some(3));
    until_waits(&c, 2);
    park.release.wait();
    assert_eq!(builder.join().unwrap(), Ok(77));
    assert_eq!(before.join().unwrap(), Err(Error::DeviceDestroyed(3)));
    assert_eq!(after.join().unwrap(), Ok(77), "arrived after the eviction");
    assert_eq!(c.get("k").unwrap().devices(), [3]);
}

#[test]
fn eviction_after_the_install_unlinks_a_value_already_returned() {
    let (c, ledger) = cache();
    let (built, waited) = shared_build(&c, Some(1), Some(2), || {});
    assert_eq!((built, waited), (Ok(77), Ok(77)));
    assert_eq!(c.evict_device(1), Ok(1));
    assert_eq!(ledger.destroyed(), vec![77]);
    assert_eq!(*c.find_or_build("k", Some(2), ok(5)).unwrap(), 5);
}

/// Parks a build of "k" for `builder_device`, runs `doom`, then looks "k" up for
/// `later_device` on another thread while the build is still parked; returns what the builder
/// and that later lookup got, and how many lookups waited for a build.
fn lookup_after(
    c: &Arc<MemoryCache<String, u64>>,
    builder_device: Option<i64>,
    later_device: Option<i64>,
    doom: impl FnOnce(),
) -> (Result<u64, Error>, Result<u64, Error>, u64) {
    let park = Park::new();
    let builder = park.spawn_build(c, builder_device, || Ok((77, 1)));
    park.started.wait();
    doom();
    let later = spawn_waiter(c, later_device);
    // The later lookup either builds (a second miss) or joins the parked build (a wait).
    while c.stats().misses < 2 && c.stats().waits < 1 {
        thread::sleep(Duration::from_millis(1));
    }
    park.release.wait();
    (
        builder.join().unwrap(),
        later.join().unwrap(),
        c.stats().waits,
    )
}

#[test]
fn lookup_after_an_eviction_never_joins_the_build_it_doomed() {
    for (device, recorded) in [(Some(3), vec![3]), (None, vec![])] {
        let (c, ledger) = cache();
        let (built, later, waits) = lookup_after(&c, Some(3), device, || {
            assert_eq!(c.evict_device(3), Ok(0));
        });
        assert_eq!(built, Err(Error::DeviceDestroyed(3)));
        assert_eq!(later, Ok(1), "a build after the eviction succeeds");
        assert_eq!(waits, 0);
        assert_eq!(ledger.destroyed(), vec![77], "destroyed once");
        assert_eq!(c.get("k").unwrap().devices(), recorded);
    }
}

#[test]
fn lookup_after_a_clear_never_joins_the_build_it_doomed() {
    let (c, ledger) = cache_with(Options {
        invalidated_by_clear: true,
        ..Options::default()
    });
    let (built, later, waits) = lookup_after(&c, None, None, || {
        assert_eq!(c.clear(), Ok(0));
    });
    assert_eq!(built, Err(Error::CacheCleared));
    assert_eq!(later, Ok(1));
    assert_eq!(waits, 0);
    assert_eq!(ledger.destroyed(), vec![77]);
    assert_eq!(c.stats().discarded, 1);
    assert_eq!(c.len(), 1);
}

#[test]
fn clear_of_an_owning_cache_leaves_the_build_joinable() {
    let (c, ledger) = cache();
    let (built, later, waits) = lookup_after(&c, None, None, || {
        assert_eq!(c.clear(), Ok(0));
    });
    assert_eq!((built, later, waits), (Ok(77), Ok(77), 1));
    assert!(ledger.destroyed().is_empty());
}
