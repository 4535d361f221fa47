//! A running process's counters reach the directory every few seconds, without a flush: a
//! worker process looks keys up (misses, built and written to disk) and then sleeps; this
//! process reads the directory's counters, as `kcache metrics` does, and finds them there.

use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::rerun_test;
use kcache_testkit::strings::{disk, lookup, tiered};
use kcache_testkit::workers::Worker;

const DIR_ENV: &str = "KCACHE_TEST_PUBLISH_DIR";
const KEYS: u64 = 3;

/// Runs inside the worker process only; a no-op in the normal test run.
#[test]
fn sleeper_role() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return;
    };
    let cache = tiered(Some(disk(Path::new(&dir))));
    let builds = AtomicUsize::new(0);
    for i in 0..KEYS {
        lookup(&cache, &format!("published-{i}"), &builds).unwrap();
    }
    println!("looked up");
    // No flush, no drop, no exit: the test kills this process when it is done.
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_running_process_publishes_its_counters_without_a_flush() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let mut command = rerun_test("sleeper_role");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KCACHE_") {
            command.env_remove(name);
        }
    }
    command.env(DIR_ENV, &dir);
    let mut worker = Worker::spawn(command, tmp.path());
    worker.wait_for("looked up");
    let reader = Persistence::open(PersistenceConfig::in_dir(&dir)).unwrap();
    // A watchdog, not a speed claim: the figures are due within seconds.
    let deadline = Instant::now() + Duration::from_secs(60);
    let counters = loop {
        let counters = reader.directory_stats().unwrap().counters;
        if counters.disk_writes == KEYS || Instant::now() > deadline {
            break counters;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(counters.disk_misses, KEYS, "{counters:?}");
    assert_eq!(counters.disk_writes, KEYS, "{counters:?}");
    assert_eq!(counters.builds, KEYS, "{counters:?}");
    assert!(
        worker.child.try_wait().unwrap().is_none(),
        "the worker still runs, unflushed"
    );
}
