//! `kcache stats`: the directory's entries per key generation and backend, and the counters
//! every process using it adds to.

use std::collections::BTreeMap;
use std::time::SystemTime;

use kcache::disk::{Check, DirectoryCounters, EntryInfo, Fingerprint};
use kcache::store::StoreKind;
use serde::{Serialize, Serializer};

use super::{SCHEMA, Target, backend_of, hex};
use crate::Failure;
use crate::report::{self, Table};

#[derive(Serialize)]
pub struct StatsJson {
    schema: u32,
    dir: String,
    pub cap_bytes: u64,
    /// The file-count cap; `null` without one.
    pub max_files: Option<u64>,
    pub entries: u64,
    pub bytes: u64,
    pub generations: Vec<GenerationJson>,
    pub backends: Vec<BackendJson>,
    oldest_used_unix_ns: Option<u64>,
    newest_used_unix_ns: Option<u64>,
    #[serde(serialize_with = "counters_json")]
    pub counters: DirectoryCounters,
    memory_hit_rate: Option<f64>,
    disk_hit_rate: Option<f64>,
    remote_hit_rate: Option<f64>,
    s3_hit_rate: Option<f64>,
    counters_zeroed_unix_ns: Option<u64>,
    counter_shards: u32,
    counter_shards_ignored: u32,
    /// Why the directory cannot be written now (full, read-only, no permission); `null` when
    /// it can.
    cannot_write: Option<String>,
}

/// The counters in `--json`: an object of every counter under its field's name.
fn counters_json<S: Serializer>(c: &DirectoryCounters, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(c.named())
}

#[derive(Serialize)]
pub struct BackendJson {
    pub backend: String,
    pub entries: u64,
    pub bytes: u64,
}

#[derive(Serialize)]
pub struct GenerationJson {
    fingerprint: String,
    pub current: bool,
    pub entries: u64,
    pub bytes: u64,
}

/// What `stats` (and `metrics`) report of the directory, with the least and most recent use.
pub fn directory_stats(
    target: &Target,
) -> Result<(StatsJson, Option<SystemTime>, Option<SystemTime>), Failure> {
    let (cache, settings) = target.open()?;
    let entries: Vec<EntryInfo> = cache.entries()?.into_iter().filter(|e| e.regular).collect();
    let current = cache.fingerprint();
    let mut generations: BTreeMap<(bool, Fingerprint), (u64, u64)> = BTreeMap::new();
    for e in &entries {
        let g = generations
            .entry((e.fingerprint != current, e.fingerprint))
            .or_default();
        g.0 += 1;
        g.1 += e.size;
    }
    // Per backend as each entry's verified descriptor says: every entry is read whole.
    let mut backends: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for e in &entries {
        let check = cache.check(e);
        if check == Check::Gone {
            continue;
        }
        let b = backends.entry(backend_of(&check).to_owned()).or_default();
        b.0 += 1;
        b.1 += e.size;
    }
    let oldest = entries.iter().map(|e| e.modified).min();
    let newest = entries.iter().map(|e| e.modified).max();
    let persisted = cache.directory_stats()?;
    let out = StatsJson {
        schema: SCHEMA,
        dir: cache.path().display().to_string(),
        cap_bytes: settings.cap,
        max_files: settings.max_files,
        entries: entries.len() as u64,
        bytes: entries.iter().map(|e| e.size).sum(),
        generations: generations
            .iter()
            .map(|(&(other, fp), &(entries, bytes))| GenerationJson {
                fingerprint: hex(&fp),
                current: !other,
                entries,
                bytes,
            })
            .collect(),
        backends: backends
            .into_iter()
            .map(|(backend, (entries, bytes))| BackendJson {
                backend,
                entries,
                bytes,
            })
            .collect(),
        oldest_used_unix_ns: oldest.map(report::unix_nanos),
        newest_used_unix_ns: newest.map(report::unix_nanos),
        counters: persisted.counters,
        memory_hit_rate: persisted.counters.memory_hit_rate(),
        disk_hit_rate: persisted.counters.disk_hit_rate(),
        remote_hit_rate: persisted.counters.remote_hit_rate(),
        s3_hit_rate: persisted.counters.store_hit_rate(StoreKind::ObjectStore),
        counters_zeroed_unix_ns: persisted.last_zeroed.map(report::unix_nanos),
        counter_shards: persisted.shards,
        counter_shards_ignored: persisted.shards_ignored,
        cannot_write: cache.cannot_write(),
    };
    Ok((out, oldest, newest))
}

pub fn stats(target: &Target, json: bool) -> Result<u8, Failure> {
    let (out, oldest, newest) = directory_stats(target)?;
    if json {
        report::json(&out);
        return Ok(0);
    }
    let now = SystemTime::now();
    out!("directory:  {}", out.dir);
    if let Some(why) = &out.cannot_write {
        out!("writable:   no, {why}: processes cache nothing here, and count nothing");
    }
    out!(
        "entries:    {} ({}), cap {} ({:.1} % used)",
        out.entries,
        report::size(out.bytes),
        report::size(out.cap_bytes),
        out.bytes as f64 * 100.0 / out.cap_bytes as f64
    );
    if let (Some(oldest), Some(newest)) = (oldest, newest) {
        out!("least recently used: {}", report::time(oldest, now));
        out!("most recently used:  {}", report::time(newest, now));
    }
    if !out.generations.is_empty() {
        out!("key generations:");
        let mut table = Table::new(&[
            ("  FINGERPRINT", false),
            ("ENTRIES", true),
            ("SIZE", true),
            ("", false),
        ]);
        for g in &out.generations {
            table.row(vec![
                format!("  {}", g.fingerprint),
                g.entries.to_string(),
                report::size(g.bytes),
                generation_note(g.current, &g.fingerprint),
            ]);
        }
        table.print();
    }
    if !out.backends.is_empty() {
        out!("backends:");
        let mut table = Table::new(&[("  BACKEND", false), ("ENTRIES", true), ("SIZE", true)]);
        for b in &out.backends {
            table.row(vec![
                format!("  {}", report::printable(&b.backend)),
                b.entries.to_string(),
                report::size(b.bytes),
            ]);
        }
        table.print();
    }
    let zeroed = out
        .counters_zeroed_unix_ns
        .map(|ns| std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns));
    print_counters(&out, zeroed, now);
    Ok(0)
}

/// The directory's counters, for people.
fn print_counters(out: &StatsJson, zeroed: Option<SystemTime>, now: SystemTime) {
    let c = &out.counters;
    let since = zeroed.map_or("since the directory was first used".into(), |t| {
        format!("since zeroed {}", report::time(t, now))
    });
    let rate =
        |r: Option<f64>| r.map_or("no lookups".into(), |r| format!("{:.1} % hits", r * 100.0));
    out!("counters of every process ({since}):");
    out!(
        "  memory lookups  {} hits, {} misses ({})",
        c.memory_hits,
        c.memory_misses,
        rate(out.memory_hit_rate)
    );
    out!(
        "  disk reads      {} hits, {} misses ({})",
        c.disk_hits,
        c.disk_misses,
        rate(out.disk_hit_rate)
    );
    out!(
        "  builds {}, disk writes {}, failed writes {}",
        c.builds,
        c.disk_writes,
        c.failed_writes
    );
    out!(
        "  integrity rejects {}, evictions {}",
        c.integrity_rejects,
        c.evictions
    );
    out!(
        "  waits for another process {}, timed out {}, taken over {}",
        c.lock_waits,
        c.lock_timeouts,
        c.lock_takeovers
    );
    // Each store behind the disk, under its own name: the Redis tier as `remote`.
    for (name, kind) in [("remote", StoreKind::Redis), ("s3", StoreKind::ObjectStore)] {
        let r = c.store(kind);
        out!(
            "  {name:<6} reads    {} hits, {} misses ({}), {} rejects",
            r.hits,
            r.misses,
            rate(r.hit_rate()),
            r.rejects
        );
        out!(
            "  {name} errors {}, timeouts {}, skipped {}, breaker trips {}",
            r.errors,
            r.timeouts,
            r.skipped,
            r.breaker_trips
        );
        out!(
            "  {name} writes {} ({} written, {} read), leases {}, lease waits {}, timed out {}, \
             built without the lease {}, lost {}",
            r.puts,
            report::size(r.bytes_written),
            report::size(r.bytes_read),
            r.leases,
            r.lease_waits,
            r.lease_timeouts,
            r.lease_failures,
            r.leases_lost
        );
    }
    if out.counter_shards_ignored > 0 {
        out!(
            "  counter files damaged or foreign, counted as zero: {}",
            out.counter_shards_ignored
        );
    }
}

fn generation_note(current: bool, fingerprint: &str) -> String {
    match (current, fingerprint.bytes().all(|b| b == b'0')) {
        (true, true) => "this configuration (unkeyed)".into(),
        (true, false) => "this key".into(),
        (false, true) => "unkeyed: gc removes it".into(),
        (false, false) => "another key: gc removes it unless --retain-key".into(),
    }
}
