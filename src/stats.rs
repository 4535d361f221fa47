//! What every cache's statistics share: their declaration (`statistics!`: one list of fields
//! per type), the hit rate, and a reset that zeroes event counters without touching the
//! counters themselves.
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

/// The live counters behind a statistics type: the `live` struct of [`statistics!`].
pub(crate) trait Live {
    type Snapshot;

    /// The counters as counted, in a snapshot whose other fields are their defaults.
    fn snapshot(&self) -> Self::Snapshot;

    /// Zeroes every counter (see [`zero`]): the reset of a cache that keeps no baseline.
    fn zero(&self);
}

/// Adds `by` to a live counter.
pub(crate) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// Declares a statistics type from one list of its fields, in their order, each with its docs
/// and its kind:
/// - `counted`: an event count (`u64`) that the `live` struct below holds;
/// - `event`: an event count (`u64`) made from other counts or read elsewhere;
/// - `gauge`: kept by a reset: a value now (`u64` unless a type is given), or statistics that
///   reset on their own;
/// - `nested`: another statistics type, taken since its own baseline.
///
/// It declares the public struct (every field `pub`) and its [`Events`]: the events are
/// subtracted (saturating: a counter never goes below its baseline, but a snapshot's fields
/// are read one by one), nested statistics are taken `since` their own baseline, the gauges
/// are kept. After the struct, `live struct Counters;` declares the `Default` struct of live
/// counters, one `AtomicU64` per `counted` field (then the extra counters listed in braces
/// after its name, which the snapshot does not show), with [`Live`].
macro_rules! statistics {
    (@type) => { u64 };
    (@type $ty:ty) => { $ty };

    (@since counted $now:ident $baseline:ident $field:ident) => {
        $now.$field = $now.$field.saturating_sub($baseline.$field)
    };
    (@since event $now:ident $baseline:ident $field:ident) => {
        $now.$field = $now.$field.saturating_sub($baseline.$field)
    };
    (@since gauge $now:ident $baseline:ident $field:ident) => {};
    (@since nested $now:ident $baseline:ident $field:ident) => {
        $now.$field = $crate::stats::Events::since(&$now.$field, &$baseline.$field)
    };

    // The `counted` fields, gathered into `[...]`, then the live struct.
    (@live $head:tt [$($counted:ident)*]
        $(#[$doc:meta])* counted $field:ident $(: $ty:ty)?, $($rest:tt)*) => {
        $crate::stats::statistics!(@live $head [$($counted)* $field] $($rest)*);
    };
    (@live $head:tt [$($counted:ident)*]
        $(#[$doc:meta])* $kind:ident $field:ident $(: $ty:ty)?, $($rest:tt)*) => {
        $crate::stats::statistics!(@live $head [$($counted)*] $($rest)*);
    };
    (@live [$name:ident $(#[$meta:meta])* $vis:vis $live:ident
            $({ $($(#[$extra_doc:meta])* $extra:ident,)+ })?]
        [$($counted:ident)*]) => {
        $(#[$meta])*
        #[derive(Default)]
        $vis struct $live {
            $($vis $counted: ::std::sync::atomic::AtomicU64,)*
            $($($(#[$extra_doc])* $vis $extra: ::std::sync::atomic::AtomicU64,)+)?
        }

        impl $crate::stats::Live for $live {
            type Snapshot = $name;

            fn snapshot(&self) -> $name {
                $name {
                    $($counted: self.$counted.load(::std::sync::atomic::Ordering::Relaxed),)*
                    ..::std::default::Default::default()
                }
            }

            fn zero(&self) {
                $crate::stats::zero(&[$(&self.$counted,)* $($(&self.$extra,)+)?]);
            }
        }
    };

    (@struct [$(#[$meta:meta])* $name:ident]
        $($(#[$doc:meta])* $kind:ident $field:ident $(: $ty:ty)?,)+) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$doc])* pub $field: $crate::stats::statistics!(@type $($ty)?),)+
        }

        impl $crate::stats::Events for $name {
            fn since(&self, baseline: &Self) -> Self {
                let mut now = self.clone();
                $($crate::stats::statistics!(@since $kind now baseline $field);)+
                now
            }
        }
    };

    (@live_of $name:ident [] $($fields:tt)*) => {};
    (@live_of $name:ident
        [$(#[$meta:meta])* live $vis:vis struct $live:ident $({ $($extras:tt)+ })? $(;)?]
        $($fields:tt)*) => {
        $crate::stats::statistics!(
            @live [$name $(#[$meta])* $vis $live $({ $($extras)+ })?] [] $($fields)*
        );
    };

    // The entry: the struct, then its live counters when they are declared.
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($fields:tt)* }
        $($live:tt)*
    ) => {
        $crate::stats::statistics!(@struct [$(#[$meta])* $name] $($fields)*);
        $crate::stats::statistics!(@live_of $name [$($live)*] $($fields)*);
    };
}
pub(crate) use statistics;

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

    statistics! {
        #[derive(Clone, Default, Debug, PartialEq)]
        pub struct Counts {
            counted hits,
            event misses,
            gauge entries,
            gauge open: bool,
        }
        live struct CountsLive {
            /// Counted, but not shown.
            builds,
        }
    }

    statistics! {
        #[derive(Clone, Default, Debug, PartialEq)]
        pub struct Outer {
            counted lookups,
            nested inner: Counts,
        }
    }

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
            misses: 5,
            entries: 4,
            open: true,
        };
        assert_eq!(base.apply(&raw), raw);
        base.reset(raw);
        let later = Counts {
            hits: 13,
            misses: 6,
            entries: 2,
            open: false,
        };
        assert_eq!(
            base.apply(&later),
            Counts {
                hits: 3,
                misses: 1,
                entries: 2,
                open: false,
            }
        );
    }

    #[test]
    fn nested_statistics_are_taken_since_their_own_baseline() {
        let counts = |hits, entries| Counts {
            hits,
            entries,
            ..Counts::default()
        };
        let base = Outer {
            lookups: 4,
            inner: counts(3, 9),
        };
        let now = Outer {
            lookups: 10,
            inner: counts(5, 7),
        };
        assert_eq!(
            now.since(&base),
            Outer {
                lookups: 6,
                inner: counts(2, 7),
            }
        );
    }

    #[test]
    fn live_counters_read_into_a_snapshot_and_zero() {
        let live = CountsLive::default();
        bump(&live.hits, 3);
        bump(&live.builds, 2);
        // Only `counted` fields are read; the rest keep their defaults.
        assert_eq!(
            live.snapshot(),
            Counts {
                hits: 3,
                ..Counts::default()
            }
        );
        assert_eq!(live.builds.load(Ordering::Relaxed), 2);
        live.zero();
        assert_eq!(live.snapshot(), Counts::default());
        assert_eq!(live.builds.load(Ordering::Relaxed), 0);
    }
}
