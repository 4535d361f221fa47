//! L3: a shared tier on Redis (or Valkey), behind the disk tier. A lookup the disk cannot
//! answer asks the remote before building; a remote hit is written to the disk; a built value
//! is written to the disk and then, on the disk tier's background writer, to the remote.
//!
//! The remote stores entries in the disk tier's authenticated format under
//! `<prefix><entry name>`, and every read is verified exactly as a disk read is: the store is
//! not trusted, only the operator key is. Without a key the remote is off unless
//! [`RemoteConfig::allow_unkeyed`] says otherwise (see `docs/remote.md`).
//!
//! The remote never fails a lookup: an operation that fails or runs past its budget is a miss
//! (or a skipped write), counted and logged, and after a few in a row the breaker skips the
//! remote for a while.
//!
//! The tier is the cargo feature `remote` (on by default):
//! - [`config`]: the settings and the environment, in every build.
//! - `store`: the tier, with the feature: Redis connections, replies, the breaker, leases.
//! - `absent`: without it, a tier that is never open and a warning when one is configured.

pub mod config;
// The one place the `remote` cargo feature shows: the tier itself, or its absence.
#[cfg(not(feature = "remote"))]
mod absent;
#[cfg(feature = "remote")]
mod store;

#[cfg(not(feature = "remote"))]
pub(crate) use absent::{LeaseGuard, Remote};
pub use config::{RemoteConfig, masked_url};
#[cfg(feature = "remote")]
pub use store::{LEASE_TTL, resp};
#[cfg(feature = "remote")]
pub(crate) use store::{LeaseGuard, Remote};

crate::stats::statistics! {
    /// What the remote tier did, since it was opened or its statistics last reset.
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
    /// What a store counts, as it happens (the Redis tier, the object-store tier).
    #[cfg_attr(
        not(any(feature = "remote", feature = "object-store")),
        allow(dead_code, reason = "only the stores count")
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
        let r: $crate::remote::RemoteStats = $remote;
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

/// What a node that missed an entry everywhere does.
#[cfg_attr(
    not(feature = "remote"),
    allow(dead_code, reason = "only the remote tier uses it")
)]
pub(crate) enum Flight<T> {
    /// Build it: this node holds the lease until the guard is dropped.
    Lead(LeaseGuard),
    /// Another node built it meanwhile: here it is, verified.
    Found(T),
    /// Build it without a lease (no lease to be had, the leader failed, or the wait ran out).
    Build,
}
