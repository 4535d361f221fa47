//! A directory's counters (`Persistence::directory_stats`): every process's lookups, builds and
//! writes added up, as counters under the names a process's own metrics give them, so that one
//! dashboard reads both. `kcache metrics` writes them; zeroing the directory's counters is, to
//! Prometheus, the counter reset it is.

use super::text::{Exposition, Kind};
use super::{
    lock_counters, unlabelled, write_disk_writes, write_lookups, write_remote_counters,
    write_stores,
};
use crate::disk::DirectoryCounters;
use crate::store::{RemoteStats, StoreKind};

/// Writes the families of the directory's counters `c`.
pub fn write_directory_counters(out: &mut Exposition, c: &DirectoryCounters) {
    let help = "Lookups by tier and result, of every process that used the directory.";
    let memory = [("hit", c.memory_hits), ("miss", c.memory_misses)];
    // As a process's: `tier="remote"` and the `kcache_remote_*` families add every store up.
    let stores = StoreKind::ALL.map(|kind| c.store(kind));
    let mut all = RemoteStats::default();
    for s in stores {
        all += s;
    }
    let remote = [all.hits, all.misses];
    write_lookups(out, help, &memory, [c.disk_hits, c.disk_misses], remote);
    out.family(
        "kcache_builds_total",
        Kind::Counter,
        "Values built because no tier had them, by every process that used the directory.",
    )
    .sample("kcache_builds_total", &[], c.builds);
    write_disk_writes(
        out,
        "Entries written to the directory, by outcome.",
        c.disk_writes,
        c.failed_writes,
    );
    out.family(
        "kcache_evictions_total",
        Kind::Counter,
        "Entries removed from the directory by its caps.",
    )
    .series(
        "kcache_evictions_total",
        &[("tier", "disk")],
        "reason",
        [("capacity", c.evictions)],
    );
    write_remote_counters(out, &all);
    write_stores(out, &stores);
    let [waits, timeouts, takeovers] =
        lock_counters(c.lock_waits, c.lock_timeouts, c.lock_takeovers);
    let counters: [(&str, &str, u64); 5] = [
        (
            "kcache_passed_through_total",
            "Builds compiled and cached nowhere because an input of theirs could not be keyed \
             (a computed #include, an option naming a file, ...).",
            c.passed_through,
        ),
        (
            "kcache_integrity_rejects_total",
            "Entries of the directory refused by a read (bad tag, another key, truncated, ...) \
             and removed.",
            c.integrity_rejects,
        ),
        waits,
        timeouts,
        takeovers,
    ];
    unlabelled(out, Kind::Counter, &counters);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_lands_in_its_own_series() {
        // Each counter a different value (its position, from 1), so a swap shows.
        let mut c = DirectoryCounters::default();
        let fields = c.named().map(|(name, _)| name);
        for (value, name) in (1..).zip(fields) {
            let field = match name {
                "memory_hits" => &mut c.memory_hits,
                "memory_misses" => &mut c.memory_misses,
                "disk_hits" => &mut c.disk_hits,
                "disk_misses" => &mut c.disk_misses,
                "builds" => &mut c.builds,
                "disk_writes" => &mut c.disk_writes,
                "integrity_rejects" => &mut c.integrity_rejects,
                "evictions" => &mut c.evictions,
                "lock_waits" => &mut c.lock_waits,
                "lock_timeouts" => &mut c.lock_timeouts,
                "lock_takeovers" => &mut c.lock_takeovers,
                "failed_writes" => &mut c.failed_writes,
                "remote_hits" => &mut c.remote_hits,
                "remote_misses" => &mut c.remote_misses,
                "remote_rejects" => &mut c.remote_rejects,
                "remote_errors" => &mut c.remote_errors,
                "remote_timeouts" => &mut c.remote_timeouts,
                "remote_skipped" => &mut c.remote_skipped,
                "remote_breaker_trips" => &mut c.remote_breaker_trips,
                "remote_leases" => &mut c.remote_leases,
                "remote_lease_waits" => &mut c.remote_lease_waits,
                "remote_lease_timeouts" => &mut c.remote_lease_timeouts,
                "remote_puts" => &mut c.remote_puts,
                "remote_bytes_read" => &mut c.remote_bytes_read,
                "remote_bytes_written" => &mut c.remote_bytes_written,
                "passed_through" => &mut c.passed_through,
                "s3_hits" => &mut c.s3_hits,
                "s3_misses" => &mut c.s3_misses,
                "s3_rejects" => &mut c.s3_rejects,
                "s3_errors" => &mut c.s3_errors,
                "s3_timeouts" => &mut c.s3_timeouts,
                "s3_skipped" => &mut c.s3_skipped,
                "s3_breaker_trips" => &mut c.s3_breaker_trips,
                "s3_leases" => &mut c.s3_leases,
                "s3_lease_waits" => &mut c.s3_lease_waits,
                "s3_lease_timeouts" => &mut c.s3_lease_timeouts,
                "s3_puts" => &mut c.s3_puts,
                "s3_bytes_read" => &mut c.s3_bytes_read,
                "s3_bytes_written" => &mut c.s3_bytes_written,
                "remote_lease_failures" => &mut c.remote_lease_failures,
                "remote_leases_lost" => &mut c.remote_leases_lost,
                "remote_conditional_writes_ignored" => &mut c.remote_conditional_writes_ignored,
                "s3_lease_failures" => &mut c.s3_lease_failures,
                "s3_leases_lost" => &mut c.s3_leases_lost,
                "s3_conditional_writes_ignored" => &mut c.s3_conditional_writes_ignored,
                other => panic!("a counter this test does not know: {other}"),
            };
            *field = value;
        }
        assert_eq!(
            c.named().map(|(_, v)| v),
            std::array::from_fn(|i| i as u64 + 1)
        );
        let mut out = Exposition::new();
        write_directory_counters(&mut out, &c);
        let text = out.finish();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        let expected = [
            r#"kcache_lookups_total{tier="memory",result="hit"} 1"#,
            r#"kcache_lookups_total{tier="memory",result="miss"} 2"#,
            r#"kcache_lookups_total{tier="disk",result="hit"} 3"#,
            r#"kcache_lookups_total{tier="disk",result="miss"} 4"#,
            "kcache_builds_total 5",
            r#"kcache_disk_writes_total{result="ok"} 6"#,
            "kcache_integrity_rejects_total 7",
            r#"kcache_evictions_total{tier="disk",reason="capacity"} 8"#,
            "kcache_disk_lock_waits_total 9",
            "kcache_disk_lock_timeouts_total 10",
            "kcache_disk_lock_takeovers_total 11",
            r#"kcache_disk_writes_total{result="failed"} 12"#,
            // The remote families add both stores up: Redis's 13..=25 and the object
            // store's 27..=39, field by field.
            r#"kcache_lookups_total{tier="remote",result="hit"} 40"#,
            r#"kcache_lookups_total{tier="remote",result="miss"} 42"#,
            "kcache_remote_rejects_total 44",
            r#"kcache_remote_failures_total{reason="error"} 46"#,
            r#"kcache_remote_failures_total{reason="timeout"} 48"#,
            r#"kcache_remote_failures_total{reason="skipped"} 50"#,
            "kcache_remote_breaker_trips_total 52",
            r#"kcache_remote_leases_total{result="taken"} 54"#,
            r#"kcache_remote_leases_total{result="waited"} 56"#,
            r#"kcache_remote_leases_total{result="timed_out"} 58"#,
            // The fail-open counters, appended: Redis's 40..=42, the object store's 43..=45.
            r#"kcache_remote_leases_total{result="failed_open"} 83"#,
            r#"kcache_remote_leases_total{result="lost"} 85"#,
            "kcache_remote_conditional_writes_ignored_total 87",
            "kcache_remote_writes_total 60",
            "kcache_remote_read_bytes_total 62",
            "kcache_remote_written_bytes_total 64",
            "kcache_passed_through_total 26",
            // Each store apart.
            r#"kcache_store_lookups_total{store="redis",result="hit"} 13"#,
            r#"kcache_store_lookups_total{store="redis",result="miss"} 14"#,
            r#"kcache_store_lookups_total{store="redis",result="reject"} 15"#,
            r#"kcache_store_lookups_total{store="s3",result="hit"} 27"#,
            r#"kcache_store_lookups_total{store="s3",result="miss"} 28"#,
            r#"kcache_store_lookups_total{store="s3",result="reject"} 29"#,
            r#"kcache_store_written_bytes_total{store="redis"} 25"#,
            r#"kcache_store_written_bytes_total{store="s3"} 39"#,
        ];
        let mut sorted_samples = samples.clone();
        sorted_samples.sort_unstable();
        let mut sorted_expected = expected.to_vec();
        sorted_expected.sort_unstable();
        assert_eq!(sorted_samples, sorted_expected, "{text}");
    }
}
