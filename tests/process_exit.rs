//! A process that calls `exit` without dropping its caches still writes what it built, within
//! `KCACHE_EXIT_TIMEOUT`; what it could not write by then is counted and logged. The child
//! builds many small values at once, each written (and synced) by the background writer, so
//! that most of its writes are still queued when it exits.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use kcache::disk::Durability;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::rerun_test;
use kcache_testkit::strings::{l2_key, lookup, tiered};

const VALUES: usize = 400;

fn source(i: usize) -> String {
    format!("exit-{i}")
}

fn open(dir: &Path) -> Persistence {
    Persistence::open(PersistenceConfig {
        // Each write syncs its file and the directory: the writer falls behind the builds.
        durability: Durability::Sync,
        ..PersistenceConfig::in_dir(dir)
    })
    .unwrap()
}

/// Runs inside a child process only; a no-op in the normal test run.
#[test]
fn child_role() {
    let Ok(dir) = std::env::var("KCACHE_TEST_EXIT_DIR") else {
        return;
    };
    let cache = tiered(Some(Arc::new(open(Path::new(&dir)))));
    let builds = AtomicUsize::new(0);
    for i in 0..VALUES {
        lookup(&cache, &source(i), &builds).unwrap();
    }
    // No flush and no drop: `exit` runs no destructor.
    std::process::exit(0);
}

/// The child's exit status, stderr, how many of its entries are on disk, and the failed writes
/// the directory's counters record.
fn run_child(exit_timeout: Option<&str>) -> (bool, String, usize, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = rerun_test("child_role");
    child
        .env("KCACHE_TEST_EXIT_DIR", tmp.path())
        .env_remove("KCACHE_EXIT_TIMEOUT");
    if let Some(timeout) = exit_timeout {
        child.env("KCACHE_EXIT_TIMEOUT", timeout);
    }
    let output = child.output().unwrap();
    let disk = open(tmp.path());
    let written = (0..VALUES)
        .filter(|&i| disk.entry_path(&l2_key(&source(i))).exists())
        .count();
    let failed = disk.directory_stats().unwrap().counters.failed_writes;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.success(), stderr, written, failed)
}

#[test]
fn an_exit_without_drop_writes_what_was_built_and_counts_what_it_could_not() {
    let (ok, stderr, written, failed) = run_child(None);
    assert!(ok, "{stderr}");
    assert_eq!(written, VALUES, "entries on disk after the exit: {stderr}");
    assert_eq!(failed, 0);

    // No time to write: what is left is counted and said.
    let (ok, stderr, written, failed) = run_child(Some("0"));
    assert!(ok, "{stderr}");
    assert!(written < VALUES, "the writer was still busy");
    let counted: usize = stderr
        .split("exit: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of what was left: {stderr}"));
    // Every write not on disk, and the one that may have renamed its file but not finished.
    let left = VALUES - written;
    assert!(
        (left..=left + 1).contains(&counted),
        "{counted} counted, {left} left: {stderr}"
    );
    assert_eq!(failed, counted as u64, "in the directory's counters");
    assert!(
        stderr.contains("KCACHE_EXIT_TIMEOUT of 0 s reached"),
        "{stderr}"
    );
}
