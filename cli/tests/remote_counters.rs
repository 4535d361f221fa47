//! The remote tier's counters outlive their process too: two real processes with one cache
//! directory and one `redis-server` each read an entry another node put in the store and build
//! one of their own, and `kcache stats --json` (the built binary) reports the exact sums of
//! their remote reads, writes, leases and bytes; `kcache zero-stats` zeroes them.
//!
//! Each process is this test binary run again with [`WORKER_DIR`] set (see [`remote_worker`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

mod common;

use common::{counter, json, run};
use kcache::disk::{Durability, OperatorKey};
use kcache::remote::RemoteConfig;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::redis::RedisServer;
use kcache_testkit::strings::{l2_key, lookup, tiered};
use kcache_testkit::{rerun_test, run_together};

/// The worker's cache directory; unset in the normal test run.
const WORKER_DIR: &str = "KCACHE_REMOTE_COUNTERS_DIR";
/// The worker's number, which names the kernels it looks up.
const WORKER_ID: &str = "KCACHE_REMOTE_COUNTERS_ID";
/// The store's URL.
const WORKER_URL: &str = "KCACHE_REMOTE_COUNTERS_URL";

/// The operator key every node shares.
const KEY: [u8; 32] = [5; 32];

/// A keyed disk tier in `dir` with the store at `url` behind it.
fn node(dir: &Path, url: &str) -> Arc<Persistence> {
    Arc::new(
        Persistence::open(PersistenceConfig {
            key: Some(OperatorKey::new(KEY.to_vec()).unwrap()),
            durability: Durability::Relaxed,
            remote: Some(RemoteConfig::at(url)),
            ..PersistenceConfig::in_dir(dir)
        })
        .unwrap(),
    )
}

/// The kernel another node put in the store for worker `id`, and the one only it builds.
fn kernels(id: &str) -> (String, String) {
    (format!("stored {id}"), format!("own {id}"))
}

/// Runs inside a worker process only; a no-op in the normal test run. Reads its stored kernel
/// from the store (a remote hit) and builds its own (a remote miss, a lease, a write).
#[test]
fn remote_worker() {
    let Ok(dir) = std::env::var(WORKER_DIR) else {
        return;
    };
    let id = std::env::var(WORKER_ID).unwrap();
    let cache = tiered(Some(node(
        Path::new(&dir),
        &std::env::var(WORKER_URL).unwrap(),
    )));
    let builds = AtomicUsize::new(0);
    let (stored, own) = kernels(&id);
    assert_eq!(
        lookup(&cache, &stored, &builds).unwrap(),
        format!("compiled({stored})")
    );
    assert_eq!(
        lookup(&cache, &own, &builds).unwrap(),
        format!("compiled({own})")
    );
    assert_eq!(builds.into_inner(), 1);
    // Dropping the cache and its disk tier writes the entry to the store, then this
    // process's counters.
}

#[test]
fn two_processes_remote_counters_add_up_and_zero_stats_zeroes_them() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let ids = ["0", "1"];
    // Another node, with a directory of its own, puts each worker's stored kernel in the store.
    let elsewhere = tempfile::tempdir().unwrap();
    let other = node(elsewhere.path(), &url);
    {
        let cache = tiered(Some(Arc::clone(&other)));
        let builds = AtomicUsize::new(0);
        for id in ids {
            lookup(&cache, &kernels(id).0, &builds).unwrap();
        }
        cache.flush();
    }
    let entry_size = |source: &str| {
        let path = other.entry_path(&l2_key(source));
        let name = path.file_name().unwrap().to_str().unwrap();
        server.get(&format!("kcache:{name}")).len() as u64
    };

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    run_together(ids.iter().map(|id| {
        let mut worker = rerun_test("remote_worker");
        worker
            .env(WORKER_DIR, dir)
            .env(WORKER_ID, id)
            .env(WORKER_URL, &url);
        worker
    }));

    let read: u64 = ids.iter().map(|id| entry_size(&kernels(id).0)).sum();
    let written: u64 = ids.iter().map(|id| entry_size(&kernels(id).1)).sum();
    assert!(read > 0 && written > 0);
    let stats = json(dir, &["stats", "--json"]);
    for (name, value) in [
        ("remote_hits", 2),
        ("remote_misses", 2),
        ("remote_leases", 2),
        ("remote_puts", 2),
        ("remote_bytes_read", read),
        ("remote_bytes_written", written),
        ("remote_rejects", 0),
        ("remote_errors", 0),
        ("remote_timeouts", 0),
        ("remote_skipped", 0),
        ("remote_breaker_trips", 0),
        ("remote_lease_waits", 0),
        ("remote_lease_timeouts", 0),
        ("remote_lease_failures", 0),
        ("remote_leases_lost", 0),
        ("builds", 2),
    ] {
        assert_eq!(counter(&stats, name), value, "{name}");
    }
    assert!((stats["remote_hit_rate"].as_f64().unwrap() - 0.5).abs() < 1e-9);
    let human = String::from_utf8(run(dir, &["stats"]).stdout).unwrap();
    assert!(
        human.contains("remote reads    2 hits, 2 misses (50.0 % hits), 0 rejects"),
        "{human}"
    );

    json(dir, &["zero-stats", "--json"]);
    let stats = json(dir, &["stats", "--json"]);
    assert_eq!(counter(&stats, "remote_hits"), 0);
    assert_eq!(counter(&stats, "remote_bytes_written"), 0);
    assert!(stats["remote_hit_rate"].is_null());
}
