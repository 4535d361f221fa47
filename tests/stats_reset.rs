//! Hit rate and reset on the statistics of the memory tier, the disk tier and the tiered
//! cache: a reset zeroes event counters and keeps gauges, counts made after it show, counts
//! made on other threads before it are reset too, and the directory's counters (which every
//! process adds to) are not touched by it.

use std::sync::Arc;
use std::time::Duration;

use kcache::Persistence;
use kcache::memory::{MemoryCache, Options};
use kcache_testkit::memory::touch;
use kcache_testkit::strings::{disk, find_or_build, l2_key, serialize, tiered};

fn memory() -> MemoryCache<Vec<u8>, u32> {
    MemoryCache::new(Options::default(), |_| Ok(()))
}

#[test]
fn memory_reset_zeroes_events_of_every_thread_and_keeps_gauges() {
    let cache = Arc::new(memory());
    assert_eq!(cache.stats().hit_rate(), None);
    let lease = cache
        .find_or_build(b"k".as_slice(), None, || Ok((1, 10)))
        .unwrap();
    // Hits counted in other threads' tallies.
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                touch(&cache, b"k", 2, 1);
            });
        }
    });
    let before = cache.stats();
    assert_eq!((before.hits, before.misses, before.builds), (3, 1, 1));
    assert_eq!(before.hit_rate(), Some(0.75));

    cache.reset_stats();
    let after = cache.stats();
    assert_eq!((after.hits, after.misses, after.builds), (0, 0, 0));
    assert_eq!(after.hit_rate(), None);
    assert_eq!((after.entries, after.weight, after.leases), (1, 10, 1));

    touch(&cache, b"k", 3, 1);
    touch(&cache, b"j", 4, 1);
    let later = cache.stats();
    assert_eq!((later.hits, later.misses, later.builds), (1, 1, 1));
    assert_eq!(later.hit_rate(), Some(0.5));
    assert_eq!(later.entries, 2);
    drop(lease);
}

#[test]
fn disk_reset_keeps_gauges_and_the_directory_counters() {
    let tmp = tempfile::tempdir().unwrap();
    let d = disk(tmp.path());
    assert_eq!(d.stats().hit_rate(), None);
    d.put(&l2_key("a"), b"A", Duration::ZERO).unwrap();
    assert!(d.get(&l2_key("a")).unwrap().is_some());
    assert!(d.get(&l2_key("b")).unwrap().is_none());
    let s = d.stats();
    assert_eq!((s.puts, s.hits, s.misses), (1, 1, 1));
    assert_eq!(s.hit_rate(), Some(0.5));

    d.reset_stats();
    let s = d.stats();
    assert_eq!((s.puts, s.hits, s.misses, s.bytes_written), (0, 0, 0, 0));
    assert_eq!((s.entries, s.scan_complete), (1, true));

    // The directory's counters still get everything this process did, reset or not.
    d.flush();
    let dir = d.directory_stats().unwrap().counters;
    assert_eq!((dir.disk_writes, dir.disk_hits, dir.disk_misses), (1, 1, 1));
    assert!(d.get(&l2_key("a")).unwrap().is_some());
    assert_eq!(d.stats().hits, 1);
}

#[test]
fn flushes_add_only_what_is_new_to_the_directory_counters() {
    let tmp = tempfile::tempdir().unwrap();
    let d = disk(tmp.path());
    assert_eq!(d.directory_stats().unwrap().shards, 0);
    d.put(&l2_key("a"), b"A", Duration::ZERO).unwrap();
    d.flush();
    d.flush();
    let stats = d.directory_stats().unwrap();
    assert_eq!((stats.counters.disk_writes, stats.shards), (1, 1));
    d.put(&l2_key("b"), b"B", Duration::ZERO).unwrap();
    drop(d);
    // A second handle on the directory, as another process would open it.
    let again = disk(tmp.path());
    assert_eq!(again.directory_stats().unwrap().counters.disk_writes, 2);
    assert!(again.zero_directory_stats().is_empty());
    let zeroed = again.directory_stats().unwrap();
    assert_eq!(zeroed.counters.disk_writes, 0);
    assert!(zeroed.last_zeroed.is_some());
    assert_eq!(zeroed.shards, kcache::disk::SHARDS);
}

#[test]
fn a_shard_that_cannot_be_written_is_skipped_without_error() {
    let tmp = tempfile::tempdir().unwrap();
    // This process's shard name is taken by a directory tree too deep to remove (a shallower
    // one is removed and the shard written in its place): no shard file can be written there.
    let mine = format!(".stats-{:x}", std::process::id() % kcache::disk::SHARDS);
    let mut deep = tmp.path().join(&mine);
    for _ in 0..40 {
        deep.push("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("file"), b"x").unwrap();
    let d = disk(tmp.path());
    d.put(&l2_key("a"), b"A", Duration::ZERO).unwrap();
    d.flush();
    let stats = d.directory_stats().unwrap();
    assert_eq!((stats.shards, stats.shards_ignored), (0, 1));
    assert_eq!(stats.counters.disk_writes, 0);
    assert!(tmp.path().join(&mine).is_dir());
    // The disk tier works on.
    assert!(d.get(&l2_key("a")).unwrap().is_some());
}

#[test]
fn tiered_reset_and_the_memory_figures_it_reports_to_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let d: Arc<Persistence> = disk(tmp.path());
    let cache = tiered(Some(d.clone()));
    let lookup = |source: &str| {
        drop(find_or_build(&cache, source, || Ok((source.to_uppercase(), 1)), serialize).unwrap())
    };
    assert_eq!(cache.stats().hit_rate(), None);
    lookup("a");
    lookup("a");
    cache.flush();
    let s = cache.stats();
    assert_eq!(
        (s.builds, s.disk_misses, s.disk_hits, s.write_backs),
        (1, 1, 0, 1)
    );
    assert_eq!(s.hit_rate(), Some(0.0));

    cache.reset_stats();
    assert_eq!(cache.stats(), Default::default());
    assert_eq!((cache.memory().stats().hits, d.stats().puts), (0, 0));
    assert_eq!(cache.memory().stats().entries, 1);

    let dir = d.directory_stats().unwrap().counters;
    assert_eq!((dir.memory_hits, dir.memory_misses, dir.builds), (1, 1, 1));
    assert_eq!((dir.disk_misses, dir.disk_writes), (1, 1));
    assert_eq!(dir.memory_hit_rate(), Some(0.5));
    assert_eq!(dir.disk_hit_rate(), Some(0.0));

    lookup("a");
    drop(cache);
    drop(d);
    let dir = disk(tmp.path()).directory_stats().unwrap().counters;
    assert_eq!((dir.memory_hits, dir.memory_misses, dir.builds), (2, 1, 1));
}
