//! State shared by the cache and every entry that may outlive it: the sharded table, the
//! destroy callback and the counters.

use std::sync::Arc;

use hashbrown::HashTable;

use super::entry::Entry;
use super::flight::Flight;
use super::sync::{AtomicI64, AtomicU64, Ordering, RwLock};
use crate::DestroyError;

pub(super) type DestroyFn<V> = Box<dyn Fn(V) -> Result<(), DestroyError> + Send + Sync>;
pub(super) type ErrorHook = Arc<dyn Fn(&DestroyError) + Send + Sync>;

/// A table slot: a ready entry, or a build in flight that later lookups wait for.
pub(super) enum Slot<K, V> {
    Ready(Arc<Entry<K, V>>),
    Building {
        key: K,
        hash: u64,
        flight: Arc<Flight<K, V>>,
    },
}

impl<K, V> Slot<K, V> {
    pub(super) fn key(&self) -> &K {
        match self {
            Slot::Ready(entry) => entry.key(),
            Slot::Building { key, .. } => key,
        }
    }

    pub(super) fn hash(&self) -> u64 {
        match self {
            Slot::Ready(entry) => entry.hash,
            Slot::Building { hash, .. } => *hash,
        }
    }
}

/// One lock's worth of the table plus the counters its hits touch, on their own cache lines so
/// that threads working on different shards never write the same line.
#[repr(align(128))]
pub(super) struct Shard<K, V> {
    pub(super) table: RwLock<HashTable<Slot<K, V>>>,
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) leases: AtomicI64,
}

impl<K, V> Shard<K, V> {
    fn new() -> Self {
        Self {
            table: RwLock::new(HashTable::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            leases: AtomicI64::new(0),
        }
    }
}

/// Counters touched only off the hit path.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) builds: AtomicU64,
    pub(super) build_failures: AtomicU64,
    pub(super) waits: AtomicU64,
    pub(super) discarded: AtomicU64,
    pub(super) capacity_evictions: AtomicU64,
    pub(super) device_evictions: AtomicU64,
    pub(super) clears: AtomicU64,
    pub(super) destroys: AtomicU64,
    pub(super) destroy_errors: AtomicU64,
    pub(super) entries: AtomicU64,
    pub(super) weight: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(super) struct Shared<K, V> {
    pub(super) shards: Box<[Shard<K, V>]>,
    destroy: DestroyFn<V>,
    on_destroy_error: Option<ErrorHook>,
    pub(super) counters: Counters,
}

impl<K, V> Shared<K, V> {
    pub(super) fn new(
        shard_count: usize,
        destroy: DestroyFn<V>,
        on_destroy_error: Option<ErrorHook>,
    ) -> Self {
        Self {
            shards: (0..shard_count).map(|_| Shard::new()).collect(),
            destroy,
            on_destroy_error,
            counters: Counters::default(),
        }
    }

    pub(super) fn shard_of(&self, hash: u64) -> &Shard<K, V> {
        // The table uses the low bits of the hash; the shard the high ones.
        let index = (hash >> 58) as usize & (self.shards.len() - 1);
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
