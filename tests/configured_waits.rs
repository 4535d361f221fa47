//! Waits and timeouts however large mean "as long as possible": `Duration::MAX` from code, or
//! `KCACHE_LOCK_TIMEOUT=1e19` from the environment, must not make a lookup panic when it turns
//! them into a deadline. Each is kept, up to `LONGEST_WAIT`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kcache::disk::Durability;
use kcache::disk::config::LONGEST_WAIT;
use kcache::remote::RemoteConfig;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::redis::RedisServer;
use kcache_testkit::strings::{disk_with_lock_timeout, disk_with_remote, lookup, tiered};
use kcache_testkit::{rerun_test, successful_stdout};

#[test]
fn a_lock_timeout_of_duration_max_waits_as_long_as_possible() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = disk_with_lock_timeout(tmp.path(), Some(Duration::MAX));
    assert_eq!(disk.lock_timeout(), LONGEST_WAIT);
    let builds = AtomicUsize::new(0);
    let cache = tiered(Some(disk));
    // A cold lookup takes the entry's lock, with a deadline of now plus the timeout.
    assert_eq!(lookup(&cache, "k", &builds).unwrap(), "compiled(k)");
    assert_eq!(builds.load(Ordering::SeqCst), 1);
}

/// Runs inside a child process only; a no-op in the normal test run.
#[test]
fn child_role() {
    let Some(dir) = std::env::var_os("KCACHE_TEST_DIR") else {
        return;
    };
    let mut config = PersistenceConfig::from_env();
    config.durability = Durability::Relaxed;
    let disk = Arc::new(Persistence::open(config).unwrap());
    assert_eq!(disk.path(), Path::new(&dir));
    let timeout = disk.lock_timeout();
    let builds = AtomicUsize::new(0);
    let value = lookup(&tiered(Some(disk)), "k", &builds).unwrap();
    println!(
        "TIMEOUT={} VALUE={value} BUILDS={}",
        timeout.as_secs(),
        builds.load(Ordering::SeqCst)
    );
    std::process::exit(0);
}

#[test]
fn a_lock_timeout_past_any_deadline_from_the_environment_saturates() {
    for (value, secs) in [
        ("1e19", LONGEST_WAIT.as_secs()),
        ("100000000000000000000", LONGEST_WAIT.as_secs()),
        ("inf", LONGEST_WAIT.as_secs()),
        ("7", 7),
        ("nonsense", 120), // warned about, and the default kept
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = rerun_test("child_role");
        child
            .env("KCACHE_TEST_DIR", tmp.path())
            .env("KCACHE_DIR", tmp.path())
            .env("KCACHE_LOCK_TIMEOUT", value)
            .env("KCACHE_LOG", "warn");
        for unset in ["KCACHE_KEY_FILE", "KCACHE_REQUIRE_KEY", "KCACHE_REMOTE_URL"] {
            child.env_remove(unset);
        }
        let text = successful_stdout(value, &mut child);
        assert!(
            text.contains(&format!("TIMEOUT={secs} VALUE=compiled(k) BUILDS=1")),
            "KCACHE_LOCK_TIMEOUT={value}: {text}"
        );
    }
}

#[test]
fn remote_waits_of_duration_max_wait_as_long_as_possible() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let remote = RemoteConfig {
        timeout: Some(Duration::MAX),
        lease_wait: Some(Duration::MAX),
        ttl: Some(Duration::MAX),
        breaker_cooldown: Some(Duration::MAX),
        ..RemoteConfig::at(server.url())
    };
    let disk = disk_with_remote(dir.path(), Some(&[7; 32]), remote);
    let cache = tiered(Some(disk.clone()));
    let builds = AtomicUsize::new(0);
    // The lease's deadline is now plus the lease wait.
    assert_eq!(lookup(&cache, "k", &builds).unwrap(), "compiled(k)");
    cache.flush();
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    let s = disk.remote_stats().unwrap();
    assert_eq!((s.leases, s.puts, s.errors), (1, 1, 0));
    // The entry expires, but not within a human life: a TTL of Duration::MAX would be refused
    // by the server (the write would fail).
    let mut conn = server.connection();
    let entries: Vec<String> = server
        .keys()
        .into_iter()
        .filter(|k| !k.contains("lease"))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg(&entries[0])
        .query(&mut conn)
        .unwrap();
    let century_ms = i64::try_from(LONGEST_WAIT.as_millis()).unwrap();
    assert!(
        ttl_ms > century_ms - 3_600_000 && ttl_ms <= century_ms,
        "{ttl_ms}"
    );
}

#[test]
fn a_breaker_cooldown_of_duration_max_opens_the_breaker_without_panicking() {
    // Nothing listens on port 1: the first failure opens the breaker (threshold 1) until now
    // plus the cooldown.
    let dir = tempfile::tempdir().unwrap();
    let remote = RemoteConfig {
        timeout: Some(Duration::from_millis(200)),
        breaker_threshold: Some(1),
        breaker_cooldown: Some(Duration::MAX),
        ..RemoteConfig::at("redis://127.0.0.1:1/")
    };
    let disk = disk_with_remote(dir.path(), Some(&[7; 32]), remote);
    let cache = tiered(Some(disk.clone()));
    let builds = AtomicUsize::new(0);
    assert_eq!(lookup(&cache, "a", &builds).unwrap(), "compiled(a)");
    assert_eq!(lookup(&cache, "b", &builds).unwrap(), "compiled(b)");
    let s = disk.remote_stats().unwrap();
    assert_eq!(s.breaker_trips, 1);
    assert!(s.breaker_open && s.skipped >= 1, "{s:?}");
    assert_eq!(builds.load(Ordering::SeqCst), 2);
}
