//! `kcache metrics`: the directory's figures in the Prometheus text format, written by the
//! library's encoder (`kcache::metrics::text`) so that the command and `kc_metrics_render`
//! agree on the format and on the names they share. `--textfile` writes the file that
//! node_exporter's textfile collector reads: to a temporary file in the same directory, then
//! renamed over it, so that a scrape never reads half a file.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use kcache::metrics::text::{Exposition, Kind};
use kcache::metrics::write_build_info;

use super::Target;
use super::stats::{CountersJson, directory_stats};
use crate::Failure;

pub fn metrics(target: &Target, textfile: Option<&Path>) -> Result<u8, Failure> {
    let (stats, oldest, newest) = directory_stats(target)?;
    let mut out = Exposition::new();
    write_build_info(&mut out);
    out.family(
        "kcache_entries",
        Kind::Gauge,
        "Entries by tier: entry files in the directory.",
    )
    .series("kcache_entries", &[], "tier", [("disk", stats.entries)]);
    out.family(
        "kcache_disk_bytes",
        Kind::Gauge,
        "Bytes of entry files in the directory.",
    )
    .sample("kcache_disk_bytes", &[], stats.bytes);
    out.family(
        "kcache_disk_max_bytes",
        Kind::Gauge,
        "The size cap: KCACHE_MAX_SIZE, else the directory's max-size, else the default.",
    )
    .sample("kcache_disk_max_bytes", &[], stats.cap_bytes);
    // Without a file-count cap the family is left out: no number says "no limit".
    if let Some(files) = stats.max_files {
        out.family(
            "kcache_disk_max_entries",
            Kind::Gauge,
            "The file-count cap: KCACHE_MAX_FILES, else the directory's max-files.",
        )
        .sample("kcache_disk_max_entries", &[], files);
    }
    let mut by_generation = [(0u64, 0u64); 2];
    for g in &stats.generations {
        let slot = &mut by_generation[usize::from(!g.current)];
        slot.0 += g.entries;
        slot.1 += g.bytes;
    }
    let [current, other] = by_generation;
    let entries = "kcache_disk_generation_entries";
    out.family(
        entries,
        Kind::Gauge,
        "Entries of this key generation (current) and of all others (gc removes them).",
    )
    .series(
        entries,
        &[],
        "generation",
        [("current", current.0), ("other", other.0)],
    );
    let bytes = "kcache_disk_generation_bytes";
    out.family(
        bytes,
        Kind::Gauge,
        "Bytes of the entries of this key generation (current) and of all others.",
    )
    .series(
        bytes,
        &[],
        "generation",
        [("current", current.1), ("other", other.1)],
    );
    for (name, help, time) in [
        (
            "kcache_disk_oldest_use_timestamp_seconds",
            "When the least recently used entry was last written or read (Unix time).",
            oldest,
        ),
        (
            "kcache_disk_newest_use_timestamp_seconds",
            "When the most recently used entry was last written or read (Unix time).",
            newest,
        ),
    ] {
        // An empty directory has neither: the families are left out.
        if let Some(time) = time {
            let seconds = time
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            out.family(name, Kind::Gauge, help)
                .sample(name, &[], seconds);
        }
    }
    write_counters(&mut out, &stats.counters);
    let text = out.finish();
    match textfile {
        None => {
            out!("{}", text.trim_end());
            Ok(0)
        }
        Some(path) => write_atomically(path, &text).map(|()| 0).map_err(|e| {
            Failure::usage(format!("cannot write the textfile {}: {e}", path.display()))
        }),
    }
}

/// The directory's counters, every process's lookups, builds and writes added up (see
/// `kcache stats`), as counters under the names a process's own metrics give them, so that
/// one dashboard reads both. `kcache zero-stats` zeroes them: Prometheus reads that as the
/// counter reset it is.
fn write_counters(out: &mut Exposition, c: &CountersJson) {
    let lookups = "kcache_lookups_total";
    out.family(
        lookups,
        Kind::Counter,
        "Lookups by tier and result, of every process that used the directory.",
    )
    .series(
        lookups,
        &[("tier", "memory")],
        "result",
        [("hit", c.memory_hits), ("miss", c.memory_misses)],
    )
    .series(
        lookups,
        &[("tier", "disk")],
        "result",
        [("hit", c.disk_hits), ("miss", c.disk_misses)],
    )
    .series(
        lookups,
        &[("tier", "remote")],
        "result",
        [("hit", c.remote_hits), ("miss", c.remote_misses)],
    );
    out.family(
        "kcache_builds_total",
        Kind::Counter,
        "Values built because no tier had them, by every process that used the directory.",
    )
    .sample("kcache_builds_total", &[], c.builds);
    out.family(
        "kcache_disk_writes_total",
        Kind::Counter,
        "Entries written to the directory, by outcome.",
    )
    .series(
        "kcache_disk_writes_total",
        &[],
        "result",
        [("ok", c.disk_writes), ("failed", c.failed_writes)],
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
    let failures = "kcache_remote_failures_total";
    out.family(
        failures,
        Kind::Counter,
        "Remote operations that failed, ran past their timeout, or were skipped by an open breaker.",
    )
    .series(
        failures,
        &[],
        "reason",
        [
            ("error", c.remote_errors),
            ("timeout", c.remote_timeouts),
            ("skipped", c.remote_skipped),
        ],
    );
    let leases = "kcache_remote_leases_total";
    out.family(
        leases,
        Kind::Counter,
        "Cross-node leases: taken (builds led), waited for, waits that timed out.",
    )
    .series(
        leases,
        &[],
        "result",
        [
            ("taken", c.remote_leases),
            ("waited", c.remote_lease_waits),
            ("timed_out", c.remote_lease_timeouts),
        ],
    );
    let unlabelled: [(&str, &str, u64); 9] = [
        (
            "kcache_integrity_rejects_total",
            "Entries of the directory refused by a read (bad tag, another key, truncated, ...) and removed.",
            c.integrity_rejects,
        ),
        (
            "kcache_disk_lock_waits_total",
            "Misses that waited for another process building the same entry.",
            c.lock_waits,
        ),
        (
            "kcache_disk_lock_timeouts_total",
            "Waits for another process that reached the lock timeout.",
            c.lock_timeouts,
        ),
        (
            "kcache_disk_lock_takeovers_total",
            "Misses that took over the build of a process that died building.",
            c.lock_takeovers,
        ),
        (
            "kcache_remote_rejects_total",
            "Remote entries refused by verification (changed, another key, too large).",
            c.remote_rejects,
        ),
        (
            "kcache_remote_breaker_trips_total",
            "Times a remote tier's breaker opened after consecutive failures.",
            c.remote_breaker_trips,
        ),
        (
            "kcache_remote_writes_total",
            "Entries written to the remote tier.",
            c.remote_puts,
        ),
        (
            "kcache_remote_read_bytes_total",
            "Bytes read from the remote tier.",
            c.remote_bytes_read,
        ),
        (
            "kcache_remote_written_bytes_total",
            "Bytes written to the remote tier.",
            c.remote_bytes_written,
        ),
    ];
    for (name, help, value) in unlabelled {
        out.family(name, Kind::Counter, help)
            .sample(name, &[], value);
    }
}

/// Writes `text` to a new temporary file next to `path` (a dot file without the `.prom`
/// suffix, which the collector ignores), flushes it, and renames it over `path`.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let temp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })
        .and_then(|()| fs::rename(&temp, path));
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written
}
