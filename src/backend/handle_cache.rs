//! The lookup every backend shares, written once: the caller's handles registered under the
//! numbers the memory tier evicts by ([`Registry`]), the memory key assembled in a per-thread
//! buffer, memory → disk → remote → build through [`TieredCache`], eviction, and the tiers' counters.
//! A backend supplies only its runtime calls, through [`Runtime`]; a new tier or counter is
//! added here, for all of them.

use std::cell::Cell;
use std::sync::Arc;

use crate::Persistence;
use crate::backend::registry::{Registration, Registry};
use crate::disk::Reported;
use crate::disk::{Descriptor, DiskBytes, DiskStats};
use crate::error::{BuildError, DestroyError, Error, Result};
use crate::headers::Unknowable;
use crate::key::Key;
use crate::log::{self, Warning};
use crate::memory::{self, Built, Lease, MemoryCache};
use crate::metrics::Backend;
use crate::tiered::TieredCache;

/// How a cached value gives back its runtime object. The memory tier calls it once, when the
/// value has left the cache and its last lease is gone; every backend's value type destroys
/// itself this one way.
pub trait Destroy {
    fn destroy(self) -> std::result::Result<(), DestroyError>;
}

/// A value a [`Runtime`] built, with what the disk tier keeps of it. The bytes are arranged
/// for when the value is made because a live object cannot always give them back later (a
/// loaded `CUmodule` has no cubin to return); they may be made later, on the disk tier's
/// background writer, when asking the driver for them is slow (an OpenCL program binary).
pub struct Compiled<V> {
    pub value: V,
    /// The value's weight in the memory tier's `max_weight`.
    pub weight: u64,
    /// The serialized value for the disk tier; `None` leaves the disk without it.
    pub bytes: Option<DiskBytes>,
    /// What the entry says it holds: the backend's short name, the device's name and the
    /// value's (see [`Descriptor`]).
    pub descriptor: Descriptor,
}

/// The runtime calls of one backend.
pub trait Runtime: Send + Sync + 'static {
    /// The caller's handle a registration stands for (a context, a (context, device) pair, a
    /// device), by value so that it can be compared after the caller released it.
    type Handle: std::hash::Hash + Eq + Copy + Send + Sync + 'static;
    /// What the backend learns about a handle when it registers it: what the disk key needs
    /// (the device's identity) and what builds need.
    type Info: Send + Sync + 'static;
    type Value: Destroy + Send + Sync + 'static;
    /// What one value is built from.
    type Input<'a>: Copy;

    /// The `backend` label of this backend's caches in the metrics.
    const BACKEND: Backend;

    /// Queries the runtime about the handle of a lookup seen for the first time, through the
    /// lookup's input (which holds the live handle).
    fn describe(&self, input: Self::Input<'_>) -> Result<Self::Info>;

    /// Appends what identifies `input` among the values of one registration to the memory key
    /// (after the registration's number). Runs on every lookup: it must not allocate beyond the
    /// buffer's growth, and should not hash.
    fn memory_key(key: &mut Vec<u8>, input: Self::Input<'_>);

    /// The disk key of `input` on the registered handle: content and device identity, no
    /// handle, so that it holds across processes. Made only on a memory miss with a disk.
    fn disk_key(&self, info: &Self::Info, input: Self::Input<'_>) -> Result<Key>;

    /// Makes the value from bytes the disk tier kept; a refusal removes the entry and builds.
    fn load(
        &self,
        registered: &Registration<Self::Handle, Self::Info>,
        input: Self::Input<'_>,
        stored: &[u8],
    ) -> Built<Self::Value>;

    /// Compiles the value from `input`.
    fn build(
        &self,
        registered: &Registration<Self::Handle, Self::Info>,
        input: Self::Input<'_>,
    ) -> std::result::Result<Compiled<Self::Value>, BuildError>;
}

/// What a lookup returns: the value stays alive while any lease on it is held, even across
/// eviction.
pub type ValueLease<R> = Lease<Vec<u8>, <R as Runtime>::Value>;

/// One registered handle of a backend.
pub type Registered<R> = Registration<<R as Runtime>::Handle, <R as Runtime>::Info>;

/// The counters every backend has: the memory tier's and the disk tier's, and what the tiers
/// did on memory misses. Each backend reports them under its own names (a "binary load" in
/// OpenCL is a "cubin load" in CUDA).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    pub memory: memory::Stats,
    /// Values made from a stored entry: the disk tier's, or the remote tier's behind it.
    pub loads: u64,
    /// Disk entries the runtime refused; each was removed and the value built instead.
    pub rejected: u64,
    /// Disk lookups that found an entry (loaded or refused).
    pub disk_hits: u64,
    /// Disk lookups that found none.
    pub disk_misses: u64,
    /// Disk reads or writes that failed; the lookup went on without the disk.
    pub disk_errors: u64,
    /// The disk tier's own counters, all zero without one.
    pub disk: DiskStats,
}

impl TierStats {
    /// The share of lookups that compiled nothing: memory hits and disk loads over the memory
    /// tier's lookups; `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::backend::hit_rate(&self.memory, self.loads)
    }
}

thread_local! {
    /// The memory key is assembled here so that a hit allocates nothing. One buffer serves
    /// every backend: a lookup takes it and puts it back before it returns.
    static KEY_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// A backend's cache: its runtime, its registered handles and its tiers.
pub struct HandleCache<R: Runtime> {
    runtime: R,
    tiered: TieredCache<Vec<u8>, R::Value>,
    registry: Registry<R::Handle, R::Info>,
}

impl<R: Runtime> HandleCache<R> {
    /// The memory tier destroys values through [`Destroy`]; `disk: None` is memory only.
    pub fn new(runtime: R, memory: memory::Options, disk: Option<Arc<Persistence>>) -> Self {
        let memory = Arc::new(MemoryCache::for_backend(
            R::BACKEND,
            memory,
            <R::Value as Destroy>::destroy,
        ));
        HandleCache {
            runtime,
            tiered: TieredCache::new(memory, disk),
            registry: Registry::default(),
        }
    }

    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    pub fn memory(&self) -> &MemoryCache<Vec<u8>, R::Value> {
        self.tiered.memory()
    }

    pub fn disk(&self) -> Option<&Arc<Persistence>> {
        self.tiered.disk()
    }

    /// The value for `input` on `handle`, registering `handle` on first sight: from memory,
    /// else from disk, else built; concurrent misses on one value share one build. Inline, as
    /// the memory tier's hit path is: in another codegen unit than its caller, a hit paid for a
    /// call and a copy of `input`.
    #[inline]
    pub fn find_or_build(&self, handle: R::Handle, input: R::Input<'_>) -> Result<ValueLease<R>> {
        let mut key = KEY_BUFFER.take();
        // A hit touches neither the registration's reference count nor any other shared word.
        let hit = self.registry.probe(handle, |registered| {
            memory_key::<R>(&mut key, registered, input);
            self.memory().probe(&key[..])
        });
        if let Some(lease) = hit {
            KEY_BUFFER.set(key);
            return Ok(lease);
        }
        // (An error here drops the key buffer: the next lookup just allocates a new one.)
        let registered = self
            .registry
            .get_or_register(handle, || self.runtime.describe(input))?;
        let found = self.miss(&registered, input, key);
        registered.confirm(self.memory(), found)
    }

    /// As [`HandleCache::find_or_build`] for a registration the caller holds (a backend whose
    /// caller registers devices explicitly): no registry lookup on the way.
    pub fn find_or_build_registered(
        &self,
        registered: &Registered<R>,
        input: R::Input<'_>,
    ) -> Result<ValueLease<R>> {
        if registered.is_evicted() {
            return Err(Error::DeviceDestroyed(registered.id()));
        }
        let mut key = KEY_BUFFER.take();
        memory_key::<R>(&mut key, registered, input);
        if let Some(lease) = self.memory().probe(&key[..]) {
            KEY_BUFFER.set(key);
            return Ok(lease);
        }
        let found = self.miss(registered, input, key);
        registered.confirm(self.memory(), found)
    }

    /// The tiered lookup after a memory miss; puts `key` back into the thread's buffer.
    fn miss(
        &self,
        registered: &Registered<R>,
        input: R::Input<'_>,
        mut key: Vec<u8>,
    ) -> Result<ValueLease<R>> {
        memory_key::<R>(&mut key, registered, input);
        // A build hands its serialized value to the write-back here, so it is made once.
        let bytes = Cell::new(None);
        let found = self.tiered.tiers().find_or_build(
            &key[..],
            Some(registered.id()),
            || self.runtime.disk_key(registered.info(), input),
            Some(|stored: &[u8]| self.runtime.load(registered, input, stored)),
            || {
                // A registration evicted before this flight began builds nothing: its handle
                // may already be gone. `confirm` turns the refusal into `DeviceDestroyed`.
                if registered.is_evicted() {
                    return Err(BuildError::new(0, "the device was unregistered"));
                }
                let compiled = self.runtime.build(registered, input)?;
                bytes.set(compiled.bytes.map(|b| (b, compiled.descriptor)));
                Ok((compiled.value, compiled.weight))
            },
            |_| {
                bytes
                    .take()
                    .ok_or_else(|| BuildError::new(0, "the runtime gave no bytes to store"))
            },
        );
        KEY_BUFFER.set(key);
        found
    }

    /// Says that a build is passed through because of `why`: once per process in the log, each
    /// time in the directory's counters.
    pub fn passed_through(&self, why: &Unknowable) {
        log::warn_once(Warning::PassedThrough, || {
            format!(
                "{}: a build is compiled and not cached, since kcache cannot know all it reads: \
                 {why}; later ones are counted as passed through, not logged",
                R::BACKEND.name()
            )
        });
        if let Some(disk) = self.disk() {
            disk.record(Reported {
                passed_through: 1,
                ..Reported::default()
            });
        }
    }

    /// Builds `input` on `handle` and caches it nowhere: for a lookup whose inputs the backend
    /// cannot key, which no later lookup may be served. The lease is the value's one holder.
    pub fn build_unlisted(&self, handle: R::Handle, input: R::Input<'_>) -> Result<ValueLease<R>> {
        let registered = self
            .registry
            .get_or_register(handle, || self.runtime.describe(input))?;
        let compiled = self
            .runtime
            .build(&registered, input)
            .map_err(Error::Build)?;
        Ok(self
            .memory()
            .unlisted(Vec::new(), compiled.value, compiled.weight))
    }

    /// Registers a handle whose description the caller made; `Err(info)` when it is
    /// registered already.
    pub fn register(
        &self,
        handle: R::Handle,
        info: R::Info,
    ) -> std::result::Result<Arc<Registered<R>>, R::Info> {
        self.registry.register(handle, info)
    }

    /// Unregisters every handle `doomed` picks and unlinks all their values; each is destroyed
    /// now, or when its last lease is released. Returns how many were unlinked.
    pub fn evict(&self, doomed: impl Fn(&Registered<R>) -> bool) -> Result<usize> {
        self.registry.evict(self.memory(), doomed)
    }

    /// Unregisters every handle `doomed` picks and returns them, for a backend with its own
    /// teardown to run before [`HandleCache::evict_registrations`].
    pub fn take(&self, doomed: impl Fn(&Registered<R>) -> bool) -> Vec<Arc<Registered<R>>> {
        self.registry.take(doomed)
    }

    /// Unlinks every value of registrations [`HandleCache::take`] returned.
    pub fn evict_registrations(&self, taken: &[Arc<Registered<R>>]) -> Result<usize> {
        self.memory().evict_devices(taken.iter().map(|r| r.id()))
    }

    /// Waits until every value built so far is written to the disk tier (or failed to be).
    pub fn flush(&self) {
        self.tiered.flush();
    }

    /// Unlinks every value; each is destroyed when its last lease is released.
    pub fn clear(&self) -> Result<usize> {
        self.memory().clear()
    }

    /// Values in memory now.
    pub fn len(&self) -> usize {
        self.memory().len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory().is_empty()
    }

    /// Zeroes the tiers' event counters (a disk tier shared with other caches is reset for
    /// them too); see [`crate::stats`].
    pub fn reset_stats(&self) {
        self.tiered.reset_stats();
    }

    pub fn stats(&self) -> TierStats {
        let tiers = self.tiered.stats();
        TierStats {
            memory: self.memory().stats(),
            loads: tiers.disk_hits + tiers.remote_hits,
            rejected: tiers.load_failures,
            // An entry the runtime refused was still found on disk.
            disk_hits: tiers.disk_hits + tiers.load_failures,
            disk_misses: tiers.disk_absent,
            disk_errors: tiers.disk_errors + tiers.write_back_failures,
            disk: self.disk().map(|d| d.stats()).unwrap_or_default(),
        }
    }
}

impl<R: Runtime> Drop for HandleCache<R> {
    /// Writes of values built here finish before the cache is gone, even when the disk tier
    /// is shared and outlives it: they may hold the runtime's objects (a retained program).
    fn drop(&mut self) {
        self.flush();
    }
}

/// The calls every backend cache (a struct whose skeleton is its `cache` field) answers the
/// same way, written once for all of them.
macro_rules! common_calls {
    () => {
        /// Unlinks every entry (the disk keeps its data); each is destroyed now, or when its
        /// last lease is released. Returns how many were unlinked.
        pub fn clear(&self) -> $crate::Result<usize> {
            self.cache.clear()
        }

        /// Entries in memory now.
        pub fn len(&self) -> usize {
            self.cache.len()
        }

        pub fn is_empty(&self) -> bool {
            self.cache.is_empty()
        }
    };
}
pub(crate) use common_calls;

/// The memory key: the registration's number stands for the handle, then the runtime's part.
fn memory_key<R: Runtime>(key: &mut Vec<u8>, registered: &Registered<R>, input: R::Input<'_>) {
    key.clear();
    key.extend_from_slice(&registered.id().to_le_bytes());
    R::memory_key(key, input);
}
