//! The tiered lookup: L1 → L2 → build, with write-back, for a caller-defined backend whose
//! "live value" is a String and whose serialized form is its UTF-8 bytes.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use kcache::Persistence;
use kcache::{BuildError, Error};
use kcache_testkit::strings::{
    Cache, disk, find_or_build, l2_key, load, lookup, serialize, tiered,
};
use kcache_testkit::{rerun_test, successful_stdout};
use tempfile::TempDir;

/// A tiered cache on a disk tier in a new temporary directory, that disk tier, and the
/// directory (removed on drop).
fn tiered_on_temp_disk() -> (TempDir, Arc<Persistence>, Cache) {
    let tmp = tempfile::tempdir().unwrap();
    let d = disk(tmp.path());
    let cache = tiered(Some(d.clone()));
    (tmp, d, cache)
}

#[test]
fn a_fresh_memory_tier_gets_the_value_from_disk_without_building() {
    let tmp = tempfile::tempdir().unwrap();
    let builds = AtomicUsize::new(0);
    let first = tiered(Some(disk(tmp.path())));
    assert_eq!(lookup(&first, "k", &builds).unwrap(), "compiled(k)");
    assert_eq!(lookup(&first, "k", &builds).unwrap(), "compiled(k)");
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    first.flush();
    let s = first.stats();
    assert_eq!(
        (s.builds, s.write_backs, s.disk_misses, s.disk_hits),
        (1, 1, 1, 0)
    );
    let m = first.memory().stats();
    assert_eq!((m.builds, m.loads), (1, 0));

    let second = tiered(Some(disk(tmp.path())));
    assert_eq!(lookup(&second, "k", &builds).unwrap(), "compiled(k)");
    assert_eq!(
        builds.load(Ordering::SeqCst),
        1,
        "built again despite the disk entry"
    );
    let s = second.stats();
    assert_eq!((s.builds, s.disk_hits, s.write_backs), (0, 1, 0));
    // The memory tier counts the value it filled from disk as a load, not a build.
    let m = second.memory().stats();
    assert_eq!((m.misses, m.builds, m.loads), (1, 0, 1));
    assert_eq!(second.disk().unwrap().stats().hits, 1);
}

/// Runs inside a child process only; a no-op in the normal test run.
#[test]
fn child_role() {
    let Ok(dir) = std::env::var("KCACHE_TEST_DIR") else {
        return;
    };
    let builds = AtomicUsize::new(0);
    let cache = tiered(Some(disk(Path::new(&dir))));
    let value = lookup(&cache, "shared", &builds).unwrap();
    println!("VALUE={value} BUILDS={}", builds.load(Ordering::SeqCst));
    std::process::exit(0);
}

#[test]
fn a_second_process_gets_the_value_from_disk_without_building() {
    let tmp = tempfile::tempdir().unwrap();
    let builds = AtomicUsize::new(0);
    lookup(&tiered(Some(disk(tmp.path()))), "shared", &builds).unwrap();
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    let mut child = rerun_test("child_role");
    let text = successful_stdout("child", child.env("KCACHE_TEST_DIR", tmp.path()));
    assert!(text.contains("VALUE=compiled(shared) BUILDS=0"), "{text}");
}

#[test]
fn concurrent_misses_read_the_disk_once() {
    let tmp = tempfile::tempdir().unwrap();
    let builds = AtomicUsize::new(0);
    lookup(&tiered(Some(disk(tmp.path()))), "hot", &builds).unwrap();
    let cache = Arc::new(tiered(Some(disk(tmp.path()))));
    let loads = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (cache, loads, barrier) = (cache.clone(), loads.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let lease = cache
                    .find_or_build(
                        b"hot".as_slice(),
                        None,
                        || Ok(l2_key("hot")),
                        |bytes| {
                            loads.fetch_add(1, Ordering::SeqCst);
                            // Long enough that the other threads arrive during the flight.
                            std::thread::sleep(Duration::from_millis(50));
                            load(bytes)
                        },
                        || panic!("must not build: the disk has the entry"),
                        serialize,
                    )
                    .unwrap();
                lease.value().clone()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), "compiled(hot)");
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert_eq!(cache.disk().unwrap().stats().hits, 1);
    assert_eq!(cache.stats().disk_hits, 1);
}

#[test]
fn an_entry_that_does_not_load_is_removed_and_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let d = disk(tmp.path());
    // Verifies on disk, but is not something this backend can load.
    d.put(&l2_key("bad"), &[0xff, 0xfe], Duration::ZERO)
        .unwrap();
    let cache = tiered(Some(d.clone()));
    let builds = AtomicUsize::new(0);
    assert_eq!(lookup(&cache, "bad", &builds).unwrap(), "compiled(bad)");
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    cache.flush();
    let s = cache.stats();
    assert_eq!((s.load_failures, s.builds, s.write_backs), (1, 1, 1));
    assert_eq!(d.stats().load_failures, 1);
    let rewritten = d.get(&l2_key("bad")).unwrap().unwrap();
    assert_eq!(rewritten.payload(), b"compiled(bad)");
}

#[test]
fn a_transient_load_failure_keeps_the_entry_and_fails_the_lookup() {
    let (_tmp, d, cache) = tiered_on_temp_disk();
    d.put(&l2_key("k"), b"stored(k)", Duration::ZERO).unwrap();
    let builds = AtomicUsize::new(0);
    let build = || {
        builds.fetch_add(1, Ordering::SeqCst);
        Ok(("compiled(k)".to_owned(), 1))
    };
    let out_of_memory = |_: &[u8]| Err(BuildError::transient(2, "out of memory"));
    let failed = cache.find_or_build(
        b"k".as_slice(),
        None,
        || Ok(l2_key("k")),
        out_of_memory,
        build,
        serialize,
    );
    match failed {
        Err(Error::Build(e)) => assert_eq!((e.code, e.transient), (2, true)),
        other => panic!("expected the transient error, got {other:?}"),
    }
    assert_eq!(builds.load(Ordering::SeqCst), 0);
    let s = cache.stats();
    assert_eq!((s.load_failures, s.builds, s.disk_hits), (0, 0, 0));
    assert_eq!(
        d.get(&l2_key("k")).unwrap().unwrap().payload(),
        b"stored(k)"
    );
    // The entry is still there for the next lookup.
    assert_eq!(lookup(&cache, "k", &builds).unwrap(), "stored(k)");
    assert_eq!(builds.load(Ordering::SeqCst), 0);
}

#[test]
fn memory_only_without_a_disk() {
    let cache = tiered(None);
    let builds = AtomicUsize::new(0);
    assert_eq!(lookup(&cache, "m", &builds).unwrap(), "compiled(m)");
    assert_eq!(lookup(&cache, "m", &builds).unwrap(), "compiled(m)");
    let s = cache.stats();
    assert_eq!((s.builds, s.disk_misses, s.write_backs), (1, 1, 0));
}

#[test]
fn build_failures_are_returned_and_nothing_is_written() {
    let (_tmp, d, cache) = tiered_on_temp_disk();
    let failing = || Err(BuildError::new(42, "compiler error"));
    let err = find_or_build(&cache, "f", failing, serialize).unwrap_err();
    assert_eq!(err, Error::Build(BuildError::new(42, "compiler error")));
    assert_eq!(d.get(&l2_key("f")).unwrap(), None);
    assert_eq!(cache.stats().write_backs, 0);
}

#[test]
fn a_failed_write_back_is_counted_not_returned() {
    let (_tmp, d, cache) = tiered_on_temp_disk();
    let unserializable = |_: &String| Err(BuildError::new(7, "cannot serialize"));
    let lease =
        find_or_build(&cache, "w", || Ok(("value".to_string(), 1)), unserializable).unwrap();
    assert_eq!(lease.value(), "value");
    assert_eq!(cache.stats().write_back_failures, 1);
    assert_eq!(d.get(&l2_key("w")).unwrap(), None);
}

#[test]
fn the_l2_key_is_made_only_on_an_l1_miss() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tiered(Some(disk(tmp.path())));
    let keys_made = AtomicUsize::new(0);
    for _ in 0..3 {
        let lease = cache
            .find_or_build(
                b"lazy".as_slice(),
                None,
                || {
                    keys_made.fetch_add(1, Ordering::SeqCst);
                    Ok(l2_key("lazy"))
                },
                load,
                || Ok(("value".to_string(), 1)),
                serialize,
            )
            .unwrap();
        assert_eq!(lease.value(), "value");
    }
    assert_eq!(keys_made.load(Ordering::SeqCst), 1, "hits must not hash");
    assert_eq!(cache.memory().stats().hits, 2);
    cache.flush();
    let s = cache.stats();
    assert_eq!((s.disk_absent, s.builds, s.write_backs), (1, 1, 1));

    // Without a disk the key is never needed.
    let memory_only = tiered(None);
    memory_only
        .find_or_build(
            b"lazy".as_slice(),
            None,
            || panic!("no disk, no L2 key"),
            load,
            || Ok(("value".to_string(), 1)),
            serialize,
        )
        .unwrap();
}

#[test]
fn a_key_that_cannot_be_made_leaves_the_lookup_without_the_disk() {
    let (_tmp, d, cache) = tiered_on_temp_disk();
    let lease = cache
        .find_or_build(
            b"nokey".as_slice(),
            None,
            || Err(Error::InvalidArgument("no identity".into())),
            |_| panic!("nothing to load without a key"),
            || Ok(("value".to_string(), 1)),
            serialize,
        )
        .unwrap();
    assert_eq!(lease.value(), "value");
    let s = cache.stats();
    assert_eq!(
        (s.disk_errors, s.disk_misses, s.builds, s.write_backs),
        (1, 1, 1, 0)
    );
    assert_eq!(d.stats().puts, 0);
}
