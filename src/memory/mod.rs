//! The memory tier (L1): live values behind leases.
//!
//! [`MemoryCache`] maps keys to values that are expensive to build (compiled kernels) and must
//! be destroyed explicitly (driver handles). Its rules:
//!
//! - **Builds run outside every lock**, one per key at a time (single-flight): lookups of a key
//!   being built wait for that build and share its outcome, value or error.
//! - **Leases**: a lookup returns a [`Lease`]. `clear`, `evict_device`, `remove`, capacity
//!   eviction and dropping the cache unlink entries at once, but a value is destroyed only when
//!   its last lease is released, on the releasing thread. Destroy callbacks never run under an
//!   internal lock, so they may call back into the cache.
//! - **Device epochs**: `evict_device(d)` (or `evict_devices`) bumps `d`'s epoch; a build for `d`
//!   that started before the bump is destroyed on completion and reported as
//!   [`Error::DeviceDestroyed`].
//! - **Clear generations**: on a cache built with `invalidated_by_clear` (its values borrow from
//!   something a clear releases), a build that straddles a `clear` is destroyed and reported as
//!   [`Error::CacheCleared`]. An owning cache installs it.
//! - **Caps**: an optional entry-count and weight cap, enforced after each install by a CLOCK
//!   policy that by default weighs the recorded build time (see `policy.rs` and [`Eviction`]).
//!   One entry heavier than the whole cap is admitted alone.
//! - **Hit path**: one shard read lock (sharded again per thread, so readers on different
//!   threads write no common cache line), no allocation, no global lock, no shared counter,
//!   lookup by borrowed key.
//!
//! A build that looks up its own key gets [`Error::Reentrant`]; a build may look up or build
//! any other key. A cycle across threads (A's build waits for B, B's build waits for A) is not
//! detected and deadlocks, as it would with any single-flight cache.
//!
//! ```
//! use kcache::memory::{MemoryCache, Options};
//!
//! let cache: MemoryCache<Vec<u8>, u64> = MemoryCache::new(
//!     Options { max_entries: Some(1024), ..Options::default() },
//!     |module| { /* release the driver handle */ let _ = module; Ok(()) },
//! );
//! let lease = cache.find_or_build(b"saxpy".as_slice(), Some(0), || Ok((42, 4096)))?;
//! assert_eq!(*lease, 42);             // the value stays alive while the lease does
//! # Ok::<(), kcache::Error>(())
//! ```

mod entry;
mod flight;
mod metrics;
mod policy;
mod removal;
mod shared;
pub(crate) mod stats;
mod sync;
mod tally;

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hashbrown::HashTable;

pub use entry::{Entry, Lease};
pub(crate) use metrics::Made;
pub use stats::Stats;

use flight::Flight;
use metrics::MemorySource;
use shared::{Building, ErrorHook, Shared, Slot, bump};
use sync::{AtomicU64, Ordering};

#[cfg(not(feature = "shuttle"))]
use crate::ffi::process;
use crate::metrics::{self as process_metrics, Backend};
use crate::stats::Baseline;
use crate::{BuildError, DestroyError, DeviceId, Error, Result};

/// How many shards a cache's table has; a power of two, since the shard index is a mask of the
/// key's hash. More shards spread the write locks of concurrent misses; but a hit reads two
/// cache lines of its shard (the table's header and the thread's lock slot), and those stay in
/// the first-level cache only while the shards are few: on a 2-core machine, 64 shards cost a
/// hit one more L1 miss than 8 (`scripts/hit-cost`: 7.9 against 6.9). So four per hardware
/// thread, as quick_cache chooses, from 4 to 64.
#[cfg(not(feature = "shuttle"))]
fn shard_count() -> usize {
    // Worked out again by a thread that finds it unknown rather than waiting for another (see
    // `process::once_without_waiting`): every thread finds the same.
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    match COUNT.load(std::sync::atomic::Ordering::Relaxed) {
        0 => {
            let count = std::thread::available_parallelism()
                .map_or(1, usize::from)
                .saturating_mul(4)
                .next_power_of_two()
                .clamp(4, 64);
            COUNT.store(count, std::sync::atomic::Ordering::Relaxed);
            count
        }
        known => known,
    }
}

/// Few shards keep the model checker's schedules short enough to explore.
#[cfg(feature = "shuttle")]
fn shard_count() -> usize {
    4
}

/// What a build (or a load from another tier) returns: the value and its weight, or why not.
pub type Built<V> = std::result::Result<(V, u64), BuildError>;

/// The most one entry weighs: larger weights (a C caller's `UINT64_MAX` for "unknown", say)
/// count as this much. 2^40 (a tebibyte, if weights are bytes) is heavier than any kernel, and
/// the total weight of fewer than 2^24 such entries cannot overflow.
pub const MAX_ENTRY_WEIGHT: u64 = 1 << 40;

/// How a [`MemoryCache`] behaves; fixed at creation.
#[derive(Clone, Default)]
pub struct Options {
    /// At most this many entries (`None`: unbounded).
    pub max_entries: Option<u64>,
    /// At most this total weight, as reported by the builds (`None`: unbounded). A build's
    /// weight counts as at most [`MAX_ENTRY_WEIGHT`].
    pub max_weight: Option<u64>,
    /// The values borrow resources that a `clear` releases: a build in flight across a clear
    /// is discarded with [`Error::CacheCleared`] instead of being installed.
    pub invalidated_by_clear: bool,
    /// Called with destroy failures that have no caller to return to: destroys deferred to a
    /// lease release, capacity evictions, discarded builds, dropping the cache.
    pub on_destroy_error: Option<ErrorHook>,
    /// Which entries a cap evicts first.
    pub eviction: Eviction,
}

/// How a capped cache chooses what to evict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Eviction {
    /// CLOCK weighted by build cost: an entry whose build took 1–10 ms, 10–100 ms or longer
    /// survives one, two or three more passes of the clock hand than a sub-millisecond one
    /// used as recently. Among builds of one cost class it is plain CLOCK.
    #[default]
    CostAware,
    /// Plain CLOCK (second chance): an approximation of least-recently-used.
    Clock,
}

/// A concurrent cache of live values. Share it between threads behind an `Arc`.
pub struct MemoryCache<K, V> {
    shared: Arc<Shared<K, V>>,
    hasher: foldhash::fast::RandomState,
    max_entries: Option<u64>,
    max_weight: Option<u64>,
    invalidated_by_clear: bool,
    generation: AtomicU64,
    /// This cache's entry in the process's metrics, which lists it while this lives.
    metrics: Arc<MemorySource>,
    /// The counters at the last `reset_stats`.
    baseline: Baseline<Stats>,
}

/// What a build's caller saw when the build started, checked again at install.
struct Snapshot {
    device_epoch: Option<(DeviceId, u64)>,
    generation: u64,
}

/// Made only of keys and values that any thread may use and drop, for as long as the process
/// runs: a fork takes the cache's locks on the forking thread (see `ForkLocked`).
impl<K: Hash + Eq + Send + Sync + 'static, V: Send + Sync + 'static> MemoryCache<K, V> {
    /// Creates a cache; `destroy` releases a value that leaves it.
    pub fn new(
        options: Options,
        destroy: impl Fn(V) -> std::result::Result<(), DestroyError> + Send + Sync + 'static,
    ) -> Self {
        Self::for_backend(Backend::Rust, options, destroy)
    }

    /// [`MemoryCache::new`] for a cache whose builds the metrics count under `backend`.
    pub(crate) fn for_backend(
        backend: Backend,
        options: Options,
        destroy: impl Fn(V) -> std::result::Result<(), DestroyError> + Send + Sync + 'static,
    ) -> Self {
        let shared = Arc::new(Shared::new(
            shard_count(),
            Box::new(destroy),
            options.on_destroy_error,
            options.eviction == Eviction::CostAware,
        ));
        let metrics = Arc::new(MemorySource::new(
            backend,
            Arc::clone(&shared.counters),
            Arc::clone(shared.tally.counts()),
        ));
        process_metrics::register(Arc::downgrade(&metrics) as _);
        #[cfg(not(feature = "shuttle"))]
        process::lock_at_forks(Arc::downgrade(&shared) as _);
        Self {
            shared,
            hasher: foldhash::fast::RandomState::default(),
            max_entries: options.max_entries,
            max_weight: options.max_weight,
            invalidated_by_clear: options.invalidated_by_clear,
            generation: AtomicU64::new(0),
            metrics,
            baseline: Baseline::default(),
        }
    }
}

impl<K: Hash + Eq, V> MemoryCache<K, V> {
    /// Returns a lease on the value for `key`, running `build` on a miss. `build` returns the
    /// value and its weight, and runs on the calling thread with no cache lock held. `device`
    /// records the entry for [`MemoryCache::evict_device`].
    #[inline]
    pub fn find_or_build<Q>(
        &self,
        key: &Q,
        device: Option<DeviceId>,
        build: impl FnOnce() -> Built<V>,
    ) -> Result<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.find_or_make(key, device, || (build(), Made::Built))
    }

    /// [`MemoryCache::find_or_build`] for a caller whose `make` may load the value rather
    /// than build it, and says which (the build metrics count only builds). Inlined: a hit
    /// then returns its lease in a register rather than through a `Result` in memory.
    #[inline]
    pub(crate) fn find_or_make<Q>(
        &self,
        key: &Q,
        device: Option<DeviceId>,
        make: impl FnOnce() -> (Built<V>, Made),
    ) -> Result<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        match self.find_ready(hash, key) {
            Some(lease) => Ok(lease),
            None => self.miss(key, hash, device, make),
        }
    }

    /// The hit path: a lease on the ready entry for `key`, counted as a hit, or `None`.
    #[inline]
    fn find_ready<Q>(&self, hash: u64, key: &Q) -> Option<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let table = self.shared.shard_of(hash).table.read();
        // The probe compares full hashes only, so that it calls no key comparison (a call makes
        // the probe loop keep its state on the stack); the key is compared once, after it.
        let entry = match table.find(hash, |slot| {
            if let Slot::Ready(entry) = slot {
                // The reference count (the lease's) is on the cache line before the entry's
                // fields. Reading it as soon as the probe reaches the entry loads both lines
                // at once, rather than that one only after the key comparison.
                let _ = Arc::strong_count(entry);
            }
            slot.hash() == hash
        }) {
            Some(Slot::Ready(entry)) if entry.key().borrow() == key => entry,
            None => return None,
            // A build in flight, or another key with the same 64-bit hash: compare keys.
            Some(_) => match table.find(hash, |slot| slot.matches(hash, key)) {
                Some(Slot::Ready(entry)) => entry,
                _ => return None,
            },
        };
        Some(self.hit(entry))
    }

    /// The rest of [`MemoryCache::find_or_build`] after the read-locked lookup found no ready
    /// entry: a key being built (joined here, under the write lock) or a miss. Kept out of line
    /// so that the hit path stays small.
    #[cold]
    #[inline(never)]
    fn miss<Q>(
        &self,
        key: &Q,
        hash: u64,
        device: Option<DeviceId>,
        make: impl FnOnce() -> (Built<V>, Made),
    ) -> Result<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut table = self.shared.shard_of(hash).table.write();
        let orphan = match table.find(hash, |slot| slot.matches(hash, key)) {
            Some(Slot::Ready(entry)) => return Ok(self.hit(entry)),
            Some(Slot::Building(building)) if building.flight.can_finish_here() => {
                let flight = Arc::clone(&building.flight);
                drop(table);
                return self.join(&flight);
            }
            // A build the parent process was running when this one forked: its builder is
            // not here, so this lookup builds in its place (dropping the slot after the lock).
            Some(Slot::Building(_)) => table
                .find_entry(hash, |slot| slot.matches(hash, key))
                .ok()
                .map(|found| found.remove().0),
            None => None,
        };
        // Snapshots taken under the shard lock: see `install` for why that ordering matters.
        let epoch = device.map(|d| self.epoch(d));
        let generation = self.generation.load(Ordering::SeqCst);
        let flight = Arc::new(Flight::new());
        table.insert_unique(
            hash,
            Slot::Building(Box::new(Building {
                key: key.to_owned(),
                hash,
                flight: Arc::clone(&flight),
            })),
            Slot::hash,
        );
        drop(table);
        drop(orphan);
        self.shared.tally.miss();

        let mut guard = FlightGuard {
            cache: self,
            hash,
            flight: &flight,
            armed: true,
        };
        let started = Instant::now();
        let (built, made) = make();
        let build_time = started.elapsed();
        guard.armed = false;
        self.metrics.made(made, build_time, built.is_ok());

        match built {
            Err(e) => {
                drop(self.take_building(hash, &flight));
                bump(&self.shared.counters.build_failures);
                let error = Error::Build(e);
                flight.finish(Err(error.clone()));
                Err(error)
            }
            Ok((value, weight)) => {
                let snapshot = Snapshot {
                    device_epoch: device.zip(epoch),
                    generation,
                };
                self.install(hash, &flight, snapshot, value, weight, build_time)
            }
        }
    }

    /// Returns a lease on the value for `key` if one is ready; never builds or waits.
    pub fn get<Q>(&self, key: &Q) -> Option<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let found = self.probe(key);
        if found.is_none() {
            self.shared.tally.miss();
        }
        found
    }

    /// [`MemoryCache::get`] for a caller that follows a miss with
    /// [`MemoryCache::find_or_build`], which counts the miss: a hit is counted, a miss is not.
    pub fn probe<Q>(&self, key: &Q) -> Option<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find_ready(self.hasher.hash_one(key), key)
    }

    /// Entries linked now.
    pub fn len(&self) -> usize {
        self.shared.counters.entries.load(Ordering::Relaxed) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters since the cache was created or [`MemoryCache::reset_stats`] last ran.
    pub fn stats(&self) -> Stats {
        self.baseline.apply(&self.raw_stats())
    }

    /// Zeroes the event counters (not `entries`, `weight`, `leases`). No count made meanwhile
    /// is lost: it shows in the next snapshot or was counted before the reset.
    pub fn reset_stats(&self) {
        self.baseline.reset(self.raw_stats());
    }

    #[inline]
    fn hit(&self, entry: &Arc<Entry<K, V>>) -> Lease<K, V> {
        entry.touch();
        self.shared.tally.hit();
        Lease::new(Arc::clone(entry))
    }

    fn join(&self, flight: &Flight<K, V>) -> Result<Lease<K, V>> {
        if flight.is_builder() {
            return Err(Error::Reentrant);
        }
        bump(&self.shared.counters.waits);
        flight.wait().map(Lease::new)
    }

    fn epoch(&self, device: DeviceId) -> u64 {
        self.shared.epochs.lock().get(&device).copied().unwrap_or(0)
    }

    /// Removes this flight's slot (freeing its key for a new build) and hands back the key.
    /// The returned flight must be dropped by the caller, outside the lock.
    fn remove_building(
        table: &mut HashTable<Slot<K, V>>,
        hash: u64,
        flight: &Arc<Flight<K, V>>,
    ) -> (K, Arc<Flight<K, V>>) {
        let found = table
            .find_entry(
                hash,
                |slot| matches!(slot, Slot::Building(b) if Arc::ptr_eq(&b.flight, flight)),
            )
            .unwrap_or_else(|_| unreachable!("only the builder removes its flight's slot"));
        match found.remove().0 {
            Slot::Building(building) => (building.key, building.flight),
            Slot::Ready(_) => unreachable!("matched a building slot"),
        }
    }

    fn take_building(&self, hash: u64, flight: &Arc<Flight<K, V>>) -> (K, Arc<Flight<K, V>>) {
        Self::remove_building(&mut self.shared.shard_of(hash).table.write(), hash, flight)
    }

    /// Replaces the flight's slot with the built entry, unless the device was evicted or (on a
    /// borrowing cache) the cache cleared since the build started. Both happen under one shard
    /// lock, so no lookup can find the key free in between and start a second build. And
    /// `evict_device`/`clear` bump first and then take every shard lock: so either the check
    /// here sees the bump, or their unlinking sweep comes after the install and sees the entry.
    fn install(
        &self,
        hash: u64,
        flight: &Arc<Flight<K, V>>,
        snapshot: Snapshot,
        value: V,
        weight: u64,
        build_time: Duration,
    ) -> Result<Lease<K, V>> {
        let shard = self.shared.shard_of(hash);
        let mut table = shard.table.write();
        let (key, building) = Self::remove_building(&mut table, hash, flight);
        let device = snapshot.device_epoch.map(|(device, _)| device);
        let entry = Arc::new(Entry::new(
            key,
            value,
            weight.min(MAX_ENTRY_WEIGHT),
            device,
            build_time,
            hash,
            Arc::clone(&self.shared),
        ));
        let stale = match snapshot.device_epoch {
            Some((device, epoch)) if self.epoch(device) != epoch => {
                Some(Error::DeviceDestroyed(device))
            }
            _ if self.invalidated_by_clear
                && self.generation.load(Ordering::SeqCst) != snapshot.generation =>
            {
                Some(Error::CacheCleared)
            }
            _ => None,
        };
        if let Some(error) = stale {
            drop(table);
            drop(building);
            bump(&self.shared.counters.builds);
            bump(&self.shared.counters.discarded);
            entry.linked.store(false, Ordering::Release);
            if let Some(Err(e)) = Arc::into_inner(entry).map(Entry::destroy_now) {
                self.shared.report_destroy_error(&e);
            }
            flight.finish(Err(error.clone()));
            return Err(error);
        }
        table.insert_unique(hash, Slot::Ready(Arc::clone(&entry)), Slot::hash);
        let c = &self.shared.counters;
        let entries = c.entries.fetch_add(1, Ordering::Relaxed) + 1;
        let weight = c.weight.fetch_add(entry.weight(), Ordering::Relaxed) + entry.weight();
        drop(table);
        drop(building);
        bump(&c.builds);
        let lease = Lease::new(Arc::clone(&entry));
        flight.finish(Ok(Arc::clone(&entry)));
        if self.max_entries.is_some() || self.max_weight.is_some() {
            self.enforce_caps(&entry, entries, weight);
        }
        Ok(lease)
    }
}

impl<K, V> MemoryCache<K, V> {
    /// A lease on `value` that no lookup finds: for a value a backend built without caching it
    /// (a build whose inputs it cannot key), destroyed as every value is, when its last lease
    /// goes. Counted in no statistics but the leases outstanding.
    pub(crate) fn unlisted(&self, key: K, value: V, weight: u64) -> Lease<K, V> {
        let entry = Arc::new(Entry::new(
            key,
            value,
            weight,
            None,
            Duration::ZERO,
            0,
            Arc::clone(&self.shared),
        ));
        entry.linked.store(false, Ordering::Release);
        self.shared.detach(&entry);
        Lease::new(entry)
    }

    /// The counters since the cache was created, whatever the resets: what the directory's
    /// persisted counters add up.
    pub(crate) fn raw_stats(&self) -> Stats {
        let mut stats = metrics::stats(&self.shared.counters, self.shared.tally.counts());
        stats.leases = self.shared.outstanding_leases();
        stats
    }
}

impl<K, V> Drop for MemoryCache<K, V> {
    /// Unlinks everything; leased values are destroyed when their leases go.
    fn drop(&mut self) {
        let mut victims = Vec::new();
        for shard in self.shared.shards.iter() {
            let mut table = shard.table.write();
            for slot in table.drain() {
                if let Slot::Ready(entry) = slot {
                    entry.linked.store(false, Ordering::Release);
                    victims.push(entry);
                }
            }
        }
        self.shared.clock.lock().clear();
        let c = &self.shared.counters;
        c.entries.store(0, Ordering::Relaxed);
        c.weight.store(0, Ordering::Relaxed);
        for victim in victims {
            if let Some(Err(e)) = Arc::into_inner(victim).map(Entry::destroy_now) {
                self.shared.report_destroy_error(&e);
            }
        }
    }
}

/// Frees a flight's key and wakes its waiters with an error if the build unwinds: the panic
/// goes on in the builder's thread, nobody hangs, and the next lookup builds again.
struct FlightGuard<'a, K: Hash + Eq, V> {
    cache: &'a MemoryCache<K, V>,
    hash: u64,
    flight: &'a Arc<Flight<K, V>>,
    armed: bool,
}

impl<K: Hash + Eq, V> Drop for FlightGuard<'_, K, V> {
    fn drop(&mut self) {
        if self.armed {
            let slot = self.cache.take_building(self.hash, self.flight);
            drop(slot);
            bump(&self.cache.shared.counters.build_failures);
            self.flight.finish(Err(Error::BuildPanicked));
        }
    }
}
