//! What every store counts: the same counters for each kind, so that statistics, metrics and
//! the directory's counters treat them alike.

crate::stats::statistics! {
    /// What a shared store did, since it was opened or its statistics last reset (the type
    /// is named for the first of them, the remote tier on Redis).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RemoteStats {
        /// Entries read and verified (a lookup that waited for another node's lease counts its
        /// first look as a miss, then the entry it got as a hit).
        counted hits,
        /// Reads that returned no usable entry: absent, rejected, failed, timed out or skipped.
        counted misses,
        /// Entries refused by verification (tampered, another key, truncated, too large).
        counted rejects,
        /// Operations that failed (connection refused or lost, a server error), timeouts apart.
        counted errors,
        /// Operations that ran past their budget.
        counted timeouts,
        /// Operations skipped because the breaker was open.
        counted skipped,
        /// Times the breaker opened after consecutive failures.
        counted breaker_trips,
        /// Leases taken: builds this process led for every node.
        counted leases,
        /// Misses that waited for another node holding the lease (then read its entry, or built).
        counted lease_waits,
        /// Of those, waits that reached the deadline and built.
        counted lease_timeouts,
        /// Entries written.
        counted puts,
        counted bytes_read,
        counted bytes_written,
        /// Whether the breaker is open now (a gauge, never reset).
        gauge breaker_open: bool,
    }
    /// What a store counts, as it happens.
    #[cfg_attr(
        not(feature = "remote"),
        allow(dead_code, reason = "only a store counts, and this build has none")
    )]
    live pub(crate) struct Counters;
}

impl RemoteStats {
    /// `hits / (hits + misses)`; `None` before the first read.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.hits, self.misses)
    }
}

/// A `$ty` with `$remote`'s counters (a [`RemoteStats`]) as its `remote_*` fields and every
/// other field default: the flat layout of the directory's counters and of the C statistics,
/// which take the remote tier's counters but its breaker's state.
macro_rules! flattened {
    ($ty:ident, $remote:expr) => {{
        let r: $crate::store::RemoteStats = $remote;
        $ty {
            remote_hits: r.hits,
            remote_misses: r.misses,
            remote_rejects: r.rejects,
            remote_errors: r.errors,
            remote_timeouts: r.timeouts,
            remote_skipped: r.skipped,
            remote_breaker_trips: r.breaker_trips,
            remote_leases: r.leases,
            remote_lease_waits: r.lease_waits,
            remote_lease_timeouts: r.lease_timeouts,
            remote_puts: r.puts,
            remote_bytes_read: r.bytes_read,
            remote_bytes_written: r.bytes_written,
            ..$ty::default()
        }
    }};
}
pub(crate) use flattened;
