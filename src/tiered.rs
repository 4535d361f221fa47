//! L1 → L2 → L3 → build for any backend, including ones kcache knows nothing about.
//!
//! A backend supplies four callbacks: `l2_key` (the content key), `build` (compile from
//! scratch), `serialize` (live value → bytes for the disk) and `load` (bytes → live value).
//! The L1 key and the L2 key are separate because they answer different questions: L1 is keyed
//! by what identifies a live value in this process (often live handles such as a context
//! pointer), L2 by content that means the same thing in every process (a [`Key`] from
//! [`crate::key::KeyBuilder`]). The L2 key hashes the whole input (a kernel's source, say), so
//! it is only made on an L1 miss.
//!
//! The disk read happens inside the memory tier's build step, so its single-flight covers it:
//! concurrent misses on one key read the disk (or compile) once. A miss on the disk then
//! claims the entry's cross-process lock (see `disk::lock`), so that of the processes sharing
//! the directory one builds and the others wait and read its entry; one process's waiters
//! share its one wait. Before claiming it, a disk miss asks the remote tier behind the disk
//! (`crate::remote`), when there is one; its entry is loaded and copied to the disk. The
//! write-back happens after the flight, on the disk tier's background
//! writer, which releases the lock once the entry is published: the caller has its value as
//! soon as it is built, and waits neither for serializing nor for a fsync, nor for the
//! remote, which the writer sends the entry to after the disk.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Persistence;
use crate::disk::{Claim, Descriptor, DiskBytes, Entry, KeyLock, Reported, Reporter, one_lookup};
use crate::error::{BuildError, DeviceId, Error, Result};
use crate::key::Key;
use crate::log;
use crate::memory::{Built, Lease, Made, MemoryCache};
use crate::stats::{Baseline, Live, bump};
use crate::store::{Flight, StoreLease};

/// A memory tier with an optional disk tier behind it.
pub struct TieredCache<K, V> {
    memory: Arc<MemoryCache<K, V>>,
    disk: Option<Arc<Persistence>>,
    counters: Arc<Counters>,
    /// The counters at the last `reset_stats`.
    baseline: Baseline<TieredStats>,
    /// What the disk tier has been told of the memory tier's lookups, for the directory's
    /// counters.
    reported: Reporter,
}

crate::stats::statistics! {
    /// What the tiers did for the lookups that missed L1 (L1 hits are in the memory stats).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct TieredStats {
        /// Values loaded from the disk tier instead of built.
        counted disk_hits,
        /// L1 misses the disk tier could not answer (absent, rejected, unreadable, or no disk).
        event disk_misses,
        /// Of those, values loaded from the remote tier instead of built (its own counters are
        /// [`Persistence::remote_stats`]).
        counted remote_hits,
        /// Of those, the ones where the disk tier had no entry for the key, or only a corrupt one
        /// (which it removed).
        counted disk_absent,
        /// Disk reads that failed, L2 keys that could not be made, and refused entries that could
        /// not be removed; each lookup went on without the disk. Failed writes are
        /// `write_back_failures`.
        counted disk_errors,
        /// Disk entries that `load` refused; each was removed and the value built instead.
        counted load_failures,
        /// Calls to `build`.
        counted builds,
        /// Built values written to the disk tier (counted when the background write has
        /// finished: [`TieredCache::flush`] waits for that).
        counted write_backs,
        /// Built values that could not be serialized or written (the lookup still succeeds).
        counted write_back_failures,
    }
    /// What the tiers did, as [`TieredStats`] reports it.
    live pub(crate) struct Counters;
}

impl TieredStats {
    /// `disk_hits / (disk_hits + disk_misses)`: the share of memory misses the disk tier
    /// answered; `None` before the first memory miss.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.disk_hits, self.disk_misses)
    }
}

impl<K, V> TieredCache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    /// `disk: None` (no directory, untrusted, `KCACHE_DISABLE=1`) leaves a memory-only cache
    /// with the same interface.
    pub fn new(memory: Arc<MemoryCache<K, V>>, disk: Option<Arc<Persistence>>) -> Self {
        TieredCache {
            memory,
            disk,
            counters: Arc::default(),
            baseline: Baseline::default(),
            reported: Reporter::default(),
        }
    }

    /// Waits until every value built so far is written to the disk tier (or failed to be),
    /// and brings the directory's counters up to date with this cache's lookups.
    pub fn flush(&self) {
        if let Some(disk) = &self.disk {
            self.report(disk);
            disk.flush();
        }
    }

    pub fn memory(&self) -> &Arc<MemoryCache<K, V>> {
        &self.memory
    }

    pub fn disk(&self) -> Option<&Arc<Persistence>> {
        self.disk.as_ref()
    }

    /// The tiers, for a lookup whose bytes for the disk are made later ([`DiskBytes`]).
    pub(crate) fn tiers(&self) -> Tiers<'_, K, V> {
        Tiers {
            memory: &self.memory,
            disk: self.disk.as_deref(),
            counters: &self.counters,
        }
    }

    /// What the tiers did since the cache was created or [`TieredCache::reset_stats`] last ran
    /// (the memory and disk tiers' own counters are theirs: `memory().stats()`, `disk()`).
    pub fn stats(&self) -> TieredStats {
        self.baseline.apply(&self.raw_stats())
    }

    /// Zeroes these counters and the memory and disk tiers' event counters (a disk tier shared
    /// with other caches is reset for them too).
    pub fn reset_stats(&self) {
        self.baseline.reset(self.raw_stats());
        self.memory.reset_stats();
        if let Some(disk) = &self.disk {
            disk.reset_stats();
        }
    }

    fn raw_stats(&self) -> TieredStats {
        let counted = self.counters.snapshot();
        TieredStats {
            // Every L1 miss the disk does not answer is loaded from the remote or built.
            disk_misses: counted.builds + counted.remote_hits,
            ..counted
        }
    }

    /// Returns a lease on the value for `l1_key`: from memory; else loaded from the disk
    /// entry for the key `l2_key` makes; else built and written back to disk. `l2_key` runs
    /// only on an L1 miss with a disk tier, so a memory hit never pays for hashing the
    /// content; a key it cannot make leaves that lookup without the disk. `load` and `build`
    /// return the value and its L1 weight. A disk entry that `load` refuses is removed and the
    /// value built instead; a transient refusal (`BuildError::transient`: out of memory, say)
    /// keeps the entry and fails the lookup with that error. A disk miss waits for another
    /// process building the same entry, up to the disk tier's lock timeout, and reads what it
    /// wrote; when that process's build
    /// fails, this one builds too (and gets its own error). `serialize` runs on the calling
    /// thread; the write happens on the disk tier's background writer, and a failed one is
    /// counted, not returned. The entry written says it holds a value of backend `custom`;
    /// [`TieredCache::find_or_build_described`] says more.
    pub fn find_or_build<Q>(
        &self,
        l1_key: &Q,
        device: Option<DeviceId>,
        l2_key: impl FnOnce() -> Result<Key>,
        load: impl FnOnce(&[u8]) -> Built<V>,
        build: impl FnOnce() -> Built<V>,
        serialize: impl FnOnce(&V) -> std::result::Result<Vec<u8>, BuildError>,
    ) -> Result<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let described = |value: &V| Ok((serialize(value)?, Descriptor::default()));
        self.find_or_build_described(l1_key, device, l2_key, load, build, described)
    }

    /// [`TieredCache::find_or_build`] whose `serialize` also says what the value is (its
    /// backend, device and name), for the entry's header: `kcache ls` shows it and `kcache
    /// evict` selects by it.
    pub fn find_or_build_described<Q>(
        &self,
        l1_key: &Q,
        device: Option<DeviceId>,
        l2_key: impl FnOnce() -> Result<Key>,
        load: impl FnOnce(&[u8]) -> Built<V>,
        build: impl FnOnce() -> Built<V>,
        serialize: impl FnOnce(&V) -> std::result::Result<(Vec<u8>, Descriptor), BuildError>,
    ) -> Result<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let serialize = |value: &V| serialize(value).map(|(b, d)| (DiskBytes::from(b), d));
        self.tiers()
            .find_or_build(l1_key, device, l2_key, Some(load), build, serialize)
    }
}

impl<K, V> TieredCache<K, V> {
    /// Tells the disk tier what the memory tier did since the last report.
    fn report(&self, disk: &Persistence) {
        let memory = self.memory.raw_stats();
        self.reported.report(
            disk,
            // Builds are recorded where they happen (`Tiers::find_or_build`).
            Reported {
                memory_hits: memory.hits,
                memory_misses: memory.misses,
                builds: 0,
                ..Reported::default()
            },
        );
    }
}

impl<K, V> Drop for TieredCache<K, V> {
    /// The disk tier hears of this cache's lookups, which it persists when it flushes or
    /// goes (it may be shared, and outlive this cache).
    fn drop(&mut self) {
        if let Some(disk) = &self.disk {
            self.report(disk);
        }
    }
}

/// The tiered rules over borrowed tiers: a [`TieredCache`] lends its own; the C ABI, whose
/// caller pairs a memory tier with a disk tier on each lookup, lends those.
pub(crate) struct Tiers<'a, K, V> {
    pub memory: &'a MemoryCache<K, V>,
    pub disk: Option<&'a Persistence>,
    pub counters: &'a Arc<Counters>,
}

impl<K, V> Tiers<'_, K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    /// As [`TieredCache::find_or_build`]; without `load` the disk is written but never read
    /// (and no lock is taken: nothing could be read after the wait).
    pub fn find_or_build<Q>(
        &self,
        l1_key: &Q,
        device: Option<DeviceId>,
        l2_key: impl FnOnce() -> Result<Key>,
        load: Option<impl FnOnce(&[u8]) -> Built<V>>,
        build: impl FnOnce() -> Built<V>,
        serialize: impl FnOnce(&V) -> std::result::Result<(DiskBytes, Descriptor), BuildError>,
    ) -> Result<Lease<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut built: Option<BuiltHere> = None;
        let mut load = load;
        let lease = self.memory.find_or_make(l1_key, device, || {
            // The lock waits of this miss and of the lookups its build makes share one
            // lock timeout.
            let _lookup = one_lookup();
            let key = self.disk_key(l2_key);
            let (lock, remote_lease) = match (&key, self.disk) {
                (Some(key), Some(disk)) if load.is_some() => {
                    if let Some(loaded) = self.load_from_disk(disk, key, &mut load) {
                        return (loaded, Made::Loaded);
                    }
                    if let Some(loaded) = self.load_from_remote(disk, key, &mut load) {
                        return (loaded, Made::Loaded);
                    }
                    let lock = match disk.claim(key) {
                        Claim::Leader(lock) => Some(lock),
                        Claim::Published => {
                            if let Some(loaded) = self.load_from_disk(disk, key, &mut load) {
                                return (loaded, Made::Loaded);
                            }
                            None
                        }
                        Claim::Alone => None,
                    };
                    match disk.flight(key) {
                        Flight::Found(entry) => {
                            match self.load_remote_entry(disk, key, entry, lock, &mut load) {
                                Ok(loaded) => return (loaded, Made::Loaded),
                                Err(lock) => (lock, None),
                            }
                        }
                        Flight::Lead(remote_lease) => (lock, Some(remote_lease)),
                        Flight::Build => (lock, None),
                    }
                }
                _ => (None, None),
            };
            bump(&self.counters.builds, 1);
            if let Some(disk) = self.disk {
                // For the directory's counters: a miss, so no hit pays for it.
                disk.record(Reported {
                    builds: 1,
                    ..Reported::default()
                });
            }
            let started = Instant::now();
            let result = build();
            let build_time = started.elapsed();
            let result = match result {
                Ok(value) => {
                    built = key.map(|key| (build_time, key, lock, remote_lease));
                    Ok(value)
                }
                Err(e) => {
                    log::info(|| {
                        // The first line: a compiler log can run to pages.
                        let text = e.to_string();
                        let first = text.lines().next().unwrap_or_default();
                        match (&key, self.disk) {
                            (Some(key), Some(disk)) => format!("{}: {first}", disk.entry_name(key)),
                            _ => first.to_owned(),
                        }
                    });
                    // Processes waiting for this entry build themselves instead.
                    if let Some(lock) = lock {
                        lock.abandon();
                    }
                    Err(e)
                }
            };
            (result, Made::BuiltIn(build_time))
        })?;
        if let (Some((build_time, key, lock, remote_lease)), Some(disk)) = (built, self.disk) {
            match serialize(lease.value()) {
                Ok((bytes, descriptor)) => {
                    let counters = Arc::clone(self.counters);
                    // Other nodes waiting on the lease mark it: a write held back is then
                    // wanted, as when a process of this node waits.
                    let wanted = remote_lease.as_ref().map(|lease| lease.wanted());
                    let entry = (key, build_time, descriptor);
                    disk.write_back(entry, lock, bytes, wanted, move |written| {
                        // The entry is in the remote now (or will not be): other nodes
                        // waiting for it read it (or build).
                        drop(remote_lease);
                        let counter = if written {
                            &counters.write_backs
                        } else {
                            &counters.write_back_failures
                        };
                        bump(counter, 1);
                    });
                }
                Err(e) => {
                    log::info(|| {
                        format!(
                            "disk write of {} skipped: the value could not be serialized: {}",
                            disk.entry_name(&key),
                            e.message
                        )
                    });
                    bump(&self.counters.write_back_failures, 1);
                    if let Some(lock) = lock {
                        lock.abandon();
                    }
                }
            }
        }
        Ok(lease)
    }

    /// The L2 key, when there is a disk to use it with.
    fn disk_key(&self, l2_key: impl FnOnce() -> Result<Key>) -> Option<Key> {
        self.disk?;
        l2_key()
            .inspect_err(|e| {
                log::debug(|| format!("disk skipped: the disk key cannot be made: {e}"));
                bump(&self.counters.disk_errors, 1);
            })
            .ok()
    }

    /// The value loaded from the remote tier's entry for `l2_key` (which the disk tier keeps
    /// a copy of), if there is one `load` (taken then) accepts; `load`'s error when it is
    /// transient.
    fn load_from_remote(
        &self,
        disk: &Persistence,
        l2_key: &Key,
        load: &mut Option<impl FnOnce(&[u8]) -> Built<V>>,
    ) -> Option<Built<V>> {
        let entry = disk.fetch_shared(l2_key)?;
        self.load_remote_entry(disk, l2_key, entry, None, load).ok()
    }

    /// What `load` makes of a remote entry; an entry it accepts is copied to the disk, after
    /// which `lock` is released. A refused one gives `lock` back, for the build.
    fn load_remote_entry(
        &self,
        disk: &Persistence,
        l2_key: &Key,
        entry: Entry,
        lock: Option<KeyLock>,
        load: &mut Option<impl FnOnce(&[u8]) -> Built<V>>,
    ) -> std::result::Result<Built<V>, Option<KeyLock>> {
        match self.load_stored(disk, l2_key, entry.payload(), load, Stored::Remote) {
            Some(Ok(value)) => {
                disk.backfill(l2_key, entry, lock);
                Ok(Ok(value))
            }
            Some(Err(e)) => Ok(Err(e)),
            None => Err(lock),
        }
    }

    /// The value loaded from the entry for `l2_key`, if there is one `load` (taken then)
    /// accepts; `load`'s error when it is transient (`BuildError::transient`): the entry stays.
    fn load_from_disk(
        &self,
        disk: &Persistence,
        l2_key: &Key,
        load: &mut Option<impl FnOnce(&[u8]) -> Built<V>>,
    ) -> Option<Built<V>> {
        let entry = match disk.get(l2_key) {
            Ok(Some(entry)) => entry,
            // A corrupt entry was removed by the disk tier: as good as absent.
            Ok(None) | Err(Error::Integrity(_)) => {
                bump(&self.counters.disk_absent, 1);
                return None;
            }
            Err(_) => {
                bump(&self.counters.disk_errors, 1);
                return None;
            }
        };
        self.load_stored(disk, l2_key, entry.payload(), load, Stored::Disk)
    }

    /// `load` (taken) run on a verified payload: its value, its transient error, or `None`
    /// when it refused the payload (counted and logged; a refused disk entry is removed, the
    /// remote's is replaced when the rebuild is written).
    fn load_stored(
        &self,
        disk: &Persistence,
        l2_key: &Key,
        payload: &[u8],
        load: &mut Option<impl FnOnce(&[u8]) -> Built<V>>,
        stored: Stored,
    ) -> Option<Built<V>> {
        let load = load.take()?;
        match load(payload) {
            Ok(value) => {
                let counter = match stored {
                    Stored::Disk => &self.counters.disk_hits,
                    Stored::Remote => &self.counters.remote_hits,
                };
                bump(counter, 1);
                Some(Ok(value))
            }
            Err(e) if e.transient => Some(Err(e)),
            Err(e) => {
                log::debug(|| {
                    format!(
                        "{} miss: {}: the runtime refused the stored value (code {}): {}{}",
                        stored.name(),
                        disk.entry_name(l2_key),
                        e.code,
                        e.message,
                        if stored == Stored::Disk {
                            "; removed"
                        } else {
                            ""
                        }
                    )
                });
                bump(&self.counters.load_failures, 1);
                // A rebuild overwrites the entry anyway; this only counts as a disk error.
                if stored == Stored::Disk && disk.discard_unloadable(l2_key).is_err() {
                    bump(&self.counters.disk_errors, 1);
                }
                None
            }
        }
    }
}

/// What a build in this lookup leaves for its write-back: how long it took, its L2 key, the
/// entry's lock and a store's lease, each held until the entry is written.
type BuiltHere = (Duration, Key, Option<KeyLock>, Option<Box<dyn StoreLease>>);

/// Where a payload handed to `load` came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stored {
    Disk,
    Remote,
}

impl Stored {
    fn name(self) -> &'static str {
        match self {
            Stored::Disk => "disk",
            Stored::Remote => "remote",
        }
    }
}
