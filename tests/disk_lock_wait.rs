//! How long a process waits on another's entry lock, with real processes, real `fork` and
//! real files: a waiter sees the entry as soon as it is written although a child forked by the
//! holder still holds the lock's descriptor; a forked child holds none of its parent's entry
//! locks and leaves them alone when it drops them; a holder stopped with `SIGSTOP` costs a
//! waiter the liveness window, not the lock timeout, and the four entries it holds cost that
//! window once; a holder whose build never ends costs one lock timeout for all its entries; a
//! holder that builds for several liveness windows keeps its waiter. Every assertion is on
//! counts; times are only watchdogs.
//!
//! Each process is this test binary run again with a [`Job`] (see [`lock_worker`]).

use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kcache::BuildError;
use kcache::disk::Durability;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::strings::{Cache, find_or_build, serialize, tiered};
use kcache_testkit::workers::{Worker, flock_takers, sleeps, worker_command, worker_job};
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

/// What a worker does.
#[derive(Serialize, Deserialize)]
struct Job {
    /// `holder`, `fork-holder`, `raw-fork-holder`, `waiter` or `nested-waiter`.
    role: String,
    /// The cache directory.
    dir: PathBuf,
    /// The entries (`k0`, `k1`, ...) the worker looks up.
    keys: Range<usize>,
    /// A holder's builds wait for this file to exist (or this many milliseconds, when it is a
    /// number) before they return.
    release: String,
    /// The worker's lock timeout, in seconds.
    timeout: String,
}

/// How long any worker may run before the test fails rather than hangs.
const WATCHDOG: Duration = Duration::from_secs(60);

/// Runs inside a worker process only; a no-op in the normal test run.
#[test]
fn lock_worker() {
    let Some(job) = worker_job::<Job>() else {
        return;
    };
    // From the environment for the liveness window (KCACHE_LOCK_LIVENESS), the rest explicit.
    let config = PersistenceConfig {
        dir: Some(job.dir.clone()),
        lock_timeout: Some(Duration::from_secs_f64(job.timeout.parse().unwrap())),
        durability: Durability::Relaxed,
        ..PersistenceConfig::from_env()
    };
    let disk = Arc::new(Persistence::open(config).unwrap());
    let cache = tiered(Some(Arc::clone(&disk)));
    let keys = job.keys;
    match job.role.as_str() {
        "nested-waiter" => {
            println!("ready");
            let started = Instant::now();
            // One lookup, whose build looks the keys up.
            let build = || {
                for i in keys.clone() {
                    let key = format!("k{i}");
                    let lease = find_or_build(&cache, &key, || Ok((value(&key), 1)), serialize);
                    assert_eq!(lease.unwrap().value(), &value(&key));
                }
                Ok((value("outer"), 1))
            };
            let lease = find_or_build(&cache, "outer", build, serialize);
            assert_eq!(lease.unwrap().value(), &value("outer"));
            let elapsed = started.elapsed();
            cache.flush();
            report(&cache, &disk, elapsed);
        }
        "waiter" => {
            println!("ready");
            let started = Instant::now();
            for i in keys.clone() {
                let key = format!("k{i}");
                let lease = find_or_build(&cache, &key, || Ok((value(&key), 1)), serialize);
                assert_eq!(lease.unwrap().value(), &value(&key));
            }
            let elapsed = started.elapsed();
            cache.flush();
            report(&cache, &disk, elapsed);
        }
        holder => {
            std::thread::scope(|s| {
                for i in keys.clone() {
                    let (cache, dir, release) = (&cache, &job.dir, &job.release);
                    s.spawn(move || {
                        let key = format!("k{i}");
                        let build = || {
                            println!("holding {key}");
                            match holder {
                                "fork-holder" => fork_child_that_drops_the_lock(dir)?,
                                "raw-fork-holder" => raw_fork_child_that_sleeps(),
                                _ => {}
                            }
                            wait_for_release(release);
                            Ok((value(&key), 1))
                        };
                        let found = find_or_build(cache, &key, build, serialize);
                        if let Some(check) = CHILD.take() {
                            check.report_and_exit(found.is_err());
                        }
                        assert_eq!(found.unwrap().value(), &value(&key));
                    });
                }
            });
            cache.flush();
            report(&cache, &disk, Duration::ZERO);
        }
    }
    std::process::exit(0);
}

fn value(key: &str) -> String {
    format!("built({key})")
}

/// Waits until `release` exists, or for `release` milliseconds when it is a number.
fn wait_for_release(release: &str) {
    if let Ok(ms) = release.parse() {
        return std::thread::sleep(Duration::from_millis(ms));
    }
    while !Path::new(release).exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn report(cache: &Cache, disk: &Persistence, elapsed: Duration) {
    let (t, d) = (cache.stats(), disk.stats());
    println!(
        "builds={} loads={} waits={} timeouts={} takeovers={} elapsed_ms={}",
        t.builds,
        t.disk_hits,
        d.lock_waits,
        d.lock_timeouts,
        d.lock_takeovers,
        elapsed.as_millis()
    );
}

std::thread_local! {
    /// In the child of a `fork-holder`: what it checks once its lookup has returned.
    static CHILD: std::cell::Cell<Option<ChildCheck>> = const { std::cell::Cell::new(None) };
}

/// In a holder's build, which holds the entry's lock: forks (with `fork`, so with the
/// library's fork hooks), waits for the child and says so. The child counts the lock files it
/// has open, opens 16 files (one of them likely gets the number of a descriptor closed at the
/// fork), then fails its copy of the build, so that the lookup it inherited abandons and drops
/// its copy of the parent's lock; [`ChildCheck::report_and_exit`] goes on from there.
fn fork_child_that_drops_the_lock(dir: &Path) -> Result<(), BuildError> {
    let lock = lock_files(dir.to_str().unwrap())
        .pop()
        .expect("the lock file");
    let ino = std::fs::metadata(&lock).unwrap().ino();
    // SAFETY: the child reads /proc, opens files and returns into the lookup (as a program
    // forked by a multi-threaded parent would, which is what is tested), then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid > 0 {
        let mut status = 0;
        // SAFETY: waits for the child forked above; `status` is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child died: {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
        println!("child done");
        return Ok(());
    }
    let lock_fds = open_lock_files();
    let opened = (0..16)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    CHILD.set(Some(ChildCheck {
        lock,
        ino,
        lock_fds,
        opened,
    }));
    Err(BuildError::new(7, "the child's copy of the build"))
}

/// What the forked child of a `fork-holder` checks.
struct ChildCheck {
    /// The parent's lock file, and its inode.
    lock: PathBuf,
    ino: u64,
    /// Lock files the child had open right after the fork.
    lock_fds: usize,
    /// Files the child opened after the fork.
    opened: Vec<std::fs::File>,
}

impl ChildCheck {
    /// Prints what the child saw once its lookup returned (`failed`: with the build's error)
    /// and the parent's lock was dropped in it: the lock files it had open after the fork,
    /// whether the parent's lock file is still there, unmarked, and whether the files it
    /// opened are still open. Then exits.
    fn report_and_exit(self, failed: bool) -> ! {
        use std::os::fd::AsRawFd;
        let lock = std::fs::read(&self.lock)
            .ok()
            .filter(|_| std::fs::metadata(&self.lock).is_ok_and(|m| m.ino() == self.ino));
        let intact = self.opened.iter().all(|file| {
            std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
                .is_ok_and(|target| target == Path::new("/dev/null"))
        });
        println!(
            "child failed={} lock_fds={} linked={} abandoned={} intact={}",
            u8::from(failed),
            self.lock_fds,
            u8::from(lock.is_some()),
            u8::from(lock.is_some_and(|bytes| bytes.first() == Some(&b'F'))),
            u8::from(intact),
        );
        // SAFETY: ends the child without running the parent's exit path twice.
        unsafe { libc::_exit(0) }
    }
}

/// The lock files open in this process, from `/proc/self/fd`.
fn open_lock_files() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains(".lock"))
        .count()
}

/// In a holder's build: a child made by the `clone` system call itself, which runs no fork
/// hook (as some runtimes fork), and so keeps the lock's descriptor, and with it the lock,
/// until it is killed. Prints its pid. The child closes its stdout and stderr, so that the
/// test reading them sees them end when the holder exits.
fn raw_fork_child_that_sleeps() {
    // SAFETY: a raw fork; the child calls only async-signal-safe functions (pause, _exit).
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) };
    assert!(pid >= 0, "clone failed");
    if pid == 0 {
        // SAFETY: async-signal-safe; the child writes nothing.
        unsafe {
            libc::close(1);
            libc::close(2);
        }
        loop {
            // SAFETY: async-signal-safe; the test kills this process.
            unsafe { libc::pause() };
        }
    }
    println!("child {pid}");
}

fn lock_files(dir: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().path())
                .filter(|p| p.to_string_lossy().ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default()
}

/// A worker process, its stdout piped, its stderr in a file.
fn spawn(
    role: &str,
    dir: &Path,
    keys: Range<usize>,
    release: &str,
    timeout: &str,
    liveness: &str,
) -> Worker {
    let job = Job {
        role: role.into(),
        dir: dir.into(),
        keys,
        release: release.into(),
        timeout: timeout.into(),
    };
    let mut cmd = worker_command("lock_worker", &job);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KCACHE_") {
            cmd.env_remove(name);
        }
    }
    // The liveness window, in seconds: the disk tier reads it from the environment.
    cmd.env("KCACHE_LOCK_LIVENESS", liveness);
    Worker::spawn(cmd, dir.parent().unwrap())
}

trait Finish {
    /// The worker's report (counter → value); fails if it does not exit within [`WATCHDOG`].
    fn finish(self) -> Report;
}

impl Finish for Worker {
    fn finish(self) -> Report {
        let (out, stderr) = self.finish_output(WATCHDOG);
        let line = out
            .lines()
            .find_map(|l| l.find("builds=").map(|at| &l[at..]))
            .unwrap_or_else(|| panic!("no report in: {out}"));
        Report {
            counters: line
                .split(' ')
                .filter_map(|field| field.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
                .collect(),
            warnings: stderr
                .lines()
                .filter(|l| l.starts_with("kcache: ") && !l.starts_with("kcache: debug: "))
                .map(str::to_owned)
                .collect(),
        }
    }
}

#[derive(Debug)]
struct Report {
    counters: std::collections::HashMap<String, u64>,
    /// The lines kcache wrote at `warn` (the workers log at the default level).
    warnings: Vec<String>,
}

impl Report {
    fn get(&self, name: &str) -> u64 {
        self.counters[name]
    }

    /// It waited for the holder once and read the holder's entry.
    fn assert_loaded_after_one_wait(&self) {
        self.assert(&[
            ("builds", 0),
            ("loads", 1),
            ("waits", 1),
            ("timeouts", 0),
            ("takeovers", 0),
        ]);
    }

    fn assert(&self, expected: &[(&str, u64)]) {
        for &(name, want) in expected {
            assert_eq!(self.get(name), want, "{name}: {self:?}");
        }
    }
}

/// A fresh temporary directory holding the cache directory `cache` (created by the first
/// worker), the release file's path and the workers' stderr.
fn setup() -> (tempfile::TempDir, PathBuf, String) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let release = tmp.path().join("release").to_string_lossy().into_owned();
    (tmp, dir, release)
}

/// Whether process `pid` has a file open whose name ends with `.lock`, and sleeps: a waiter
/// between two attempts at a lock.
fn waits_on_a_lock(pid: Pid) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", pid.as_raw_nonzero())) else {
        return false;
    };
    let has_lock = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .any(|target| target.to_string_lossy().ends_with(".lock"));
    has_lock && sleeps(pid)
}

/// Waits (up to the watchdog) until `worker` waits on a lock.
fn until_waiting(worker: &Worker) {
    let deadline = Instant::now() + WATCHDOG;
    while !waits_on_a_lock(worker.pid()) {
        assert!(
            Instant::now() < deadline,
            "the waiter never waited on a lock"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A process killed when this is dropped, whatever the test's outcome.
struct Killed(Pid);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, Signal::KILL);
    }
}

/// The holder forks a child (by the raw system call, so no fork hook closes anything) while it
/// holds the entry's lock, then writes the entry and exits; the child keeps the lock's
/// descriptor, and so the lock, until it is killed. The waiter, which waits on that lock, reads
/// the entry anyway, without waiting for its lock timeout.
#[test]
fn a_waiter_reads_the_entry_while_a_forked_child_keeps_the_lock() {
    let (_tmp, dir, release) = setup();
    let mut holder = spawn("raw-fork-holder", &dir, 0..1, &release, "60", "60");
    holder.wait_for("holding k0");
    let lock = lock_files(dir.to_str().unwrap())
        .pop()
        .expect("a lock file");
    let ino = std::fs::metadata(&lock).unwrap().ino();
    // A lock timeout well inside the watchdog, and a liveness window past it: only seeing the
    // entry can end this wait early.
    let mut waiter = spawn("waiter", &dir, 0..1, &release, "20", "60");
    waiter.wait_for("ready");
    until_waiting(&waiter);
    std::fs::write(&release, b"").unwrap();
    let child = Killed(Pid::from_raw(holder.wait_for("child ").parse().unwrap()).unwrap());
    holder.finish().assert(&[("builds", 1)]);
    let waited = waiter.finish();
    // The holder has exited: only the child can keep the lock now.
    assert!(
        !flock_takers(ino).is_empty(),
        "the child no longer held the lock: nothing was tested"
    );
    drop(child);
    waited.assert_loaded_after_one_wait();
}

/// The holder forks (with `fork`) while it holds the entry's lock. The child holds none of the
/// parent's locks (its descriptors were closed at the fork); the lookup it inherited fails in
/// it and drops the parent's lock there, which leaves the parent's lock file linked, unmarked,
/// and the child's own files open. A process that then misses the entry waits for the parent
/// and reads what it wrote.
#[test]
fn a_forked_child_holds_and_drops_none_of_its_parents_locks() {
    let (_tmp, dir, release) = setup();
    let mut holder = spawn("fork-holder", &dir, 0..1, &release, "60", "60");
    holder.wait_for("holding k0");
    let child = holder.wait_for("child ");
    assert_eq!(
        child, "failed=1 lock_fds=0 linked=1 abandoned=0 intact=1",
        "what the forked child saw"
    );
    holder.wait_for("child done");
    let waiter = spawn("waiter", &dir, 0..1, &release, "60", "60");
    until_waiting(&waiter);
    std::fs::write(&release, b"").unwrap();
    holder.finish().assert(&[("builds", 1)]);
    waiter
        .finish()
        .assert(&[("builds", 0), ("loads", 1), ("waits", 1)]);
    assert_eq!(lock_files(dir.to_str().unwrap()), Vec::<PathBuf>::new());
}

/// A holder of `keys` entries, each build waiting for the release file, and stopped
/// (`SIGSTOP`) once it holds all their locks.
fn stopped_holder(dir: &Path, keys: usize, release: &str) -> Worker {
    let mut holder = spawn("holder", dir, 0..keys, release, "60", "60");
    for _ in 0..keys {
        holder.wait_for("holding k");
    }
    holder.signal(Signal::STOP);
    holder
}

/// The report of a waiter (lock timeout `timeout`, liveness window 1 s) for `keys` entries of
/// a [`stopped_holder`].
fn wait_for_a_stopped_holder(keys: usize, timeout: &str) -> Report {
    let (_tmp, dir, release) = setup();
    let _holder = stopped_holder(&dir, keys, &release);
    spawn("waiter", &dir, 0..keys, &release, timeout, "1").finish()
}

/// The waiter built four entries (none loaded) after `timeouts` lock timeouts and `takeovers`
/// takeovers, and said so in one warning, naming `cause`.
fn assert_built_four_with_one_warning(waited: &Report, timeouts: u64, takeovers: u64, cause: &str) {
    waited.assert(&[
        ("builds", 4),
        ("loads", 0),
        ("timeouts", timeouts),
        ("takeovers", takeovers),
    ]);
    assert_eq!(warnings(waited, cause), 1, "{waited:?}");
    assert_eq!(waited.warnings.len(), 1, "{waited:?}");
}

/// The waiter's warnings that name `cause`.
fn warnings(report: &Report, cause: &str) -> usize {
    report.warnings.iter().filter(|w| w.contains(cause)).count()
}

/// A holder stopped with `SIGSTOP` while it builds: its waiter takes the build over once the
/// holder's beat has stood still for the liveness window (1 s), long before its lock timeout
/// (30 s), and says so once, at `warn`.
#[test]
fn a_stopped_holder_costs_the_liveness_window_not_the_timeout() {
    let waited = wait_for_a_stopped_holder(1, "30");
    waited.assert(&[
        ("builds", 1),
        ("loads", 0),
        ("waits", 1),
        ("timeouts", 0),
        ("takeovers", 1),
    ]);
    assert_eq!(warnings(&waited, "no sign of life"), 1, "{waited:?}");
}

/// A stopped holder of four entries: the waiter that needs all four waits the liveness window
/// once (the other three lock files carry the same standing beat) and never its lock timeout
/// (4 s, which four waits would add up to 16 s); one warning for the one holder.
#[test]
fn four_entries_of_a_stopped_holder_cost_one_wait() {
    let waited = wait_for_a_stopped_holder(4, "4");
    assert_built_four_with_one_warning(&waited, 0, 4, "no sign of life");
}

/// A holder of four entries whose builds never end but whose process runs (its beat goes on,
/// as a build hung in a driver): the waiter waits the lock timeout (2 s) for the first entry,
/// then builds the other three without waiting; one warning.
#[test]
fn four_entries_of_a_hung_holder_cost_one_lock_timeout() {
    let (_tmp, dir, release) = setup();
    let mut holder = spawn("holder", &dir, 0..4, &release, "60", "60");
    for _ in 0..4 {
        holder.wait_for("holding k");
    }
    let waited = spawn("waiter", &dir, 0..4, &release, "2", "1").finish();
    assert_built_four_with_one_warning(&waited, 1, 0, "lock timeout");
    std::fs::write(&release, b"").unwrap();
    holder.finish().assert(&[("builds", 4)]);
}

/// A holder that builds for 3.5 s, three and a half liveness windows: its beat goes on, so its
/// waiter waits for it and reads its entry instead of building a second time.
#[test]
fn a_slow_live_holder_keeps_its_waiter() {
    let (_tmp, dir, _release) = setup();
    let mut holder = spawn("holder", &dir, 0..1, "3500", "60", "1");
    holder.wait_for("holding k0");
    let waited = spawn("waiter", &dir, 0..1, "0", "60", "1").finish();
    waited.assert_loaded_after_one_wait();
    assert!(waited.warnings.is_empty(), "{waited:?}");
    holder.finish().assert(&[("builds", 1)]);
}

/// Four entries held by four holders, each stopped (`SIGSTOP`) while it builds, with a
/// liveness window (60 s) longer than the lock timeout (2 s): one lookup whose build needs all
/// four waits the lock timeout once in all, for the first, and builds the other three at once
/// (before, each cost a timeout of its own: four).
#[test]
fn one_lookup_of_four_held_entries_waits_one_lock_timeout_in_all() {
    let (_tmp, dir, release) = setup();
    let _holders: Vec<Worker> = (0..4)
        .map(|i| {
            let mut holder = spawn("holder", &dir, i..i + 1, &release, "60", "60");
            holder.wait_for(&format!("holding k{i}"));
            holder.signal(Signal::STOP);
            holder
        })
        .collect();
    let waited = spawn("nested-waiter", &dir, 0..4, &release, "2", "60").finish();
    println!(
        "one lookup of 4 held entries: {} ms",
        waited.get("elapsed_ms")
    );
    waited.assert(&[("builds", 5), ("timeouts", 1), ("takeovers", 0)]);
    assert_eq!(warnings(&waited, "lock timeout"), 1, "{waited:?}");
}
