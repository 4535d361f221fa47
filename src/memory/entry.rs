//! Cached entries and the leases that pin them.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use super::shared::Shared;
use super::sync::{AtomicBool, AtomicU8, Ordering};
use crate::DeviceId;

/// One cached value. Owned jointly by the cache table (while linked) and by every lease; the
/// value is destroyed exactly once, by whoever lets go of the entry last.
///
/// Besides the reference count (which the `Arc` keeps on the cache line before the entry), a
/// hit reads `hash`, `key`, `chances` and `value`: they come first, in this order, and the
/// entry starts a cache line, so that they share one line (measured: 0.8 fewer L1 misses per
/// hit in the memory bench, `scripts/hit-cost`).
#[repr(C, align(64))]
pub struct Entry<K, V> {
    pub(super) hash: u64,
    key: K,
    /// Rounds the capacity policy's clock hand passes over this entry before evicting it:
    /// starts at the entry's cost class, is raised to one more than that by a hit, and drops by
    /// one each time the hand passes. With every class 0 this is CLOCK's second-chance bit.
    pub(super) chances: AtomicU8,
    /// 0 for builds under 1 ms, then one more per factor of ten (at most 3); always 0 unless
    /// the cache is cost-aware.
    cost_class: u8,
    /// False once unlinked from the table (clear, eviction, remove).
    pub(super) linked: AtomicBool,
    /// `Some` for the entry's whole observable life; taken only when the last owner destroys it.
    value: Option<V>,
    weight: u64,
    /// The devices whose eviction unlinks this entry: those named by the callers it was built
    /// for, sorted.
    devices: Box<[DeviceId]>,
    build_time: Duration,
    pub(super) shared: Arc<Shared<K, V>>,
}

impl<K, V> Entry<K, V> {
    pub(super) fn new(
        key: K,
        value: V,
        weight: u64,
        devices: Box<[DeviceId]>,
        build_time: Duration,
        hash: u64,
        shared: Arc<Shared<K, V>>,
    ) -> Self {
        let cost_class = if shared.cost_aware {
            cost_class(build_time)
        } else {
            0
        };
        Self {
            key,
            value: Some(value),
            weight,
            devices,
            build_time,
            hash,
            chances: AtomicU8::new(cost_class),
            cost_class,
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

    /// The devices the entry is recorded against: each caller that named a device and got
    /// this value, sorted. Evicting any of them unlinks the entry.
    pub fn devices(&self) -> &[DeviceId] {
        &self.devices
    }

    /// How long the build that produced this value took.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }

    pub(super) fn touch(&self) {
        // Read first: an entry already topped up costs no cache-line write on the hit path.
        let topped_up = self.cost_class + 1;
        if self.chances.load(Ordering::Relaxed) < topped_up {
            self.chances.store(topped_up, Ordering::Relaxed);
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
        if let Some(value) = self.value.take()
            && let Err(e) = self.shared.destroy(value)
        {
            self.shared.report_destroy_error(&e);
        }
    }
}

/// The most chances an entry can hold: the top cost class, plus one for a hit.
pub(super) const MAX_CHANCES: u8 = 4;

/// The cost class of a build: how many extra rounds of the clock hand its entry survives.
fn cost_class(build_time: Duration) -> u8 {
    match build_time.as_micros() {
        0..1_000 => 0,
        1_000..10_000 => 1,
        10_000..100_000 => 2,
        _ => 3,
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

    pub fn devices(&self) -> &[DeviceId] {
        self.entry.devices()
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
