//! The shared stores behind the disk tier, in order. A read asks each in turn and stops at
//! the first verified entry, which the stores before it get a copy of (a faster store then
//! answers the next node); a write goes to every store that takes writes; a flight takes the
//! lease of the first store that has one. Entries are sealed once, by the disk tier's sealer,
//! and verified by it on every read: no store is trusted more than the directory.

use std::sync::Arc;
use std::time::Duration;

use super::config::Stores;
use crate::directory_counters::DirectoryCounters;
use crate::disk::{Behind, Descriptor, Entry, Sealer};
use crate::key::Key;
use crate::metrics::Totals;
use crate::store::{Flight, RemoteStats, Store, StoreKind, flattened};

pub(super) struct Chain {
    sealer: Arc<Sealer>,
    stores: Vec<Arc<dyn Store>>,
    /// Whether a hit is copied to the stores before the one that had it.
    backfill: bool,
}

impl Chain {
    /// The stores `config` names, for entries tagged with an operator key when `keyed`; a
    /// store that cannot be used is left out (its module warns once).
    pub(super) fn open(config: Stores, keyed: bool, sealer: Arc<Sealer>) -> Arc<Chain> {
        let mut stores: Vec<Arc<dyn Store>> = Vec::new();
        let redis = config.remote.and_then(|c| crate::remote::open(c, keyed));
        let s3 = config
            .object_store
            .and_then(|c| crate::object_store::open(c, keyed));
        stores.extend(redis.into_iter().chain(s3));
        let rank = |s: &Arc<dyn Store>| config.order.iter().position(|&k| k == s.kind());
        stores.sort_by_key(rank);
        Arc::new(Chain {
            sealer,
            stores,
            backfill: config.backfill,
        })
    }

    /// The counters of the stores of `kind`, added up (a breaker open in any is open);
    /// `None` without one.
    pub(super) fn stats_of(&self, kind: StoreKind) -> Option<RemoteStats> {
        let any = self.stores.iter().any(|s| s.kind() == kind);
        any.then(|| self.sum(kind, |s| s.stats()))
    }

    /// What `of` counts of the stores of `kind`, added up (a breaker open in any is open).
    fn sum(&self, kind: StoreKind, of: impl Fn(&dyn Store) -> RemoteStats) -> RemoteStats {
        let of_kind = self.stores.iter().filter(|s| s.kind() == kind);
        of_kind.fold(RemoteStats::default(), |mut sum, store| {
            let stats = of(store.as_ref());
            sum.breaker_open |= stats.breaker_open;
            sum += stats;
            sum
        })
    }

    pub(super) fn stats(&self) -> Vec<(StoreKind, RemoteStats)> {
        self.stores.iter().map(|s| (s.kind(), s.stats())).collect()
    }

    pub(super) fn reset_stats(&self) {
        for store in &self.stores {
            store.reset_stats();
        }
    }

    pub(super) fn writes(&self) -> bool {
        self.stores.iter().any(|s| s.writes())
    }

    pub(super) fn get(&self, key: &Key) -> Option<Entry> {
        let name = self.sealer.entry_name(key);
        let verify = |bytes| self.sealer.verify(key, bytes).map_err(str::to_owned);
        for (i, store) in self.stores.iter().enumerate() {
            if let Some(entry) = store.get(&name, &verify) {
                let before = if self.backfill {
                    &self.stores[..i]
                } else {
                    &[]
                };
                for faster in before.iter().filter(|s| s.writes()) {
                    faster.put(&name, entry.sealed());
                }
                return Some(entry);
            }
        }
        None
    }

    pub(super) fn put(&self, key: &Key, payload: &[u8], build_time: Duration, d: &Descriptor) {
        let mut writers = self.stores.iter().filter(|s| s.writes()).peekable();
        if writers.peek().is_none() {
            return;
        }
        let name = self.sealer.entry_name(key);
        let sealed = self.sealer.sealed(key, payload, build_time, d);
        for store in writers {
            store.put(&name, &sealed);
        }
    }

    pub(super) fn flight(&self, key: &Key) -> Flight {
        let name = self.sealer.entry_name(key);
        let verify = |bytes| self.sealer.verify(key, bytes).map_err(str::to_owned);
        for store in &self.stores {
            match store.flight(&name, &verify) {
                Flight::Build => continue,
                decided => return decided,
            }
        }
        Flight::Build
    }
}

impl Behind for Chain {
    fn published(&self, key: &Key, payload: &[u8], build_time: Duration, d: &Descriptor) {
        self.put(key, payload, build_time, d);
    }

    fn counters(&self) -> DirectoryCounters {
        let raw = |kind| self.sum(kind, |s| s.raw_stats());
        let redis = flattened!(all DirectoryCounters, raw(StoreKind::Redis));
        flattened!(all s3 DirectoryCounters, raw(StoreKind::ObjectStore), redis)
    }
}

impl Chain {
    /// Adds every store's counters to the process's metrics.
    pub(super) fn add_to(&self, totals: &mut Totals) {
        for store in &self.stores {
            let stats = store.stats();
            if let Some(i) = StoreKind::ALL.iter().position(|&k| k == store.kind()) {
                totals.stores[i] += stats;
            }
            totals.remote_tiers += 1;
            totals.remote_breakers_open += u64::from(stats.breaker_open);
            totals.remote += stats;
        }
    }
}
