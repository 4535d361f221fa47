//! What every cache's statistics share: the hit rate, and a reset that zeroes event counters
//! without touching the counters themselves.
//!
//! A reset records a baseline (the counters' values at the reset) that each later snapshot
//! subtracts. The counters keep counting: an increment made while a reset runs lands either
//! before the baseline (and is reset) or after it (and shows), never nowhere; the memory tier's
//! per-thread hit tallies, which only their own thread may write, need no cross-thread write;
//! and the per-directory counters (`disk::shards`) go on adding what happened since their last
//! write. Gauges (entries, bytes, leases, pending writes) are never subtracted.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// `hits / (hits + misses)`, or `None` when there was no lookup at all.
pub fn hit_rate(hits: u64, misses: u64) -> Option<f64> {
    let lookups = hits.saturating_add(misses);
    (lookups > 0).then(|| hits as f64 / lookups as f64)
}

/// `hits / (hits + misses)` for a backend: hits are lookups that compiled nothing (memory hits
/// and values loaded from disk, `loads`), over the memory tier's lookups (`hits + misses`:
/// every load is a memory miss). `None` before the first lookup.
pub(crate) fn backend_hit_rate(memory: &crate::memory::Stats, loads: u64) -> Option<f64> {
    hit_rate(
        memory.hits.saturating_add(loads),
        memory.misses.saturating_sub(loads),
    )
}

/// Zeroes counters that only atomic adds touch (a backend's own), each with one atomic swap:
/// an add made meanwhile lands before the swap (and is reset) or after it (and shows).
pub(crate) fn zero(counters: &[&AtomicU64]) {
    for counter in counters {
        counter.swap(0, Ordering::Relaxed);
    }
}

/// A statistics snapshot that can be taken relative to an earlier one.
pub(crate) trait Events: Clone + Default {
    /// This snapshot with `baseline`'s event counters subtracted (gauges kept).
    fn since(&self, baseline: &Self) -> Self;
}

/// `Events` for a statistics struct: the listed event counters are subtracted (saturating:
/// a counter never goes below its baseline, but a snapshot's fields are read one by one), the
/// listed nested statistics are taken `since` their own baseline, every other field is kept.
macro_rules! events {
    ($ty:ty { $($field:ident),* $(,)? } $(nested { $($nested:ident),+ $(,)? })?) => {
        impl $crate::stats::Events for $ty {
            fn since(&self, baseline: &Self) -> Self {
                let mut now = self.clone();
                $(now.$field = now.$field.saturating_sub(baseline.$field);)*
                $($(now.$nested = $crate::stats::Events::since(&now.$nested, &baseline.$nested);)+)?
                now
            }
        }
    };
}
pub(crate) use events;

/// The values of a cache's counters at its last reset (all zero before any).
#[derive(Default)]
pub(crate) struct Baseline<S>(Mutex<S>);

impl<S: Events> Baseline<S> {
    /// `raw` (the counters as counted) relative to the last reset.
    pub(crate) fn apply(&self, raw: &S) -> S {
        raw.since(&self.0.lock())
    }

    /// Makes `raw` the new zero.
    pub(crate) fn reset(&self, raw: S) {
        *self.0.lock() = raw;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default, Debug, PartialEq)]
    struct Counts {
        hits: u64,
        entries: u64,
    }
    events!(Counts { hits });

    #[test]
    fn rate() {
        assert_eq!(hit_rate(0, 0), None);
        assert_eq!(hit_rate(3, 1), Some(0.75));
        assert_eq!(hit_rate(0, 5), Some(0.0));
        assert_eq!(hit_rate(u64::MAX, 1), Some(1.0));
    }

    #[test]
    fn baseline_subtracts_events_only() {
        let base = Baseline::default();
        let raw = Counts {
            hits: 10,
            entries: 4,
        };
        assert_eq!(base.apply(&raw), raw);
        base.reset(raw);
        let later = Counts {
            hits: 13,
            entries: 2,
        };
        assert_eq!(
            base.apply(&later),
            Counts {
                hits: 3,
                entries: 2
            }
        );
    }
}
