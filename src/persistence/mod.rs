//! The persistent tiers as one chain: the disk tier first (`crate::disk`), then the shared
//! stores behind it in order (`crate::remote`: Redis). A lookup asks the disk, then each store;
//! a hit in a store is copied to the disk (and to the stores before it); a value built here
//! is written to the disk, then to every store that takes writes, on the disk tier's
//! background writer.
//!
//! - [`config`]: how the tiers are configured (explicit values, the environment, defaults).
//! - `chain`: the stores (`crate::store`) in order, and what the disk tier tells them.

mod chain;
pub mod config;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

pub use crate::store::StoreKind;
pub use config::{DirSource, PersistenceConfig};

use crate::disk::{Descriptor, Disk, DiskStats, Entry, KeyLock};
use crate::error::Result;
use crate::key::Key;
use crate::log;
use crate::metrics::{self, Source, Totals};
use crate::store::{Flight, RemoteStats};
use chain::Chain;

/// The persistent tiers, open: the disk tier and, when configured (`remote` in its
/// [`PersistenceConfig`], or `KCACHE_REMOTE_URL`), the shared stores behind it. One serves
/// every cache of a process that is handed it (OpenCL, CUDA, Vulkan, tiered lookups): one
/// writer thread, one set of locks, one connection per store, one set of counters. Share it
/// through an `Arc`; any number of processes may use the same directory at once.
///
/// It dereferences to its disk tier ([`Disk`]), which every chain has first: reads, writes,
/// listings and the directory's counters are the disk tier's.
pub struct Persistence {
    disk: Disk,
    chain: Arc<Chain>,
    /// Keeps the tiers in the process's metrics exactly as long as the handle lives (the
    /// disk tier's background writer and scan live on for a while after it is dropped).
    _listed: Arc<Listed>,
}

/// The tiers as the process's metrics see them.
struct Listed {
    disk: Box<dyn Fn() -> DiskStats + Send + Sync>,
    chain: Arc<Chain>,
}

impl Persistence {
    /// Opens (creating if needed, mode 0700) and checks the directory, then the stores
    /// configured behind it (which connect on first use, so opening never waits for them).
    /// Refusals: `Unavailable` (disabled, no directory configured), `Untrusted` (with one
    /// warning per process, see [`crate::log`]), `InvalidArgument` (bad size or key), `Io`.
    /// Every refusal is logged at `debug` (`disk tier off: …`). A store that cannot be used is
    /// left out of the chain, with one warning.
    pub fn open(config: PersistenceConfig) -> Result<Persistence> {
        Self::open_chain(config).inspect_err(|e| log::debug(|| format!("disk tier off: {e}")))
    }

    fn open_chain(config: PersistenceConfig) -> Result<Persistence> {
        let (resolved, stores) = config.resolve()?;
        let keyed = resolved.key.is_some();
        let disk = Disk::open(resolved)?;
        let chain = Chain::open(stores, keyed, Arc::clone(disk.sealer()));
        disk.set_behind(Arc::clone(&chain) as _);
        let listed = Arc::new(Listed {
            disk: Box::new(disk.raw_stats_source()),
            chain: Arc::clone(&chain),
        });
        metrics::register(Arc::downgrade(&listed) as _);
        Ok(Persistence {
            disk,
            chain,
            _listed: listed,
        })
    }

    /// The disk tier, the first of the chain.
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// The Redis tier's counters since `open` or the last reset; `None` without one.
    pub fn remote_stats(&self) -> Option<RemoteStats> {
        self.chain.stats_of(StoreKind::Redis)
    }

    /// The object store's counters since `open` or the last reset; `None` without one.
    pub fn object_store_stats(&self) -> Option<RemoteStats> {
        self.chain.stats_of(StoreKind::ObjectStore)
    }

    /// Every store behind the disk tier, in the chain's order, with its counters since `open`
    /// or the last reset.
    pub fn store_stats(&self) -> Vec<(StoreKind, RemoteStats)> {
        self.chain.stats()
    }

    /// Zeroes the event counters of the disk tier and of every store (not the gauges, nor
    /// the directory's counters: see [`Disk::zero_directory_stats`]).
    pub fn reset_stats(&self) {
        self.disk.reset_stats();
        self.chain.reset_stats();
    }

    /// The verified entry for `key` from the first store behind the disk that has one; the
    /// stores before it get a copy (the disk gets one when the caller loads it: `backfill`).
    pub(crate) fn fetch_shared(&self, key: &Key) -> Option<Entry> {
        self.chain.get(key)
    }

    /// Whether entries written here go to a store behind the disk too.
    pub(crate) fn shares(&self) -> bool {
        self.chain.writes()
    }

    /// Writes `payload`, already the disk's entry for `key`, to the stores on the background
    /// writer, as a built value's entry is (Vulkan's pipeline-cache data, which is written to
    /// disk by its own read-merge-write).
    pub(crate) fn share_later(
        &self,
        key: &Key,
        payload: Vec<u8>,
        build_time: Duration,
        descriptor: Descriptor,
    ) {
        let chain = Arc::clone(&self.chain);
        let key = *key;
        self.disk
            .later(move || chain.put(&key, &payload, build_time, &descriptor));
    }

    /// After a miss everywhere: lead the build of `key` for every node sharing a store, or
    /// get the entry another node built meanwhile, or build without a lease. Without a store
    /// that has leases: build.
    pub(crate) fn flight(&self, key: &Key) -> Flight {
        self.chain.flight(key)
    }

    /// Writes an entry a store handed back, once loaded, to the disk on the background writer,
    /// then releases `lock`.
    pub(crate) fn backfill(&self, key: &Key, entry: Entry, lock: Option<KeyLock>) {
        self.disk.copy_in(key, entry, lock);
    }
}

impl Source for Listed {
    fn add_to(&self, totals: &mut Totals) {
        totals.disk_tiers += 1;
        totals.disk += (self.disk)();
        self.chain.add_to(totals);
    }
}

impl Deref for Persistence {
    type Target = Disk;

    fn deref(&self) -> &Disk {
        &self.disk
    }
}
