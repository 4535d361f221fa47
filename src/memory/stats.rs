//! A snapshot of a cache's counters, and the declaration of the live counters behind one.

/// Declares a `Default` struct of event counters, one `AtomicU64` (the one in scope where it is
/// invoked) per listed field, each with the struct's visibility.
macro_rules! counters {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($field:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Default)]
        $vis struct $name {
            $($vis $field: AtomicU64,)+
        }
    };
}
pub(crate) use counters;

/// Counters of one cache since it was created or its statistics were last reset
/// ([`MemoryCache::reset_stats`](super::MemoryCache::reset_stats): `entries`, `weight` and
/// `leases` are gauges, never reset). Each field is read atomically but the
/// snapshot as a whole is not: under concurrent use, fields may be a few operations apart.
/// Taking one visits every shard, so it costs in proportion to the number of entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups answered from a ready entry.
    pub hits: u64,
    /// Lookups that found no ready entry and no build to join (`find_or_build` then builds).
    pub misses: u64,
    /// Builds that produced a value (installed, or discarded as below).
    pub builds: u64,
    /// Builds that returned an error or panicked.
    pub build_failures: u64,
    /// Lookups that joined another thread's build of the same key.
    pub waits: u64,
    /// Values built but destroyed instead of installed: device evicted or cache cleared.
    pub discarded: u64,
    /// Entries unlinked to respect the entry-count or weight cap.
    pub capacity_evictions: u64,
    /// Entries unlinked by `evict_device` / `evict_devices`.
    pub device_evictions: u64,
    /// Calls to `clear`.
    pub clears: u64,
    /// Destroy callbacks run.
    pub destroys: u64,
    /// Destroy callbacks that failed.
    pub destroy_errors: u64,
    /// Entries linked in the table now.
    pub entries: u64,
    /// Total weight of the linked entries.
    pub weight: u64,
    /// Leases not yet released, on linked and unlinked entries alike. Counted from the entries'
    /// reference counts when the snapshot is taken (hits touch no counter for it), so it is
    /// exact whenever no other cache call is in progress.
    pub leases: u64,
}

crate::stats::events!(Stats {
    hits,
    misses,
    builds,
    build_failures,
    waits,
    discarded,
    capacity_evictions,
    device_evictions,
    clears,
    destroys,
    destroy_errors,
});

impl Stats {
    /// `hits / (hits + misses)`; `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.hits, self.misses)
    }
}
