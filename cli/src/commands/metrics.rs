//! `kcache metrics`: the directory's figures in the Prometheus text format, written by the
//! library's encoder (`kcache::metrics::text`), the counters by the library's renderer of them
//! (`kcache::metrics::write_directory_counters`), so that the command and `kc_metrics_render`
//! agree on the format and on the families they share. `--textfile` writes the file that
//! node_exporter's textfile collector reads: to a temporary file in the same directory, then
//! renamed over it, so that a scrape never reads half a file.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use kcache::metrics::text::{Exposition, Kind};
use kcache::metrics::{write_build_info, write_directory_counters};

use super::Target;
use super::stats::directory_stats;
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
    write_directory_counters(&mut out, &stats.counters);
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
