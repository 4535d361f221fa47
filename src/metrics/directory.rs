//! A directory's counters (`Persistence::directory_stats`): every process's lookups, builds and
//! writes added up, as counters under the names a process's own metrics give them, so that one
//! dashboard reads both. `kcache metrics` writes them; zeroing the directory's counters is, to
//! Prometheus, the counter reset it is.

use super::text::{Exposition, Kind};
use super::{lock_counters, unlabelled, write_disk_writes, write_lookups, write_remote_counters};
use crate::disk::DirectoryCounters;
use crate::store::RemoteStats;

/// Writes the families of the directory's counters `c`.
pub fn write_directory_counters(out: &mut Exposition, c: &DirectoryCounters) {
    let help = "Lookups by tier and result, of every process that used the directory.";
    let memory = [("hit", c.memory_hits), ("miss", c.memory_misses)];
    let remote = [c.remote_hits, c.remote_misses];
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
    write_remote_counters(out, &remote_stats(c));
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

/// The remote tier's counters among `c`, under the remote tier's names (its breaker closed: a
/// directory keeps no breaker state).
fn remote_stats(c: &DirectoryCounters) -> RemoteStats {
    RemoteStats {
        hits: c.remote_hits,
        misses: c.remote_misses,
        rejects: c.remote_rejects,
        errors: c.remote_errors,
        timeouts: c.remote_timeouts,
        skipped: c.remote_skipped,
        breaker_trips: c.remote_breaker_trips,
        leases: c.remote_leases,
        lease_waits: c.remote_lease_waits,
        lease_timeouts: c.remote_lease_timeouts,
        puts: c.remote_puts,
        bytes_read: c.remote_bytes_read,
        bytes_written: c.remote_bytes_written,
        breaker_open: false,
    }
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
            r#"kcache_lookups_total{tier="remote",result="hit"} 13"#,
            r#"kcache_lookups_total{tier="remote",result="miss"} 14"#,
            "kcache_remote_rejects_total 15",
            r#"kcache_remote_failures_total{reason="error"} 16"#,
            r#"kcache_remote_failures_total{reason="timeout"} 17"#,
            r#"kcache_remote_failures_total{reason="skipped"} 18"#,
            "kcache_remote_breaker_trips_total 19",
            r#"kcache_remote_leases_total{result="taken"} 20"#,
            r#"kcache_remote_leases_total{result="waited"} 21"#,
            r#"kcache_remote_leases_total{result="timed_out"} 22"#,
            "kcache_remote_writes_total 23",
            "kcache_remote_read_bytes_total 24",
            "kcache_remote_written_bytes_total 25",
            "kcache_passed_through_total 26",
        ];
        let mut sorted_samples = samples.clone();
        sorted_samples.sort_unstable();
        let mut sorted_expected = expected.to_vec();
        sorted_expected.sort_unstable();
        assert_eq!(sorted_samples, sorted_expected, "{text}");
    }
}
