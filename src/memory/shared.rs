//! State shared by the cache and every entry that may outlive it: the sharded table, the
//! destroy callback and the counters.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use hashbrown::HashTable;

use super::entry::Entry;
use super::flight::Flight;
use super::policy::Clock;
use super::stats::counters;
use super::sync::{AtomicU64, Mutex, Ordering, RwLock};
use super::tally::Tally;
#[cfg(not(feature = "shuttle"))]
use crate::ffi::process::{ForkLocked, Held};
use crate::{DestroyError, DeviceId};

pub(super) type DestroyFn<V> = Box<dyn Fn(V) -> Result<(), DestroyError> + Send + Sync>;
pub(super) type ErrorHook = Arc<dyn Fn(&DestroyError) + Send + Sync>;

/// A table slot: a ready entry, or a build in flight that later lookups wait for. Two words
/// wide: a build's key is boxed, so that the table a hit probes stays small.
pub(super) enum Slot<K, V> {
    Ready(Arc<Entry<K, V>>),
    Building(Box<Building<K, V>>),
}

/// A key being built: the key (moved into the entry at install) and its flight.
pub(super) struct Building<K, V> {
    pub(super) key: K,
    pub(super) hash: u64,
    pub(super) flight: Arc<Flight<K, V>>,
    /// The builder's: an eviction of its device, or a clear of a borrowing cache, after it
    /// dooms this build, and detaches it.
    pub(super) snapshot: Snapshot,
    /// The device and its eviction epoch at arrival of each waiter that named a device, in
    /// ticket order: the install records the value against those not evicted meanwhile.
    pub(super) waiters: Vec<(DeviceId, u64)>,
}

/// What a caller saw at its miss (or at its arrival at a build in flight), checked again when
/// the build ends: its device's eviction epoch and the cache's clear generation.
#[derive(Clone, Copy)]
pub(super) struct Snapshot {
    pub(super) device_epoch: Option<(DeviceId, u64)>,
    pub(super) generation: u64,
}

impl<K, V> Slot<K, V> {
    pub(super) fn key(&self) -> &K {
        match self {
            Slot::Ready(entry) => entry.key(),
            Slot::Building(building) => &building.key,
        }
    }

    /// Whether this slot holds `key`, whose hash is `hash`. The full hash is compared first, so
    /// a slot that only shares the table's 7-bit tag costs no visit to its key's bytes.
    #[inline]
    pub(super) fn matches<Q>(&self, hash: u64, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.hash() == hash && self.key().borrow() == key
    }

    pub(super) fn hash(&self) -> u64 {
        match self {
            Slot::Ready(entry) => entry.hash,
            Slot::Building(building) => building.hash,
        }
    }
}

/// One lock's worth of the table, on its own cache lines so that threads working on different
/// shards never write the same line.
#[repr(align(128))]
pub(super) struct Shard<K, V> {
    pub(super) table: RwLock<HashTable<Slot<K, V>>>,
}

impl<K, V> Shard<K, V> {
    fn new() -> Self {
        Self {
            table: RwLock::new(HashTable::new()),
        }
    }
}

counters! {
    /// Counters touched only off the hit path.
    pub(super) struct Counters {
        builds, loads, build_failures, waits, discarded, capacity_evictions, device_evictions,
        clears, destroys, destroy_errors, entries, weight,
    }
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(super) struct Shared<K, V> {
    pub(super) shards: Box<[Shard<K, V>]>,
    destroy: DestroyFn<V>,
    on_destroy_error: Option<ErrorHook>,
    /// Entries' eviction chances depend on their build time (see `policy.rs`).
    pub(super) cost_aware: bool,
    /// Shared with the cache's metrics source (`metrics.rs`).
    pub(super) counters: Arc<Counters>,
    pub(super) tally: Tally,
    /// Entries unlinked from the table that may still be leased. Leases are plain strong
    /// references (so hits and releases touch no counter); the statistics find them here and
    /// in the table.
    detached: Mutex<Detached<K, V>>,
    /// Eviction epoch of every device ever evicted; absent means 0.
    pub(super) epochs: Mutex<HashMap<DeviceId, u64>>,
    /// Only consulted when a cap is set.
    pub(super) clock: Mutex<Clock<K, V>>,
}

struct Detached<K, V> {
    entries: Vec<Weak<Entry<K, V>>>,
    /// Length after the last pruning: prune again once it has doubled, so pushes stay O(1)
    /// amortized and dead weak references cannot pile up.
    pruned_len: usize,
}

impl<K, V> Shared<K, V> {
    pub(super) fn new(
        shard_count: usize,
        destroy: DestroyFn<V>,
        on_destroy_error: Option<ErrorHook>,
        cost_aware: bool,
    ) -> Self {
        Self {
            shards: (0..shard_count).map(|_| Shard::new()).collect(),
            destroy,
            on_destroy_error,
            cost_aware,
            counters: Arc::default(),
            tally: Tally::new(),
            detached: Mutex::new(Detached {
                entries: Vec::new(),
                pruned_len: 0,
            }),
            epochs: Mutex::new(HashMap::new()),
            clock: Mutex::new(Clock::new()),
        }
    }

    pub(super) fn detach(&self, entry: &Arc<Entry<K, V>>) {
        let mut detached = self.detached.lock();
        if detached.entries.len() >= 2 * detached.pruned_len.max(32) {
            detached.entries.retain(|weak| weak.strong_count() > 0);
            detached.pruned_len = detached.entries.len();
        }
        detached.entries.push(Arc::downgrade(entry));
    }

    /// Leases outstanding: every strong reference to an entry but the table's own. Exact when
    /// no call is in progress; transient references held inside a call count meanwhile.
    pub(super) fn outstanding_leases(&self) -> u64 {
        let mut leases = 0;
        for shard in self.shards.iter() {
            for slot in shard.table.read().iter() {
                if let Slot::Ready(entry) = slot {
                    leases += Arc::strong_count(entry) - 1;
                }
            }
        }
        let detached = self.detached.lock();
        leases += detached
            .entries
            .iter()
            .map(Weak::strong_count)
            .sum::<usize>();
        leases as u64
    }

    pub(super) fn shard_of(&self, hash: u64) -> &Shard<K, V> {
        // The table takes its bucket index from the low bits and its 7-bit tag from the top
        // ones; the shard must use neither, or every key in a shard would share a tag and each
        // probe would compare keys.
        let index = (hash >> 32) as usize & (self.shards.len() - 1);
        &self.shards[index]
    }

    /// Runs the destroy callback and counts the outcome. Never called under a cache lock.
    pub(super) fn destroy(&self, value: V) -> Result<(), DestroyError> {
        bump(&self.counters.destroys);
        let result = (self.destroy)(value);
        if result.is_err() {
            bump(&self.counters.destroy_errors);
        }
        result
    }

    /// For destroy failures that have no caller to return to.
    pub(super) fn report_destroy_error(&self, error: &DestroyError) {
        if let Some(hook) = &self.on_destroy_error {
            hook(error);
        }
    }
}

/// A fork waits until no other thread holds a lock of the cache, and takes them all, so that
/// the child inherits none held by a thread it does not have. The order is that of the
/// cache's own nesting: a shard's table before the epochs (`install`) and the detached list
/// (`unlinked`); the clock is never held with another.
#[cfg(not(feature = "shuttle"))]
impl<K: Send + Sync, V: Send + Sync> ForkLocked for Shared<K, V> {
    fn lock_for_fork(&self) -> Box<dyn Held + '_> {
        let tables: Vec<_> = self
            .shards
            .iter()
            .map(|shard| shard.table.write())
            .collect();
        Box::new((
            tables,
            self.epochs.lock(),
            self.clock.lock(),
            self.detached.lock(),
        ))
    }
}
