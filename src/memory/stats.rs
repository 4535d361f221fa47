//! A snapshot of a cache's counters, and the declaration of the live counters behind one.

/// Declares a `Default` struct of counters, one `AtomicU64` (the one in scope where it is
/// invoked: the shuttle build's in tests of the memory tier) per listed field, each with the
/// struct's visibility.
macro_rules! counters {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($field:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Default)]
        $vis struct $name {
            $($vis $field: AtomicU64,)+
        }
    };
}
pub(super) use counters;

crate::stats::statistics! {
    /// Counters of one cache since it was created or its statistics were last reset
    /// ([`MemoryCache::reset_stats`](super::MemoryCache::reset_stats): `entries`, `weight` and
    /// `leases` are gauges, never reset). Each field is read atomically but the
    /// snapshot as a whole is not: under concurrent use, fields may be a few operations apart.
    /// Taking one visits every shard, so it costs in proportion to the number of entries.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Stats {
        /// Lookups answered from a ready entry.
        event hits,
        /// Lookups that found no ready entry and no build to join (`find_or_build` then builds).
        event misses,
        /// Build callbacks that produced a value (installed, or discarded as below). A value a
        /// tiered lookup loaded from the disk or a remote tier is not a build: it is in `loads`.
        event builds,
        /// Values a tiered lookup loaded from the disk or a remote tier instead of building
        /// them (installed, or discarded as below).
        event loads,
        /// Builds that returned an error or panicked.
        event build_failures,
        /// Lookups that joined another thread's build of the same key. One whose builder's
        /// window was doomed and its own not looks the key up again: it stays counted here if
        /// it then joins another build or finds the value, and moves to `misses` if it builds.
        /// Every lookup counts once, in `hits`, `misses` or `waits`.
        event waits,
        /// Values built or loaded but destroyed instead of installed: device evicted or cache
        /// cleared.
        event discarded,
        /// Entries unlinked to respect the entry-count or weight cap.
        event capacity_evictions,
        /// Entries unlinked by `evict_device` / `evict_devices`.
        event device_evictions,
        /// Calls to `clear`.
        event clears,
        /// Destroy callbacks run.
        event destroys,
        /// Destroy callbacks that failed.
        event destroy_errors,
        /// Entries linked in the table now.
        gauge entries,
        /// Total weight of the linked entries.
        gauge weight,
        /// Leases not yet released, on linked and unlinked entries alike. Counted from the entries'
        /// reference counts when the snapshot is taken (hits touch no counter for it), so it is
        /// exact whenever no other cache call is in progress.
        gauge leases,
    }
}

impl Stats {
    /// `hits / (hits + misses)`; `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.hits, self.misses)
    }
}
