//! Figures the disk tier cannot see itself, handed to it by the caches in front of it (the
//! memory tier's lookups, builds), which it persists with its own.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Disk;

/// Figures the disk tier cannot see itself, handed to it by the caches in front of it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reported {
    pub memory_hits: u64,
    pub memory_misses: u64,
    pub builds: u64,
    pub passed_through: u64,
}

/// What a cache in front of a disk tier has reported to it so far, so that it reports only
/// what is new. Lock-free, so that a fork never leaves it held: each figure only grows, and
/// whoever raises the mark reports what lies between the old mark and the new.
#[derive(Default)]
pub(crate) struct Reporter {
    memory_hits: AtomicU64,
    memory_misses: AtomicU64,
    builds: AtomicU64,
}

impl Reporter {
    /// Hands `disk` what `total` (the cache's figures since it was created) adds to the last
    /// report.
    pub(crate) fn report(&self, disk: &Disk, total: Reported) {
        let new = |mark: &AtomicU64, total: u64| {
            total.saturating_sub(mark.fetch_max(total, Ordering::Relaxed))
        };
        disk.record(Reported {
            memory_hits: new(&self.memory_hits, total.memory_hits),
            memory_misses: new(&self.memory_misses, total.memory_misses),
            builds: new(&self.builds, total.builds),
            passed_through: 0,
        });
    }
}

impl Disk {
    /// Adds figures of the caches in front of this disk tier (the memory tier's lookups,
    /// builds) to what the next flush persists.
    pub(crate) fn record(&self, figures: Reported) {
        let c = &self.inner.counters;
        super::bump(&c.memory_hits, figures.memory_hits);
        super::bump(&c.memory_misses, figures.memory_misses);
        super::bump(&c.builds, figures.builds);
        super::bump(&c.passed_through, figures.passed_through);
    }
}
