//! The layout of the counters every process using a directory adds to (the disk tier keeps
//! them in its shard files, `disk::shards`): the disk tier's own, the caches' in front of it,
//! and the stores' behind it, which their chain (`crate::persistence`) hands the disk. Fields
//! are only ever appended: a shorter, older record reads its missing counters as zero.

use crate::store::{RemoteStats, StoreKind};

macro_rules! directory_counters {
    ($($(#[$doc:meta])* $field:ident,)+) => {
        /// What the processes using a directory did with it, added up over every process since
        /// the counters were last zeroed. Each process counts what its own caches did; the
        /// memory-tier figures come from the caches that use this disk tier.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct DirectoryCounters {
            $($(#[$doc])* pub $field: u64,)+
        }

        impl DirectoryCounters {
            pub(crate) const LEN: usize = [$(stringify!($field)),+].len();

            pub(crate) fn to_array(self) -> [u64; Self::LEN] {
                [$(self.$field),+]
            }

            pub(crate) fn from_array(values: [u64; Self::LEN]) -> Self {
                let [$($field),+] = values;
                DirectoryCounters { $($field),+ }
            }

            /// Every counter with its field's name, in the fields' order.
            pub fn named(self) -> [(&'static str, u64); Self::LEN] {
                [$((stringify!($field), self.$field)),+]
            }
        }
    };
}

directory_counters! {
    /// Lookups a memory tier answered (from caches that report to this disk tier).
    memory_hits,
    /// Lookups a memory tier did not answer.
    memory_misses,
    /// Reads of this directory that returned a verified entry.
    disk_hits,
    /// Reads that returned none: absent, rejected or failed.
    disk_misses,
    /// Values built because neither tier had them.
    builds,
    /// Entries written.
    disk_writes,
    /// Entries refused by a read (and removed).
    integrity_rejects,
    /// Entries removed by the size cap.
    evictions,
    /// Misses that waited for another process building the same entry.
    lock_waits,
    /// Waits that reached the lock timeout.
    lock_timeouts,
    /// Builds taken over from a process that died building.
    lock_takeovers,
    /// Background writes that failed.
    failed_writes,
    // The remote tier's counters (`RemoteStats`, its breaker's state apart), appended to the
    // first layout: a shorter record's missing counters are zero.
    /// Remote entries read and verified.
    remote_hits,
    /// Remote reads that returned no usable entry.
    remote_misses,
    /// Remote entries refused by verification.
    remote_rejects,
    /// Remote operations that failed, timeouts apart.
    remote_errors,
    /// Remote operations that ran past their budget.
    remote_timeouts,
    /// Remote operations skipped while the breaker was open.
    remote_skipped,
    /// Times the breaker opened.
    remote_breaker_trips,
    /// Leases taken: builds led for every node.
    remote_leases,
    /// Misses that waited for another node holding the lease.
    remote_lease_waits,
    /// Of those, waits that reached the deadline.
    remote_lease_timeouts,
    /// Entries written to the remote.
    remote_puts,
    /// Bytes read from the remote.
    remote_bytes_read,
    /// Bytes written to the remote.
    remote_bytes_written,
    // Appended to the second layout, as the remote tier's were to the first.
    /// Builds a backend could not key (a computed `#include` it cannot expand, an
    /// option that reads a file): compiled and cached nowhere.
    passed_through,
    // The object store's counters, appended to the third layout, in the Redis tier's order.
    /// Object-store entries read and verified.
    s3_hits,
    /// Object-store reads that returned no usable entry.
    s3_misses,
    /// Object-store entries refused by verification.
    s3_rejects,
    /// Object-store operations that failed, timeouts apart.
    s3_errors,
    /// Object-store operations that ran past their budget.
    s3_timeouts,
    /// Object-store operations skipped while its breaker was open.
    s3_skipped,
    /// Times the object store's breaker opened.
    s3_breaker_trips,
    /// Object-store leases taken: builds led for every node.
    s3_leases,
    /// Misses that waited for another node holding an object-store lease.
    s3_lease_waits,
    /// Of those, waits that reached the deadline.
    s3_lease_timeouts,
    /// Entries written to the object store.
    s3_puts,
    /// Bytes read from the object store.
    s3_bytes_read,
    /// Bytes written to the object store.
    s3_bytes_written,
    // The stores' fail-open counters, appended to the fourth layout (Redis's, then the object
    // store's, each in `RemoteStats`'s order).
    /// Builds begun without the remote lease because a lease operation failed.
    remote_lease_failures,
    /// Remote leases that lapsed while their build ran.
    remote_leases_lost,
    /// Times the remote was found to ignore conditional writes (always zero: Redis has none).
    remote_conditional_writes_ignored,
    /// Builds begun without the object-store lease because a lease operation failed.
    s3_lease_failures,
    /// Object-store leases that lapsed while their build ran.
    s3_leases_lost,
    /// Times the object store was found to ignore conditional writes.
    s3_conditional_writes_ignored,
}

impl DirectoryCounters {
    /// The counters of the stores of `kind`, breaker closed (a directory keeps no breaker
    /// state).
    pub fn store(&self, kind: StoreKind) -> RemoteStats {
        let prefix = match kind {
            StoreKind::Redis => "remote_",
            StoreKind::ObjectStore => "s3_",
        };
        // A store's fields are its prefix's, in `RemoteStats::counted`'s order, though later
        // layouts appended some of them apart from the first.
        let of_store: Vec<u64> = (self.named().into_iter())
            .filter_map(|(name, value)| name.starts_with(prefix).then_some(value))
            .collect();
        RemoteStats::from_counted(
            of_store
                .try_into()
                .expect("every store kind has its fields"),
        )
    }

    /// `hits / (hits + misses)` of the stores of `kind`; `None` without reads.
    pub fn store_hit_rate(&self, kind: StoreKind) -> Option<f64> {
        self.store(kind).hit_rate()
    }
}

impl DirectoryCounters {
    pub(crate) fn zip(self, other: Self, f: impl Fn(u64, u64) -> u64) -> Self {
        let (a, b) = (self.to_array(), other.to_array());
        DirectoryCounters::from_array(std::array::from_fn(|i| f(a[i], b[i])))
    }

    /// `memory_hits / (memory_hits + memory_misses)`; `None` without lookups.
    pub fn memory_hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.memory_hits, self.memory_misses)
    }

    /// `disk_hits / (disk_hits + disk_misses)`; `None` without reads.
    pub fn disk_hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.disk_hits, self.disk_misses)
    }

    /// `remote_hits / (remote_hits + remote_misses)`; `None` without remote reads.
    pub fn remote_hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.remote_hits, self.remote_misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let record = crate::disk::CounterRecord {
            zeroed_ns: 7,
            values: (1..=DirectoryCounters::LEN as u64).collect(),
        };
        let bytes = record.encode();
        let back = crate::disk::CounterRecord::decode(&bytes).unwrap();
        assert_eq!(back.zeroed_ns, 7);
        assert_eq!(back.counters().memory_hits, 1);
        assert_eq!(back.counters().failed_writes, 12);
        assert_eq!(back.counters().remote_bytes_written, 25);
        assert_eq!(back.counters().passed_through, 26);
        assert_eq!(back.counters().s3_hits, 27);
        assert_eq!(back.counters().s3_bytes_written, 39);
        assert_eq!(
            back.counters().s3_conditional_writes_ignored,
            DirectoryCounters::LEN as u64
        );
        for i in [0, 9, 20, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(
                crate::disk::CounterRecord::decode(&bad).is_none(),
                "byte {i}"
            );
        }
        assert!(crate::disk::CounterRecord::decode(&bytes[..bytes.len() - 1]).is_none());
        assert!(crate::disk::CounterRecord::decode(b"").is_none());
        assert!(crate::disk::CounterRecord::decode(b"hello, world").is_none());
    }

    #[test]
    fn an_older_shorter_record_reads_its_missing_counters_as_zero() {
        // The first layout: twelve counters, before the remote tier's were appended.
        let first = 12;
        let record = crate::disk::CounterRecord {
            zeroed_ns: 3,
            values: (1..=first as u64).collect(),
        };
        let back = crate::disk::CounterRecord::decode(&record.encode()).unwrap();
        let c = back.counters();
        assert_eq!((c.memory_hits, c.failed_writes), (1, 12));
        assert_eq!((c.remote_hits, c.remote_bytes_written), (0, 0));
        // A longer record of the current layout counts the remote tier.
        let full = crate::disk::CounterRecord {
            zeroed_ns: 0,
            values: (1..=DirectoryCounters::LEN as u64).collect(),
        };
        let c = crate::disk::CounterRecord::decode(&full.encode())
            .unwrap()
            .counters();
        assert_eq!(c.remote_hits, first as u64 + 1);
        assert_eq!(c.remote_bytes_written, 25);
        assert_eq!(c.passed_through, 26);
        // Each store's counters read back from its own fields, in the stores' order.
        let redis = c.store(StoreKind::Redis);
        assert_eq!((redis.hits, redis.bytes_written), (13, 25));
        let s3 = c.store(StoreKind::ObjectStore);
        assert_eq!((s3.hits, s3.misses, s3.bytes_written), (27, 28, 39));
        assert!(!s3.breaker_open);
        // The fail-open counters, appended after both stores' first fields.
        assert_eq!((redis.lease_failures, redis.leases_lost), (40, 41));
        assert_eq!((s3.lease_failures, s3.conditional_writes_ignored), (43, 45));
    }

    #[test]
    fn the_remote_tiers_counters_land_in_their_own_fields() {
        let remote = crate::remote::RemoteStats {
            hits: 1,
            misses: 2,
            rejects: 3,
            errors: 4,
            timeouts: 5,
            skipped: 6,
            breaker_trips: 7,
            leases: 8,
            lease_waits: 9,
            lease_timeouts: 10,
            puts: 11,
            bytes_read: 12,
            bytes_written: 13,
            lease_failures: 14,
            leases_lost: 15,
            conditional_writes_ignored: 16,
            breaker_open: true,
        };
        let named = crate::store::flattened!(all DirectoryCounters, remote).named();
        let (flat, rest): (Vec<_>, Vec<_>) = named
            .iter()
            .partition(|(name, _)| name.starts_with("remote_"));
        // In the remote tier's order, each from its own counter; nothing else touched.
        let values: Vec<u64> = flat.iter().map(|&(_, v)| v).collect();
        assert_eq!(values, (1..=16).collect::<Vec<u64>>());
        assert!(rest.iter().all(|&(_, v)| v == 0), "{rest:?}");
    }
}
