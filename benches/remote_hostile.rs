//! What a broken or hostile Redis server costs a lookup, with a 250 ms timeout and the
//! default 64 MiB entry size limit: each scenario runs in a fresh process (this executable
//! again, given the scenario's name) against `FakeRedis` on loopback, and prints each lookup's
//! time, the process's peak RSS (`VmHWM`) after it, the flush's time and the remote counters.
//! The figures are in docs/remote.md ("Against a broken or hostile server").
//!
//! `cargo bench --bench remote_hostile` runs every scenario; `-- NAME` one of them.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use kcache::disk::{Durability, OperatorKey};
use kcache::remote::RemoteConfig;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::redis::{FakeRedis, Reply, plain_answer};
use kcache_testkit::strings::{lookup, tiered};

/// A scenario: the server, the lease wait (seconds; 0: no leases), the lookups.
type Scenario = fn() -> (FakeRedis, u64, usize);

const SCENARIOS: &[(&str, Scenario)] = &[
    ("huge", || {
        let head = b"$2000000000\r\n".to_vec();
        (
            FakeRedis::answering("GETRANGE", Reply::Flood(head, 1_500_000_000)),
            0,
            1,
        )
    }),
    ("trickle-all", || (FakeRedis::start(trickled), 120, 3)),
    ("trickle-read", || {
        let reply = trickled(&[b"GETRANGE".to_vec()]);
        (FakeRedis::answering("GETRANGE", reply), 120, 4)
    }),
    ("trickle-set", || {
        let server = FakeRedis::start(|args| {
            if args[0].eq_ignore_ascii_case(b"SET") {
                trickled(args)
            } else {
                Reply::Bytes(plain_answer(args))
            }
        });
        (server, 0, 1)
    }),
    ("array", || {
        let mut reply = b"*2000000\r\n".to_vec();
        reply.extend(b":1\r\n".repeat(2_000_000));
        (FakeRedis::answering("GETRANGE", Reply::Bytes(reply)), 0, 1)
    }),
    ("nested", || {
        let reply = b"*1\r\n".repeat(1_000_000);
        (FakeRedis::answering("GETRANGE", Reply::Bytes(reply)), 0, 1)
    }),
];

/// A 60-byte reply to `args` (a bulk string for the read, a simple string for the rest), a
/// byte every 200 ms.
fn trickled(args: &[Vec<u8>]) -> Reply {
    let reply = if args[0].eq_ignore_ascii_case(b"GETRANGE") {
        format!("$53\r\n{}\r\n", "x".repeat(53))
    } else {
        format!("+{}\r\n", "O".repeat(57))
    };
    Reply::Trickle(reply.into_bytes(), Duration::from_millis(200))
}

fn peak_rss() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM")).unwrap();
    line.trim_start_matches("VmHWM:").trim().to_owned()
}

fn run(name: &str, scenario: Scenario) {
    let (server, lease_wait, lookups) = scenario();
    let dir = tempfile::tempdir().unwrap();
    let disk = Persistence::open(PersistenceConfig {
        key: Some(OperatorKey::new(vec![7; 32]).unwrap()),
        durability: Durability::Relaxed,
        remote: Some(RemoteConfig {
            timeout: Some(Duration::from_millis(250)),
            lease_wait: Some(Duration::from_secs(lease_wait)),
            breaker_cooldown: Some(Duration::from_secs(3600)),
            ..RemoteConfig::at(server.url())
        }),
        ..PersistenceConfig::in_dir(dir.path())
    })
    .unwrap();
    let cache = tiered(Some(Arc::new(disk)));
    let builds = AtomicUsize::new(0);
    println!("{name}: peak RSS before {}", peak_rss());
    for i in 0..lookups {
        let started = Instant::now();
        lookup(&cache, &format!("k{i}"), &builds).unwrap();
        let took = started.elapsed();
        println!("{name}: lookup {i}: {took:.2?}, peak RSS {}", peak_rss());
    }
    let started = Instant::now();
    cache.flush();
    println!("{name}: flush {:.2?}", started.elapsed());
    println!(
        "{name}: {:?}",
        cache.disk().unwrap().remote_stats().unwrap()
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if let [name] = &args[..]
        && let Some((name, scenario)) = SCENARIOS.iter().find(|(n, _)| n == name)
    {
        return run(name, *scenario);
    }
    for (name, _) in SCENARIOS {
        let exe = std::env::current_exe().unwrap();
        let status = Command::new(exe).arg(name).status().unwrap();
        assert!(status.success(), "scenario {name} failed");
    }
}
