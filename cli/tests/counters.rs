//! Counters that outlive a process: two real processes look up known kernels in one directory,
//! and `kcache stats --json` (the built binary) reports the sum of what both did;
//! `kcache zero-stats` then zeroes it. Damaged counter files count as zero, and the entry tools
//! (`verify`, `gc`, `clear`) leave them alone.
//!
//! Each process is this test binary run again with [`WORKER_DIR`] set (see [`counters_worker`]).

use std::path::Path;

mod common;

use common::{counter, json, run};
use kcache_testkit::strings::{disk, find_or_build, l2_key, serialize, tiered};
use kcache_testkit::{rerun_test, run_together};

/// The worker's cache directory; unset in the normal test run.
const WORKER_DIR: &str = "KCACHE_COUNTERS_DIR";
/// The worker's number, which names the one kernel only it builds.
const WORKER_ID: &str = "KCACHE_COUNTERS_ID";

/// Kernels the parent writes before the workers start: each worker reads them from disk.
const STORED: [&str; 3] = ["a", "b", "c"];
/// Lookups of each kernel a worker makes after the first (memory hits).
const REPEATS: u64 = 2;

/// Runs inside a worker process only; a no-op in the normal test run. Looks up every stored
/// kernel `1 + REPEATS` times and its own kernel (absent from disk: built and written) once.
#[test]
fn counters_worker() {
    let Ok(dir) = std::env::var(WORKER_DIR) else {
        return;
    };
    let id = std::env::var(WORKER_ID).unwrap();
    let cache = tiered(Some(disk(Path::new(&dir))));
    let lookup = |source: &str| {
        let lease = find_or_build(
            &cache,
            source,
            || Ok((format!("built {source}"), 1)),
            serialize,
        )
        .unwrap();
        lease.value().clone()
    };
    for source in STORED {
        for _ in 0..=REPEATS {
            assert_eq!(lookup(source), format!("stored {source}"));
        }
    }
    let own = format!("worker {id}");
    assert_eq!(lookup(&own), format!("built {own}"));
    // Dropping the cache and its disk tier writes this process's counters.
}

#[test]
fn two_processes_hits_add_up_and_zero_stats_zeroes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    {
        let d = disk(dir);
        for source in STORED {
            let value = format!("stored {source}");
            d.put(&l2_key(source), value.as_bytes(), Default::default())
                .unwrap();
        }
    }
    run_together((0..2).map(|id| {
        let mut worker = rerun_test("counters_worker");
        worker.env(WORKER_DIR, dir).env(WORKER_ID, id.to_string());
        worker
    }));

    let stats = json(dir, &["stats", "--json"]);
    let stored = STORED.len() as u64;
    // Per worker: each stored kernel misses memory once and is read from disk, then hits memory
    // REPEATS times; its own kernel misses both tiers and is built and written.
    assert_eq!(counter(&stats, "memory_hits"), 2 * stored * REPEATS);
    assert_eq!(counter(&stats, "memory_misses"), 2 * (stored + 1));
    assert_eq!(counter(&stats, "disk_hits"), 2 * stored);
    assert_eq!(counter(&stats, "disk_misses"), 2);
    assert_eq!(counter(&stats, "builds"), 2);
    // The parent's writes count too.
    assert_eq!(counter(&stats, "disk_writes"), stored + 2);
    for name in [
        "integrity_rejects",
        "evictions",
        "lock_waits",
        "lock_timeouts",
        "lock_takeovers",
        "failed_writes",
    ] {
        assert_eq!(counter(&stats, name), 0, "{name}");
    }
    let memory_rate = (stored * REPEATS) as f64 / (stored * REPEATS + stored + 1) as f64;
    assert!((stats["memory_hit_rate"].as_f64().unwrap() - memory_rate).abs() < 1e-9);
    assert!((stats["disk_hit_rate"].as_f64().unwrap() - 0.75).abs() < 1e-9);
    assert!(stats["counters_zeroed_unix_ns"].is_null());
    assert_eq!(stats["counter_shards_ignored"], 0);
    let shards = stats["counter_shards"].as_u64().unwrap();
    assert!((1..=3).contains(&shards), "{shards} shards");
    assert_eq!(stats["entries"], stored + 2);

    let human = String::from_utf8(run(dir, &["stats"]).stdout).unwrap();
    assert!(
        human.contains("memory lookups  12 hits, 8 misses (60.0 % hits)"),
        "{human}"
    );

    let zeroed = json(dir, &["zero-stats", "--json"]);
    let when = zeroed["zeroed_unix_ns"].as_u64().unwrap();
    assert!(when > 0);
    let stats = json(dir, &["stats", "--json"]);
    for (name, value) in stats["counters"].as_object().unwrap() {
        assert_eq!(value, 0, "{name}");
    }
    assert!(stats["memory_hit_rate"].is_null() && stats["disk_hit_rate"].is_null());
    assert_eq!(stats["counters_zeroed_unix_ns"], when);
    assert_eq!(stats["counter_shards"], 16);
    // Zeroing touches no entry.
    assert_eq!(stats["entries"], stored + 2);

    // One more process adds to the zeroed counters.
    let output = rerun_test("counters_worker")
        .env(WORKER_DIR, dir)
        .env(WORKER_ID, "2")
        .output()
        .unwrap();
    assert!(output.status.success());
    let stats = json(dir, &["stats", "--json"]);
    assert_eq!(counter(&stats, "memory_hits"), stored * REPEATS);
    assert_eq!(counter(&stats, "builds"), 1);
}

#[test]
fn damaged_counter_files_count_as_zero_and_entry_tools_leave_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    {
        let d = disk(dir);
        d.put(&l2_key("x"), b"stored x", Default::default())
            .unwrap();
    }
    // This process wrote one entry: its shard holds disk_writes = 1.
    let stats = json(dir, &["stats", "--json"]);
    assert_eq!(counter(&stats, "disk_writes"), 1);
    assert_eq!(stats["counter_shards"], 1);
    let mine = format!(".stats-{:x}", std::process::id() % 16);
    let other = if mine == ".stats-0" {
        ".stats-1"
    } else {
        ".stats-0"
    };
    std::fs::write(dir.join(other), b"not a counter file").unwrap();

    let stats = json(dir, &["stats", "--json"]);
    assert_eq!(counter(&stats, "disk_writes"), 1);
    assert_eq!(stats["counter_shards"], 1);
    assert_eq!(stats["counter_shards_ignored"], 1);

    let verify = json(dir, &["verify", "--json"]);
    assert_eq!(verify["checked"], 1);
    assert_eq!(verify["corrupt"].as_array().unwrap().len(), 0);
    json(dir, &["gc", "--json"]);
    json(dir, &["clear", "--json"]);
    assert!(dir.join(&mine).exists() && dir.join(other).exists());
    let stats = json(dir, &["stats", "--json"]);
    assert_eq!(stats["entries"], 0);
    assert_eq!(counter(&stats, "disk_writes"), 1);

    // Zeroing rewrites the damaged shard too.
    json(dir, &["zero-stats", "--json"]);
    let stats = json(dir, &["stats", "--json"]);
    assert_eq!(stats["counter_shards"], 16);
    assert_eq!(stats["counter_shards_ignored"], 0);
}
