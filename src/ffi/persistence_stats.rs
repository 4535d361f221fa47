//! The counters of a `kc_persistence` and its directory sweep (`kc_persistence_gc`).

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::mem::size_of;
use std::ops::Deref;
use std::time::Duration;

use super::args::{c_statistics, invalid, write_sized};
use super::persistence::{KC_FINGERPRINT_LEN, kc_persistence, persistence_ref, with_persistence};
use super::status::{byte_slice, guard, kc_status};
use crate::Persistence;
use crate::disk::{DiskStats, GcReport};
use crate::remote::RemoteStats;

/// `gc` age after which a temporary file is a crashed writer's leftover: 15 minutes.
pub const KC_PERSISTENCE_DEFAULT_TEMP_MAX_AGE_S: u64 = 900;

// The constant is a literal so cbindgen can emit it; this keeps it equal to the Rust one.
const _: () =
    assert!(KC_PERSISTENCE_DEFAULT_TEMP_MAX_AGE_S == crate::disk::DEFAULT_TEMP_MAX_AGE.as_secs());

/// Counters and reports are written truncated to any caller's size that holds `struct_size`.
const OUT_MIN_SIZE: usize = size_of::<usize>();

/// Counters of one `kc_persistence` since it was opened or its last `kc_persistence_reset_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kc_persistence_statistics {
    pub struct_size: usize,
    /// Reads that returned a verified entry.
    pub hits: u64,
    /// Reads that returned none: absent, rejected or failed.
    pub misses: u64,
    /// Entries written.
    pub puts: u64,
    /// Bytes of entries read.
    pub bytes_read: u64,
    /// Bytes of entries written.
    pub bytes_written: u64,
    /// Entries that failed verification and were removed (and directories moved aside by a write).
    pub integrity_rejects: u64,
    /// Failed reads and writes.
    pub io_errors: u64,
    /// Entries removed by the size cap.
    pub evictions: u64,
    /// Entries removed by `kc_persistence_remove`.
    pub removes: u64,
    /// Entries a tiered lookup's `load` refused, removed.
    pub load_failures: u64,
    /// Entry files in the directory, as far as this process knows (all once `scan_complete`).
    pub entries: u64,
    /// Their total size in bytes.
    pub bytes: u64,
    /// Whether the directory scan `kc_persistence_open` starts has finished.
    pub scan_complete: bool,
    /// Misses that waited for another process building the same entry.
    pub lock_waits: u64,
    /// Waits that reached the lock timeout; each of those misses built without waiting more.
    pub lock_timeouts: u64,
    /// Misses that found the lock released by a process that died building: they built.
    pub lock_takeovers: u64,
    /// Background writes queued, held back or running now.
    pub pending_writes: u64,
    /// Background writes that failed (the value could not be serialized or written).
    pub failed_writes: u64,
    /// Whether a remote tier (Redis) is behind the disk; the `remote_*` fields are its counters
    /// (zero without one), as `docs/remote.md` "Statistics" describes them.
    pub remote: bool,
    pub remote_hits: u64,
    pub remote_misses: u64,
    pub remote_rejects: u64,
    pub remote_errors: u64,
    pub remote_timeouts: u64,
    pub remote_skipped: u64,
    pub remote_breaker_trips: u64,
    pub remote_breaker_open: bool,
    pub remote_leases: u64,
    pub remote_lease_waits: u64,
    pub remote_lease_timeouts: u64,
    pub remote_puts: u64,
    pub remote_bytes_read: u64,
    pub remote_bytes_written: u64,
    /// New in 3.1: the object store's, as `remote_*` are Redis's.
    pub s3: bool,
    pub s3_breaker_open: bool,
    pub s3_hits: u64,
    pub s3_misses: u64,
    pub s3_rejects: u64,
    pub s3_errors: u64,
    pub s3_timeouts: u64,
    pub s3_skipped: u64,
    pub s3_breaker_trips: u64,
    pub s3_leases: u64,
    pub s3_lease_waits: u64,
    pub s3_lease_timeouts: u64,
    pub s3_puts: u64,
    pub s3_bytes_read: u64,
    pub s3_bytes_written: u64,
}

/// What `kc_persistence_stats` reports: the disk tier's counters (its fields, through
/// `Deref`), the Redis tier's and the object store's.
struct Counted {
    disk: DiskStats,
    remote: Option<RemoteStats>,
    s3: Option<RemoteStats>,
}

impl Deref for Counted {
    type Target = DiskStats;

    fn deref(&self) -> &DiskStats {
        &self.disk
    }
}

/// The remote tier's fields of `kc_persistence_statistics` (zero without one); the others
/// default.
fn remote_fields(s: &Counted) -> kc_persistence_statistics {
    let (r, o) = (s.remote.unwrap_or_default(), s.s3.unwrap_or_default());
    let redis = crate::store::flattened!(kc_persistence_statistics, r);
    let both = crate::store::flattened!(s3 kc_persistence_statistics, o, redis);
    kc_persistence_statistics {
        remote: s.remote.is_some(),
        remote_breaker_open: r.breaker_open,
        s3: s.s3.is_some(),
        s3_breaker_open: o.breaker_open,
        ..both
    }
}

c_statistics!(Counted => kc_persistence_statistics {
    hits, misses, puts, bytes_read, bytes_written, integrity_rejects, io_errors, evictions,
    removes, load_failures, entries, bytes, scan_complete, lock_waits, lock_timeouts,
    lock_takeovers, pending_writes, failed_writes,
} ..remote_fields);

/// What one `kc_persistence_gc` removed, by reason.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kc_persistence_gc_report {
    pub struct_size: usize,
    /// Temporary files of crashed writers.
    pub temp_files: u64,
    /// Entries written under another key schema.
    pub stale_schema: u64,
    /// Entries of operator keys neither active nor retained.
    pub stale_fingerprint: u64,
    /// Entries that failed verification.
    pub corrupt: u64,
    /// Entries left in place.
    pub kept: u64,
    /// Bytes removed.
    pub bytes_freed: u64,
    /// Files or directories that should have gone but could not be removed.
    pub undeletable: u64,
    /// Lock files nobody held (left by processes that died building), and non-files at their names.
    pub lock_files: u64,
    /// Entries of format 1, which do not say what they hold (read, but removed by `gc`).
    pub old_format: u64,
}

c_statistics!(GcReport => kc_persistence_gc_report {
    temp_files, stale_schema, stale_fingerprint, corrupt, kept, bytes_freed, undeletable,
    lock_files, old_format,
});

/// Sweeps the directory: temporary files older than `temp_max_age_s` seconds, entries of other key
/// schemas, corrupt entries, and entries of operator keys neither this disk's nor among the
/// `retain_count` fingerprints at `retain`. `out_report` may be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_gc(
    persistence: *mut kc_persistence,
    retain: *const u8,
    retain_count: usize,
    temp_max_age_s: u64,
    out_report: *mut kc_persistence_gc_report,
) -> kc_status {
    let sweep = |disk: &Persistence| {
        let bytes = retain_count
            .checked_mul(KC_FINGERPRINT_LEN)
            .ok_or_else(|| invalid("retain_count is too large"))?;
        // SAFETY: the caller promises `bytes` readable bytes.
        let retain = unsafe { byte_slice(retain, bytes, "retain") }?;
        let retain: Vec<[u8; 8]> = retain
            .chunks_exact(KC_FINGERPRINT_LEN)
            .map(|c| c.try_into().expect("chunks are fingerprint-sized"))
            .collect();
        let r = disk.gc(&retain, Duration::from_secs(temp_max_age_s))?;
        if !out_report.is_null() {
            let report = kc_persistence_gc_report::from(r);
            // SAFETY: non-NULL; its size is the caller's promise.
            unsafe {
                write_sized(
                    out_report,
                    report,
                    "out_report",
                    "kc_persistence_gc_report",
                    OUT_MIN_SIZE,
                )
            }?;
        }
        Ok(())
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_persistence(persistence, sweep) }
}

/// Fills `*out`, whose `struct_size` the caller set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_stats(
    persistence: *const kc_persistence,
    out: *mut kc_persistence_statistics,
) -> kc_status {
    let write = |disk: &Persistence| {
        let stats = kc_persistence_statistics::from(Counted {
            disk: disk.stats(),
            remote: disk.remote_stats(),
            s3: disk.object_store_stats(),
        });
        // SAFETY: NULL (refused) or writable for its `struct_size` by contract.
        unsafe { write_sized(out, stats, "out", "kc_persistence_statistics", OUT_MIN_SIZE) }
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_persistence(persistence, write) }
}

/// Zeroes this object's event counters (`kc_persistence_statistics`); `entries`, `bytes`,
/// `scan_complete` and `pending_writes` stay. The directory's counters, which every process
/// adds to (`kcache stats`), are not touched: `kcache zero-stats` zeroes them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_reset_stats(persistence: *mut kc_persistence) -> kc_status {
    // SAFETY: pointer validity is the caller's contract, NULLs are checked.
    guard(|| unsafe { persistence_ref(persistence) }.map(|p| p.reset_stats()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_and_remote_counters_land_in_their_own_fields() {
        let remote = RemoteStats {
            hits: 7,
            bytes_written: 9,
            breaker_open: true,
            ..RemoteStats::default()
        };
        let disk = DiskStats {
            hits: 3,
            failed_writes: 4,
            scan_complete: true,
            ..DiskStats::default()
        };
        let c = kc_persistence_statistics::from(Counted {
            disk,
            remote: Some(remote),
            s3: None,
        });
        assert_eq!(c.struct_size, size_of::<kc_persistence_statistics>());
        assert_eq!((c.hits, c.failed_writes, c.scan_complete), (3, 4, true));
        assert_eq!(
            (c.remote, c.remote_hits, c.remote_bytes_written),
            (true, 7, 9)
        );
        assert!(c.remote_breaker_open);
        assert_eq!((c.s3, c.s3_hits, c.s3_bytes_written), (false, 0, 0));
        // The object store alone: its fields, none of the Redis tier's.
        let s3 = RemoteStats {
            hits: 5,
            bytes_written: 6,
            breaker_open: true,
            ..RemoteStats::default()
        };
        let alone = kc_persistence_statistics::from(Counted {
            disk,
            remote: None,
            s3: Some(s3),
        });
        assert_eq!((alone.remote, alone.remote_hits), (false, 0));
        assert_eq!(
            (alone.s3, alone.s3_hits, alone.s3_bytes_written),
            (true, 5, 6)
        );
        assert!(alone.s3_breaker_open && !alone.remote_breaker_open);
    }
}
