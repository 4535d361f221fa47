//! The memory tier (L1): live values behind leases.
//!
//! [`MemoryCache`] maps keys to values that are expensive to build (compiled kernels) and must
//! be destroyed explicitly (driver handles). Its rules:
//!
//! - **Builds run outside every lock**, one per key at a time (single-flight): lookups of a key
//!   being built wait for that build and share its value or its build error. Sharing never
//!   changes a caller's outcome: each is judged against its own window (below).
//! - **Leases**: a lookup returns a [`Lease`]. `clear`, `evict_device`, `remove`, capacity
//!   eviction and dropping the cache unlink entries at once, but a value is destroyed only when
//!   its last lease is released, on the releasing thread. Destroy callbacks never run under an
//!   internal lock, so they may call back into the cache.
//! - **Per-caller windows**: each caller snapshots its device's eviction epoch and the cache's
//!   clear generation at its miss, or when it joins a build in flight, and is judged against
//!   its own snapshot when the build ends. It gets [`Error::DeviceDestroyed`] only if its own
//!   device was evicted in its window (`evict_device(d)` or `evict_devices` bumps `d`'s epoch),
//!   and [`Error::CacheCleared`] only if a cache built with `invalidated_by_clear` (its values
//!   borrow from something a clear releases) was cleared in its window; an owning cache
//!   installs a build that straddles a `clear`. A builder doomed so destroys its value; a
//!   waiter whose own window was not doomed looks the key up again (it builds, or joins a
//!   live build). An installed value is recorded against the device of every caller it was
//!   returned to, so evicting any of them unlinks it.
//! - **Doomed builds are detached**: `evict_device` and `clear` (of a borrowing cache) take
//!   the builds they doom out of the table, so a lookup that starts after they return builds
//!   anew instead of joining one; the doomed value is destroyed once, when its build ends.
//! - **Caps**: an optional entry-count and weight cap, enforced after each install by a CLOCK
//!   policy that by default weighs the recorded build time (see `policy.rs` and [`Eviction`]).
//!   One entry heavier than the whole cap is admitted alone.
//! - **Hit path**: one shard read lock (sharded again per thread, so readers on different
//!   threads write no common cache line), no allocation, no global lock, no shared counter,
//!   lookup by borrowed key.
//!
//! A build that looks up its own key gets [`Error::Reentrant`]; a build may look up or build
//! any other key. Under single-flight that lookup would wait for the build it runs in; a cache
//! without single-flight would build the key a second time, install the inner value and
//! destroy the outer one, so a recursion costs a compile that nobody asked for. kcache reports
//! it instead, so that the recursion is seen and fixed. A cycle across threads (A's build waits for B, B's build waits for A) is not
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

use flight::{Ending, Flight, Verdict};
use metrics::MemorySource;
use shared::{Building, ErrorHook, Shared, Slot, Snapshot, bump};
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
        // Joins builds in flight until one gives this caller its outcome; a build doomed for a
        // reason that is not this caller's sends it round again (see `join`). Counted once: as
        // the wait it began with, or as a miss if it then builds (every build has its miss).
        let mut rejoined = false;
        let mut table = loop {
            let mut table = self.shared.shard_of(hash).table.write();
            let (flight, snapshot, ticket) =
                match table.find_mut(hash, |slot| slot.matches(hash, key)) {
                    Some(Slot::Ready(entry)) if rejoined => {
                        entry.touch();
                        return Ok(Lease::new(Arc::clone(entry)));
                    }
                    Some(Slot::Ready(entry)) => return Ok(self.hit(entry)),
                    Some(Slot::Building(building)) if building.flight.can_finish_here() => {
                        if building.flight.is_builder() {
                            return Err(Error::Reentrant);
                        }
                        // Taken under the shard lock, as the builder's is: see `install`.
                        let snapshot = self.snapshot(device);
                        let ticket = snapshot.device_epoch.map(|pair| {
                            building.waiters.push(pair);
                            building.waiters.len() - 1
                        });
                        (Arc::clone(&building.flight), snapshot, ticket)
                    }
                    _ => break table,
                };
            drop(table);
            if !rejoined {
                bump(&self.shared.counters.waits);
            }
            if let Some(outcome) = self.join(&flight, &snapshot, ticket) {
                return outcome;
            }
            rejoined = true;
        };
        // A build the parent process was running when this one forked: its builder is not
        // here, so this lookup builds in its place (dropping the slot after the lock).
        let orphan = table
            .find_entry(hash, |slot| slot.matches(hash, key))
            .ok()
            .map(|found| found.remove().0);
        // Snapshots taken under the shard lock: see `install` for why that ordering matters.
        let snapshot = self.snapshot(device);
        let flight = Arc::new(Flight::new());
        table.insert_unique(
            hash,
            Slot::Building(Box::new(Building {
                key: key.to_owned(),
                hash,
                flight: Arc::clone(&flight),
                snapshot,
                waiters: Vec::new(),
            })),
            Slot::hash,
        );
        drop(table);
        drop(orphan);
        if rejoined {
            self.shared.counters.waits.fetch_sub(1, Ordering::Relaxed);
        }
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
                flight.finish(Ending::Failed(error.clone()));
                Err(error)
            }
            Ok((value, weight)) => {
                self.install(hash, &flight, &snapshot, value, weight, build_time)
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

    /// Waits for `flight` and judges its ending against this waiter's own window (`snapshot`,
    /// taken when it joined): `None` when the builder's window was doomed but this waiter's was
    /// not, so that it looks the key up again (and builds, or joins a live build).
    fn join(
        &self,
        flight: &Flight<K, V>,
        snapshot: &Snapshot,
        ticket: Option<usize>,
    ) -> Option<Result<Lease<K, V>>> {
        match flight.wait(ticket) {
            Verdict::Value(entry) => Some(Ok(Lease::new(entry))),
            Verdict::Evicted => snapshot
                .device_epoch
                .map(|(device, _)| Err(Error::DeviceDestroyed(device))),
            Verdict::Failed(error) => Some(Err(error)),
            Verdict::Doomed => self.stale(snapshot).map(Err),
        }
    }

    fn epoch(&self, device: DeviceId) -> u64 {
        self.shared.epochs.lock().get(&device).copied().unwrap_or(0)
    }

    /// What a caller arriving now sees; taken under the key's shard lock.
    fn snapshot(&self, device: Option<DeviceId>) -> Snapshot {
        Snapshot {
            device_epoch: device.map(|d| (d, self.epoch(d))),
            generation: self.generation.load(Ordering::SeqCst),
        }
    }

    /// Why a caller's window is doomed, if it is: its device was evicted, or (on a borrowing
    /// cache) the cache cleared, since `snapshot`.
    fn stale(&self, snapshot: &Snapshot) -> Option<Error> {
        match snapshot.device_epoch {
            Some((device, epoch)) if self.epoch(device) != epoch => {
                Some(Error::DeviceDestroyed(device))
            }
            _ if self.invalidated_by_clear
                && self.generation.load(Ordering::SeqCst) != snapshot.generation =>
            {
                Some(Error::CacheCleared)
            }
            _ => None,
        }
    }

    /// Removes this flight's slot (freeing its key for a new build) and hands it back, or
    /// `None` if an eviction or a clear that doomed the build detached it already. The slot
    /// must be dropped by the caller, outside the lock.
    fn remove_building(
        table: &mut HashTable<Slot<K, V>>,
        hash: u64,
        flight: &Arc<Flight<K, V>>,
    ) -> Option<Box<Building<K, V>>> {
        let found = table
            .find_entry(
                hash,
                |slot| matches!(slot, Slot::Building(b) if Arc::ptr_eq(&b.flight, flight)),
            )
            .ok()?;
        match found.remove().0 {
            Slot::Building(building) => Some(building),
            Slot::Ready(_) => unreachable!("matched a building slot"),
        }
    }

    fn take_building(&self, hash: u64, flight: &Arc<Flight<K, V>>) -> Option<Box<Building<K, V>>> {
        Self::remove_building(&mut self.shared.shard_of(hash).table.write(), hash, flight)
    }

    /// Replaces the flight's slot with the built entry, unless the builder's device was evicted
    /// or (on a borrowing cache) the cache cleared since the build started. Both happen under
    /// one shard lock, so no lookup can find the key free in between and start a second build.
    /// And `evict_device`/`clear` bump first and then take every shard lock: so either the
    /// check here sees the bump, or their unlinking sweep comes after the install and sees the
    /// entry. The entry is recorded against the builder's device and every waiter's whose
    /// device was not evicted since that waiter arrived.
    fn install(
        &self,
        hash: u64,
        flight: &Arc<Flight<K, V>>,
        snapshot: &Snapshot,
        value: V,
        weight: u64,
        build_time: Duration,
    ) -> Result<Lease<K, V>> {
        let shard = self.shared.shard_of(hash);
        let mut table = shard.table.write();
        let building = Self::remove_building(&mut table, hash, flight);
        let building = match (building, self.stale(snapshot)) {
            (Some(building), None) => building,
            (building, Some(error)) => {
                drop(table);
                drop(building);
                bump(&self.shared.counters.discarded);
                if let Err(e) = self.shared.destroy(value) {
                    self.shared.report_destroy_error(&e);
                }
                flight.finish(Ending::Doomed);
                return Err(error);
            }
            (None, None) => {
                unreachable!("only the eviction or clear that dooms it detaches a build")
            }
        };
        let Building { key, waiters, .. } = *building;
        let (devices, evicted) = {
            let epochs = self.shared.epochs.lock();
            let evicted: Vec<bool> = waiters
                .iter()
                .map(|(device, epoch)| epochs.get(device).copied().unwrap_or(0) != *epoch)
                .collect();
            let mut devices: Vec<DeviceId> = snapshot
                .device_epoch
                .iter()
                .map(|&(device, _)| device)
                .chain(
                    waiters
                        .iter()
                        .zip(&evicted)
                        .filter(|(_, evicted)| !**evicted)
                        .map(|((device, _), _)| *device),
                )
                .collect();
            devices.sort_unstable();
            devices.dedup();
            (devices, evicted)
        };
        let entry = Arc::new(Entry::new(
            key,
            value,
            weight.min(MAX_ENTRY_WEIGHT),
            devices.into_boxed_slice(),
            build_time,
            hash,
            Arc::clone(&self.shared),
        ));
        table.insert_unique(hash, Slot::Ready(Arc::clone(&entry)), Slot::hash);
        let c = &self.shared.counters;
        let entries = c.entries.fetch_add(1, Ordering::Relaxed) + 1;
        let weight = c.weight.fetch_add(entry.weight(), Ordering::Relaxed) + entry.weight();
        drop(table);
        let lease = Lease::new(Arc::clone(&entry));
        flight.finish(Ending::Installed {
            entry: Arc::clone(&entry),
            evicted,
        });
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
            Box::default(),
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
            self.flight.finish(Ending::Failed(Error::BuildPanicked));
        }
    }
}
