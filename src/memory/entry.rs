//! Cached entries and the leases that pin them.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use super::shared::Shared;
use super::sync::{AtomicBool, Ordering};
use crate::DeviceId;

/// One cached value. Owned jointly by the cache table (while linked) and by every lease; the
/// value is destroyed exactly once, by whoever lets go of the entry last.
pub struct Entry<K, V> {
    key: K,
    /// `Some` for the entry's whole observable life; taken only when the last owner destroys it.
    value: Option<V>,
    weight: u64,
    device: Option<DeviceId>,
    build_time: Duration,
    pub(super) hash: u64,
    /// Set by hits, cleared by the capacity policy's clock hand: a second chance.
    pub(super) referenced: AtomicBool,
    /// False once unlinked from the table (clear, eviction, remove).
    pub(super) linked: AtomicBool,
    pub(super) shared: Arc<Shared<K, V>>,
}

impl<K, V> Entry<K, V> {
    pub(super) fn new(
        key: K,
        value: V,
        weight: u64,
        device: Option<DeviceId>,
        build_time: Duration,
        hash: u64,
        shared: Arc<Shared<K, V>>,
    ) -> Self {
        Self {
            key,
            value: Some(value),
            weight,
            device,
            build_time,
            hash,
            referenced: AtomicBool::new(false),
            linked: AtomicBool::new(true),
            shared,
        }
    }

    pub fn key(&self) -> &K {
        &self.key
    }

    pub fn value(&self) -> &V {
        self.value
            .as_ref()
            .expect("an entry's value is only taken by its last owner")
    }

    pub fn weight(&self) -> u64 {
        self.weight
    }

    pub fn device(&self) -> Option<DeviceId> {
        self.device
    }

    /// How long the build that produced this value took.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }

    pub(super) fn touch(&self) {
        // Read first: an already-set bit costs no cache-line write on the hit path.
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }

    /// Destroys the value now, for a caller that holds the only reference.
    pub(super) fn destroy_now(mut self) -> Result<(), crate::DestroyError> {
        match self.value.take() {
            Some(value) => self.shared.destroy(value),
            None => Ok(()),
        }
    }
}

impl<K, V> Drop for Entry<K, V> {
    /// The deferred path: the last lease (or a transient holder) of an unlinked entry.
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            if let Err(e) = self.shared.destroy(value) {
                self.shared.report_destroy_error(&e);
            }
        }
    }
}

/// A reference-counted hold on one cached value. While any lease exists the value is not
/// destroyed, even if the entry has been cleared or evicted meanwhile. Dropping the lease
/// releases it; cloning takes another.
pub struct Lease<K, V> {
    entry: Arc<Entry<K, V>>,
}

impl<K, V> Lease<K, V> {
    pub(super) fn new(entry: Arc<Entry<K, V>>) -> Self {
        Self { entry }
    }

    pub fn entry(&self) -> &Entry<K, V> {
        &self.entry
    }

    pub fn key(&self) -> &K {
        self.entry.key()
    }

    pub fn value(&self) -> &V {
        self.entry.value()
    }

    pub fn weight(&self) -> u64 {
        self.entry.weight()
    }

    pub fn device(&self) -> Option<DeviceId> {
        self.entry.device()
    }

    pub fn build_time(&self) -> Duration {
        self.entry.build_time()
    }

    /// Turns the lease into its entry's reference count, for callers that must carry it as a
    /// raw pointer (the C ABI). The lease stays outstanding until [`Lease::from_arc`] gives it
    /// back and the result is dropped. A lease *is* one strong reference: the statistics count
    /// outstanding leases from the reference counts, so a hit and a release touch no counter.
    pub fn into_arc(self) -> Arc<Entry<K, V>> {
        self.entry
    }

    /// Reverses [`Lease::into_arc`].
    pub fn from_arc(entry: Arc<Entry<K, V>>) -> Self {
        Self { entry }
    }
}

impl<K, V> Clone for Lease<K, V> {
    fn clone(&self) -> Self {
        Self::new(Arc::clone(&self.entry))
    }
}

impl<K, V> Deref for Lease<K, V> {
    type Target = V;

    fn deref(&self) -> &V {
        self.value()
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for Lease<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", self.key())
            .field("value", self.value())
            .field("weight", &self.weight())
            .finish()
    }
}
