//! A forked child uses, flushes and drops the caches it inherited: after a miss of the parent's,
//! while the parent's writer is in a remote write that stalls, while the parent's opening scan
//! of a large directory runs, while a parent thread builds the key the child looks up, and while
//! other threads hammer the cache. Each child runs under a watchdog, so that a hang fails the
//! test instead of the suite.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use kcache::memory::{MemoryCache, Options};
use kcache::remote::RemoteConfig;
use kcache_testkit::redis::RedisServer;
use kcache_testkit::strings::{Cache, disk, disk_with_remote, l2_key, lookup, tiered};

/// How long a child may take before it counts as hung.
const WATCHDOG: Duration = Duration::from_secs(60);

/// Exit status of a child killed by the watchdog.
const HUNG: i32 = -1;

/// One forking test at a time: a child inherits whatever the other tests' threads are doing at
/// the fork, and each test checks only what its own threads do.
static FORKING: Mutex<()> = Mutex::new(());

/// Runs `child` in a forked child and returns its exit status (1 when it panicked), or
/// [`HUNG`] when it was still running after [`WATCHDOG`] and was killed.
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    in_child_within(WATCHDOG, child)
}

/// [`in_child`] with its own watchdog.
fn in_child_within(watchdog: Duration, child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs `child` (kcache calls on caches it inherited: what is tested) and
    // then `_exit`s without returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(1);
        // SAFETY: ends the child at once, without the harness's exit path.
        unsafe { libc::_exit(code) };
    }
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits for the child forked above without blocking; `status` is valid.
        let waited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(waited >= 0, "waitpid failed");
        if waited == pid {
            assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
            return libc::WEXITSTATUS(status);
        }
        if started.elapsed() > watchdog {
            // SAFETY: kills and reaps the child forked above.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return HUNG;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Looks `source` up in `cache` and flushes; 0 when its entry is then on disk, 2 when not.
fn miss_and_flush(cache: &Cache, source: &str) -> i32 {
    let builds = AtomicUsize::new(0);
    lookup(cache, source, &builds).unwrap();
    cache.flush();
    let disk = cache.disk().unwrap();
    if disk.entry_path(&l2_key(source)).exists() {
        0
    } else {
        2
    }
}

#[test]
fn a_child_flushes_after_its_parent_wrote() {
    let _one = FORKING.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let mut cache = Some(tiered(Some(disk(tmp.path()))));
    assert_eq!(miss_and_flush(cache.as_ref().unwrap(), "parent"), 0);
    let child = in_child(|| {
        // The child drops its copy (the last reference to the disk tier), which flushes.
        let cache = cache.take().unwrap();
        let code = miss_and_flush(&cache, "child");
        drop(cache);
        code
    });
    assert_eq!(child, 0, "the child's miss, flush and drop (-1: hung)");
    let cache = cache.unwrap();
    assert!(cache.disk().unwrap().entry_path(&l2_key("child")).exists());
    assert_eq!(
        miss_and_flush(&cache, "parent after"),
        0,
        "the parent goes on"
    );
}

#[test]
fn a_child_flushes_while_the_parents_writer_is_in_a_stalled_remote_write() {
    let _one = FORKING.lock().unwrap_or_else(|e| e.into_inner());
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let remote = RemoteConfig {
        timeout: Some(Duration::from_secs(2)),
        // Every operation waits its timeout out: the write too, not skipped.
        breaker_threshold: Some(100),
        ..RemoteConfig::at(server.url())
    };
    let cache = tiered(Some(disk_with_remote(tmp.path(), Some(&[7; 32]), remote)));
    // A stopped server accepts connections and answers nothing: the lookup's remote read
    // waits its timeout out, then the writer's remote write does.
    server.pause(true);
    let builds = AtomicUsize::new(0);
    lookup(&cache, "parent", &builds).unwrap();
    let disk = cache.disk().unwrap();
    assert!(disk.remote_stats().is_some(), "a remote tier");
    let deadline = Instant::now() + Duration::from_secs(1);
    while !disk.entry_path(&l2_key("parent")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // On disk and still pending: the writer is in the remote write.
    assert!(disk.entry_path(&l2_key("parent")).exists());
    assert_eq!(disk.stats().pending_writes, 1, "the writer is busy");
    let child = in_child(|| miss_and_flush(&cache, "child"));
    assert_eq!(child, 0, "the child's miss and flush (-1: hung)");
    server.pause(false);
    cache.flush();
    assert_eq!(disk.stats().pending_writes, 0);
    assert_eq!(
        miss_and_flush(&cache, "parent after"),
        0,
        "the parent goes on"
    );
}

/// Fills `dir` with `count` empty files named as entries, for the opening scan to list.
fn fill_with_entries(dir: &Path, count: usize) {
    for i in 0..count {
        let name = format!("{:016x}-{:064x}.kce", 0, i);
        std::fs::File::create(dir.join(name)).unwrap();
    }
}

#[test]
fn a_child_writes_while_the_parents_opening_scan_runs() {
    let _one = FORKING.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    fill_with_entries(tmp.path(), 20_000);
    // The fork has to come while the scan runs; a fast machine may finish it first.
    for _ in 0..20 {
        let cache = tiered(Some(disk(tmp.path())));
        if cache.disk().unwrap().stats().scan_complete {
            continue;
        }
        let child = in_child(|| miss_and_flush(&cache, "child"));
        assert_eq!(child, 0, "the child's write and flush (-1: hung)");
        let disk = cache.disk().unwrap();
        disk.wait_scan();
        assert_eq!(
            miss_and_flush(&cache, "parent after"),
            0,
            "the parent goes on"
        );
        assert!(disk.stats().entries >= 20_000);
        return;
    }
    panic!("the scan of 20,000 entries always finished before the fork");
}

#[test]
fn a_child_builds_a_key_that_a_parent_thread_was_building_at_the_fork() {
    let _one = FORKING.lock().unwrap_or_else(|e| e.into_inner());
    let cache: Arc<MemoryCache<String, u32>> =
        Arc::new(MemoryCache::new(Options::default(), |_| Ok(())));
    let (started, building) = mpsc::channel();
    let (finish, release) = mpsc::channel::<()>();
    let builder = std::thread::spawn({
        let cache = Arc::clone(&cache);
        move || {
            let lease = cache.find_or_build("held", None, || {
                started.send(()).unwrap();
                release.recv().unwrap();
                Ok((1, 1))
            });
            *lease.unwrap()
        }
    });
    building.recv().unwrap();
    // The builder thread is not in the child: the child's lookup builds the key itself.
    let child = in_child(|| {
        let lease = cache.find_or_build("held", None, || Ok((2, 1))).unwrap();
        i32::try_from(*lease).unwrap() + 10 * i32::try_from(cache.stats().builds).unwrap()
    });
    assert_eq!(child, 12, "the child's own build, counted once (-1: hung)");
    finish.send(()).unwrap();
    assert_eq!(builder.join().unwrap(), 1, "the parent's build goes on");
    assert_eq!(
        *cache.find_or_build("held", None, || Ok((3, 1))).unwrap(),
        1
    );
    assert_eq!(cache.stats().builds, 1);
}

/// Forks again and again while four threads hammer one tiered cache: hits, misses written to
/// disk, loads back from disk after a clear of the memory tier, flushes. Each child looks up
/// (a hit and a miss), flushes and clears its copy, and exits. A lock that a hammering thread
/// held at the fork, had the child inherited it taken, would hang the child: the watchdog
/// kills it and the test fails.
#[test]
fn children_forked_while_threads_hammer_the_cache_never_hang() {
    const FORKS: usize = 100;
    let _one = FORKING.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let cache = Arc::new(tiered(Some(disk(tmp.path()))));
    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..4)
        .map(|thread| {
            let (cache, stop) = (Arc::clone(&cache), Arc::clone(&stop));
            std::thread::spawn(move || {
                let builds = AtomicUsize::new(0);
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    lookup(&cache, "hot", &builds).unwrap();
                    lookup(&cache, &format!("t{thread}-{}", rounds % 64), &builds).unwrap();
                    if rounds % 16 == 15 {
                        cache.memory().clear().unwrap();
                        cache.flush();
                    }
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for fork in 0..FORKS {
        let outcome = in_child_within(Duration::from_secs(20), || {
            let builds = AtomicUsize::new(0);
            lookup(&cache, "hot", &builds).unwrap();
            lookup(&cache, &format!("child-{fork}"), &builds).unwrap();
            cache.flush();
            cache.memory().clear().unwrap();
            let on_disk = cache
                .disk()
                .unwrap()
                .entry_path(&l2_key(&format!("child-{fork}")));
            if on_disk.exists() { 0 } else { 2 }
        });
        outcomes.push(outcome);
        if outcome == HUNG {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = hammers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(rounds > 0);
    let hung = outcomes.iter().filter(|&&o| o == HUNG).count();
    assert_eq!(hung, 0, "{hung} hung child after {} forks", outcomes.len());
    assert_eq!(
        outcomes,
        vec![0; FORKS],
        "every child's lookups, flush and clear"
    );
}
