//! Single-flight across nodes on a machine loaded on purpose: worker processes (this test
//! executable run again), three per node on two nodes (two cache directories), one Redis, look
//! up the same entries from the same instant while the test keeps two threads spinning, as the
//! test command's machine is busy with other builds. Each entry is built once, but for builds
//! begun without the lease for a counted reason: every build is a lease taken, a failed lease
//! operation (`lease_failures`) or a wait past its deadline (`lease_timeouts`). The
//! assertions are on counts only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kcache::disk::{Durability, OperatorKey};
use kcache::remote::{RemoteConfig, RemoteStats};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::load::Load;
use kcache_testkit::redis::RedisServer;
use kcache_testkit::strings::{assert_flights, find_or_build, serialize, tiered};
use kcache_testkit::workers::{Worker, worker_command, worker_job};
use serde::{Deserialize, Serialize};

const KEY: [u8; 32] = [7; 32];
const ENTRIES: [&str; 6] = [
    "add128", "add1024", "softmax", "matmul0", "matmul1", "matmul2",
];

/// What a worker does.
#[derive(Serialize, Deserialize)]
struct Job {
    /// The node's cache directory.
    dir: PathBuf,
    /// The Redis URL.
    url: String,
    /// A file to wait for, so that every worker starts at once.
    go: PathBuf,
    /// How long to wait after that: processes of a busy machine drift apart, and a late one
    /// arrives while another node finishes an entry.
    delay_ms: u64,
}

/// Runs inside a worker process only; a no-op in the normal test run.
#[test]
fn cluster_worker() {
    let Some(job) = worker_job::<Job>() else {
        return;
    };
    let mut config = PersistenceConfig::in_dir(&job.dir);
    config.durability = Durability::Relaxed;
    config.key = Some(OperatorKey::new(KEY).unwrap());
    config.remote = Some(RemoteConfig::at(job.url));
    let cache = tiered(Some(Arc::new(Persistence::open(config).unwrap())));
    println!("ready");
    while !job.go.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(job.delay_ms));
    let mut builds = 0;
    for source in ENTRIES {
        let build = || {
            builds += 1;
            // A compile's worth of work, on the busy CPUs.
            let mut x = 0u64;
            for i in 0..20_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            std::hint::black_box(x);
            Ok((format!("compiled({source})"), 1))
        };
        let lease = find_or_build(&cache, source, build, serialize).unwrap();
        assert_eq!(lease.value(), &format!("compiled({source})"));
    }
    cache.flush();
    let disk = cache.disk().unwrap();
    let r = disk.remote_stats().unwrap();
    println!(
        "builds={builds} {} {} {} {} {}",
        r.leases, r.lease_failures, r.lease_timeouts, r.leases_lost, r.hits
    );
    std::process::exit(0);
}

/// The worker's builds and remote counters, from its last line.
fn parse(out: &str) -> (usize, RemoteStats) {
    let line = out.lines().last().unwrap();
    let values: Vec<u64> = (line.strip_prefix("builds=").unwrap().split(' '))
        .map(|v| v.parse().unwrap())
        .collect();
    let [
        builds,
        leases,
        lease_failures,
        lease_timeouts,
        leases_lost,
        hits,
    ] = values[..]
    else {
        panic!("{line}");
    };
    let stats = RemoteStats {
        leases,
        lease_failures,
        lease_timeouts,
        leases_lost,
        hits,
        ..RemoteStats::default()
    };
    (builds as usize, stats)
}

fn spawn(dir: &Path, url: &str, go: &Path, delay_ms: u64, logs: &Path) -> Worker {
    let job = Job {
        dir: dir.into(),
        url: url.into(),
        go: go.into(),
        delay_ms,
    };
    let mut cmd = worker_command("cluster_worker", &job);
    for name in ["KCACHE_DIR", "KCACHE_REMOTE_URL"] {
        cmd.env_remove(name);
    }
    // Each build begun without the lease says why.
    cmd.env("KCACHE_LOG", "info");
    Worker::spawn(cmd, logs)
}

#[test]
fn six_processes_on_two_nodes_of_a_loaded_machine_build_each_entry_once_or_say_why() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let go = tmp.path().join("go");
    let nodes = [tmp.path().join("node0"), tmp.path().join("node1")];
    let _load = Load::start(2);
    let mut workers: Vec<Worker> = (0..6)
        .map(|i| {
            spawn(
                &nodes[i % 2],
                &server.url(),
                &go,
                i as u64 * 170,
                tmp.path(),
            )
        })
        .collect();
    for w in &mut workers {
        w.wait_for("ready");
    }
    std::fs::write(&go, b"").unwrap();
    let mut builds = 0;
    let (mut stats, mut said) = (Vec::new(), Vec::new());
    for w in workers {
        let (out, err) = w.finish_output(Duration::from_secs(300));
        assert!(out.contains("builds="), "{out}\n{err}");
        let (b, s) = parse(&out);
        builds += b;
        stats.push(s);
        said.extend(
            err.lines()
                .filter(|l| l.contains("lease"))
                .map(str::to_owned),
        );
    }
    eprintln!("{builds} builds of {} entries: {said:#?}", ENTRIES.len());
    assert_flights(builds, ENTRIES.len(), &stats);
}
