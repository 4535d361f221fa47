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
        /// Builds begun without the lease because a lease operation could not be done: the
        /// store failed, ran past its budget or was skipped by the open breaker, no thread could
        /// renew the lease, or the store ignores conditional writes. With `leases`, every build
        /// after a miss everywhere: each is one or the other.
        counted lease_failures,
        /// Leases that lapsed while their build ran (the renewals failed, or another node took
        /// the lease over): another node may have built the entry too, under a lease of its own.
        counted leases_lost,
        /// Times the store was found to ignore conditional writes (`If-None-Match`, `If-Match`):
        /// its leases are not used, every build is a `lease_failures` (the object store only).
        counted conditional_writes_ignored,
        /// Whether the breaker is open now (a gauge, never reset).
        gauge breaker_open: bool,
    }
    /// What a store counts, as it happens.
    #[cfg_attr(
        not(any(feature = "remote", feature = "object-store")),
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

/// Every counter (the breaker's state apart), in the order of the fields.
pub(crate) const COUNTED: usize = 16;

impl RemoteStats {
    /// The counters, in field order, the breaker's state apart: the layout the directory's
    /// counters and the C statistics give each store.
    pub(crate) fn counted(&self) -> [u64; COUNTED] {
        [
            self.hits,
            self.misses,
            self.rejects,
            self.errors,
            self.timeouts,
            self.skipped,
            self.breaker_trips,
            self.leases,
            self.lease_waits,
            self.lease_timeouts,
            self.puts,
            self.bytes_read,
            self.bytes_written,
            self.lease_failures,
            self.leases_lost,
            self.conditional_writes_ignored,
        ]
    }

    /// The counters [`RemoteStats::counted`] gave, the breaker closed.
    pub(crate) fn from_counted(counted: [u64; COUNTED]) -> RemoteStats {
        let [
            hits,
            misses,
            rejects,
            errors,
            timeouts,
            skipped,
            breaker_trips,
            leases,
            lease_waits,
            lease_timeouts,
            puts,
            bytes_read,
            bytes_written,
            lease_failures,
            leases_lost,
            conditional_writes_ignored,
        ] = counted;
        RemoteStats {
            hits,
            misses,
            rejects,
            errors,
            timeouts,
            skipped,
            breaker_trips,
            leases,
            lease_waits,
            lease_timeouts,
            puts,
            bytes_read,
            bytes_written,
            lease_failures,
            leases_lost,
            conditional_writes_ignored,
            breaker_open: false,
        }
    }
}

/// A `$ty` with a store's counters (a [`RemoteStats`]) in its fields of one prefix,
/// `remote_*` (the Redis tier) or `s3_*` (the object store), every other field default: the
/// flat layout of the directory's counters and of the C statistics, which take a store's
/// counters but its breaker's state. With a third argument, the other fields are its. The C
/// statistics take the first thirteen counters (to `bytes_written`); `all` takes every one,
/// for the directory's counters.
macro_rules! flattened {
    ($ty:ident, $stats:expr) => {
        $crate::store::flattened!($ty, $stats, $ty::default())
    };
    ($ty:ident, $stats:expr, $base:expr) => {
        $crate::store::flattened!(@ $ty, $stats, $base; remote_hits, remote_misses,
            remote_rejects, remote_errors, remote_timeouts, remote_skipped, remote_breaker_trips,
            remote_leases, remote_lease_waits, remote_lease_timeouts, remote_puts,
            remote_bytes_read, remote_bytes_written)
    };
    (s3 $ty:ident, $stats:expr) => {
        $crate::store::flattened!(s3 $ty, $stats, $ty::default())
    };
    (s3 $ty:ident, $stats:expr, $base:expr) => {
        $crate::store::flattened!(@ $ty, $stats, $base; s3_hits, s3_misses, s3_rejects,
            s3_errors, s3_timeouts, s3_skipped, s3_breaker_trips, s3_leases, s3_lease_waits,
            s3_lease_timeouts, s3_puts, s3_bytes_read, s3_bytes_written)
    };
    (all $ty:ident, $stats:expr) => {
        $crate::store::flattened!(all $ty, $stats, $ty::default())
    };
    (all $ty:ident, $stats:expr, $base:expr) => {
        $crate::store::flattened!(@ $ty, $stats, $base; remote_hits, remote_misses,
            remote_rejects, remote_errors, remote_timeouts, remote_skipped, remote_breaker_trips,
            remote_leases, remote_lease_waits, remote_lease_timeouts, remote_puts,
            remote_bytes_read, remote_bytes_written, remote_lease_failures, remote_leases_lost,
            remote_conditional_writes_ignored)
    };
    (all s3 $ty:ident, $stats:expr, $base:expr) => {
        $crate::store::flattened!(@ $ty, $stats, $base; s3_hits, s3_misses, s3_rejects,
            s3_errors, s3_timeouts, s3_skipped, s3_breaker_trips, s3_leases, s3_lease_waits,
            s3_lease_timeouts, s3_puts, s3_bytes_read, s3_bytes_written, s3_lease_failures,
            s3_leases_lost, s3_conditional_writes_ignored)
    };
    (@ $ty:ident, $stats:expr, $base:expr; $($field:ident),+) => {{
        let stats: $crate::store::RemoteStats = $stats;
        let [$($field,)+ ..] = stats.counted();
        $ty {
            $($field,)+
            ..$base
        }
    }};
}
pub(crate) use flattened;
