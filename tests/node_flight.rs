//! One build per node, with real processes: N processes that miss the same kernel at once on one
//! cache directory compile it once and the others load it from disk; on PoCL, an entry held
//! back is written for a process that waits, and the leader's flush rewrites it with the code
//! its launch compiled; a leader killed in the middle is taken over by one waiter; a leader
//! that hangs costs the others their lock timeout and no more; a leader whose build fails sends
//! every waiter to build (and fail) itself; an untrusted or disabled directory gets no lock
//! file. Every assertion is on counts and sizes, not times.
//!
//! Each process is this test binary run again with a [`Job`] (see [`node_worker`]): it
//! opens the cache, does one lookup, runs the kernel, checks its output and prints one line of
//! counters. OpenCL runs on the machine's driver (PoCL); CUDA runs on the test kit's stand-in
//! driver, because no CUDA driver runs here.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kcache::Error;
use kcache::backend::cuda::{CudaCache, CudaOptions};
use kcache::backend::opencl::{OpenClCache, OpenClOptions, Program};
use kcache::disk::DiskStats;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::cuda::{FakeDriver, PrimaryContext, Saxpy};
use kcache_testkit::opencl::{Context, KernelArg, run_kernel_in_groups};
use kcache_testkit::workers::{Worker, flock_takers, sleeps, worker_command, worker_job};
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

/// Work items of the OpenCL kernel, and the factor it scales by.
const ITEMS: usize = 64;
const FACTOR: f32 = 2.0;
/// The work-group size of the launches: an explicit one, for which PoCL compiles work-group
/// code at the first launch (a launch that leaves it to the driver uses the generic code that
/// the binary holds anyway).
const GROUP: usize = 16;
/// Rounds of integer mixing in the `ok` and `heavy` kernels. A build on an empty PoCL cache
/// takes seconds already; the heavy kernel's rounds add a little, for a leader that holds the
/// lock long enough to be caught holding it even on a fast machine.
const LIGHT_ROUNDS: u32 = 4;
const HEAVY_ROUNDS: u32 = 100;

/// `y[i] = FACTOR * y[i] + (scramble(i) & 255)`, where `scramble` is `rounds` rounds of xor-shift and
/// multiply that no compiler folds away. Integers and exact floats, so the host can check
/// every output bit for bit.
fn kernel_source(rounds: u32, broken: bool) -> String {
    let mut source = String::from(
        "__kernel void scramble(__global float *y, float a) {\n  uint i = get_global_id(0);\n  uint v = i;\n",
    );
    for k in 0..rounds {
        source.push_str(&format!("  v ^= v >> 7; v *= 0x9E3779B1u; v += {k}u;\n"));
    }
    source.push_str("  y[i] = a * y[i] + (float)(v & 255u);\n}\n");
    if broken {
        source.push_str("this is not OpenCL C\n");
    }
    source
}

fn expected(i: u32, rounds: u32, y: f32) -> f32 {
    let mut v = i;
    for k in 0..rounds {
        v ^= v >> 7;
        v = v.wrapping_mul(0x9E37_79B1).wrapping_add(k);
    }
    FACTOR * y + (v & 255) as f32
}

/// Runs inside a worker process only; a no-op in the normal test run.
#[test]
fn node_worker() {
    let Some(job) = worker_job::<Job>() else {
        return;
    };
    let dir = job.dir;
    let config = match job.timeout.as_str() {
        "env" => PersistenceConfig::from_env(),
        seconds => {
            let timeout = Duration::from_secs_f64(seconds.parse().unwrap());
            // The tests stop a leader (SIGSTOP) only to catch it holding the lock: a liveness
            // window as long as the lock timeout keeps its followers from taking it over.
            PersistenceConfig {
                lock_timeout: Some(timeout),
                lock_liveness: Some(timeout),
                ..PersistenceConfig::in_dir(&dir)
            }
        }
    };
    let (disk, disk_state) = match Persistence::open(config) {
        Ok(disk) => (Some(Arc::new(disk)), "on"),
        Err(Error::Unavailable(_)) => (None, "unavailable"),
        Err(Error::Untrusted(_)) => (None, "untrusted"),
        Err(e) => panic!("opening the cache: {e}"),
    };
    let (go, hold) = (job.go.as_deref(), job.hold.as_deref());
    let line = match job.backend.as_str() {
        "opencl" => opencl_lookup(disk, &job.variant, go, hold),
        "cuda" => cuda_lookup(disk, go),
        other => panic!("unknown backend {other}"),
    };
    println!("{line} disk={disk_state}");
    std::process::exit(0);
}

/// Says it is ready, then waits for `go` to exist.
fn ready_then_wait(go: Option<&Path>) {
    say_then_wait("ready", go);
}

/// Prints `line`, then waits for `file` to exist (polling every millisecond).
fn say_then_wait(line: &str, file: Option<&Path>) {
    println!("{line}");
    if let Some(file) = file {
        while !file.exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn report(
    builds: u64,
    attempts: u64,
    loads: u64,
    disk: &DiskStats,
    correct: bool,
    error: &str,
) -> String {
    format!(
        "builds={builds} attempts={attempts} loads={loads} waits={} timeouts={} takeovers={} \
         correct={} error={error}",
        disk.lock_waits,
        disk.lock_timeouts,
        disk.lock_takeovers,
        u8::from(correct),
    )
}

fn opencl_lookup(
    disk: Option<Arc<Persistence>>,
    variant: &str,
    go: Option<&Path>,
    hold: Option<&Path>,
) -> String {
    // A worker process: its test checked that there is a device.
    let context = Context::first_device().unwrap();
    let cache = OpenClCache::new(OpenClOptions {
        persistence: disk.clone(),
        ..OpenClOptions::default()
    })
    .unwrap();
    let rounds = if variant == "heavy" {
        HEAVY_ROUNDS
    } else {
        LIGHT_ROUNDS
    };
    let source = kernel_source(rounds, variant == "broken");
    ready_then_wait(go);
    let found = cache.find_or_build(context.context(), context.device(), &[&source], "");
    let (correct, error) = match found {
        Ok(program) => (launch(&context, program.value(), rounds), ""),
        Err(Error::Build(_)) => (false, "build"),
        Err(e) => panic!("lookup: {e}"),
    };
    if hold.is_some() {
        say_then_wait("launched", hold);
    }
    cache.flush();
    let stats = cache.stats();
    // `disk_misses` counts every call to the build, including the failed ones that
    // `source_builds` leaves out.
    let line = report(
        stats.source_builds,
        stats.disk_misses,
        stats.binary_loads,
        &stats.disk,
        correct,
        error,
    );
    // The same compiles as metrics and the directory's figures (`kcache stats`) count them.
    let metric = "kcache_builds_total{backend=\"opencl\",result=\"ok\"} ";
    let metrics = kcache::metrics::render();
    let metric_builds = metrics
        .lines()
        .find_map(|l| l.strip_prefix(metric))
        .unwrap_or_else(|| panic!("no {metric} in {metrics}"));
    let directory_builds = disk.map_or(0, |d| d.directory_stats().unwrap().counters.builds);
    format!("{line} metric_builds={metric_builds} directory_builds={directory_builds}")
}

/// Runs the kernel of `program` (built with `rounds`) in work-groups of [`GROUP`]; whether
/// every output is right.
fn launch(context: &Context, program: &Program, rounds: u32) -> bool {
    let mut y: Vec<f32> = (0..ITEMS).map(|i| i as f32).collect();
    let mut args = [KernelArg::Floats(&mut y), KernelArg::Float(FACTOR)];
    run_kernel_in_groups(context, program, "scramble", &mut args, ITEMS, Some(GROUP)).unwrap();
    (0..ITEMS as u32).all(|i| y[i as usize] == expected(i, rounds, i as f32))
}

fn cuda_lookup(disk: Option<Arc<Persistence>>, go: Option<&Path>) -> String {
    let fake = FakeDriver::new();
    let driver = fake.driver();
    let _context = PrimaryContext::bind(&driver, driver.device(0).unwrap()).unwrap();
    let cache = CudaCache::new(CudaOptions {
        persistence: disk,
        driver: Some(driver),
        ..CudaOptions::default()
    })
    .unwrap();
    ready_then_wait(go);
    let saxpy = Saxpy::cached(&cache, false).unwrap();
    let x: Vec<f32> = (0..ITEMS).map(|i| i as f32).collect();
    let y = vec![1.0; ITEMS];
    let out = saxpy.run(FACTOR, &x, &y).unwrap();
    let correct = (0..ITEMS).all(|i| out[i] == FACTOR * x[i] + y[i]);
    cache.flush();
    let stats = cache.stats();
    report(
        stats.links,
        stats.disk_misses,
        stats.cubin_loads,
        &stats.disk,
        correct,
        "",
    )
}

/// What a worker printed: counter name → value.
type Report = HashMap<String, String>;

/// What a worker does, and how to start workers that do it.
#[derive(Serialize, Deserialize)]
struct Job<'a> {
    /// `opencl` or `cuda`.
    backend: String,
    /// The cache directory.
    dir: PathBuf,
    /// `ok`, `heavy` (slow to compile) or `broken` (a syntax error).
    variant: String,
    /// The lock timeout in seconds, or `env` to open the cache with
    /// `PersistenceConfig::from_env`.
    timeout: String,
    /// A file to wait for before the lookup, so that several workers look up at the same
    /// moment.
    go: Option<PathBuf>,
    /// A file to wait for after the launch and before the flush (OpenCL), so that the test
    /// can look at what a process that keeps its cache has written.
    hold: Option<PathBuf>,
    /// More of the worker's environment.
    #[serde(skip)]
    env: &'a [(&'a str, &'a OsStr)],
}

impl<'a> Job<'a> {
    /// Workers with a lock timeout of a minute, no go file and nothing more in their
    /// environment.
    fn new(backend: &str, dir: &Path, variant: &str) -> Self {
        Job {
            backend: backend.into(),
            dir: dir.into(),
            variant: variant.into(),
            timeout: "60".into(),
            go: None,
            hold: None,
            env: &[],
        }
    }

    fn spawn(&self) -> Worker {
        // Test names are module paths without the crate's name: at the top of an integration
        // test, just the function's name.
        let mut cmd = worker_command("node_worker", self);
        for name in [
            "KCACHE_DIR",
            "KCACHE_DISABLE",
            "KCACHE_KEY_FILE",
            "KCACHE_REQUIRE_KEY",
            "KCACHE_MAX_SIZE",
            "KCACHE_LOCK_TIMEOUT",
        ] {
            cmd.env_remove(name);
        }
        let logs = self.dir.parent().unwrap();
        // As users run: PoCL's own settings, one home shared by every worker of a test (PoCL
        // keeps its directories under `$XDG_CACHE_HOME/pocl`), no private PoCL directory.
        cmd.env_remove("POCL_CACHE_DIR")
            .env_remove("POCL_KERNEL_CACHE")
            .env("XDG_CACHE_HOME", logs.join("home-cache"));
        for (name, value) in self.env {
            cmd.env(name, value);
        }
        Worker::spawn(cmd, logs)
    }

    /// `n` workers, each set up and waiting for the go file.
    fn spawn_ready(&self, n: usize) -> Vec<Worker> {
        let mut workers: Vec<Worker> = (0..n).map(|_| self.spawn()).collect();
        for w in &mut workers {
            w.wait_ready();
        }
        workers
    }

    /// The reports of `n` workers that were all set up before the go file was created.
    fn at_once(&self, n: usize) -> Vec<Report> {
        let workers = self.spawn_ready(n);
        std::fs::write(self.go.as_ref().expect("a go file"), b"").unwrap();
        finish_all(workers)
    }
}

trait NodeWorker {
    /// Reads the worker's output up to its `ready`.
    fn wait_ready(&mut self);
    /// The worker's report, as key → value; fails if it does not exit within two minutes.
    fn finish(self) -> Report;
}

impl NodeWorker for Worker {
    fn wait_ready(&mut self) {
        self.wait_for("ready");
    }

    fn finish(self) -> Report {
        let (out, _) = self.finish_output(Duration::from_secs(120));
        let line = out
            .lines()
            .find(|l| l.starts_with("builds="))
            .unwrap_or_else(|| panic!("no report in: {out}"));
        line.split(' ')
            .filter_map(|field| field.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

/// The sum of the counter `name` over `reports`.
fn sum(reports: &[Report], name: &str) -> u64 {
    reports
        .iter()
        .map(|r| r[name].parse::<u64>().unwrap())
        .sum()
}

/// Asserts the sum of each named counter over all reports.
fn assert_sums(reports: &[Report], expected: &[(&str, u64)]) {
    for &(name, want) in expected {
        assert_eq!(sum(reports, name), want, "{name}: {reports:?}");
    }
}

fn all_correct(reports: &[Report]) -> bool {
    reports
        .iter()
        .all(|r| r["correct"] == "1" && r["error"].is_empty())
}

fn finish_all(workers: Vec<Worker>) -> Vec<Report> {
    workers.into_iter().map(Worker::finish).collect()
}

/// The cache directory `cache` (created by the first worker) in a fresh temporary directory,
/// which also holds the go file and the workers' stderr.
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let go = tmp.path().join("go");
    (tmp, dir, go)
}

/// Six workers of `backend` on `variant` with the default settings, started at one moment on a
/// fresh cache directory: the directory (and what holds it) and their reports.
fn six_together(backend: &str, variant: &str) -> (tempfile::TempDir, PathBuf, Vec<Report>) {
    let (tmp, dir, go) = setup();
    let reports = Job {
        go: Some(go),
        ..Job::new(backend, &dir, variant)
    }
    .at_once(6);
    (tmp, dir, reports)
}

fn names_in(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn lock_files(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.starts_with('.') && n.ends_with(".lock"))
        .collect()
}

/// Entries are the directory's files whose names do not start with a dot.
fn entry_files(dir: &Path) -> Vec<PathBuf> {
    names_in(dir)
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .map(|n| dir.join(n))
        .collect()
}

fn has_entry(dir: &Path) -> bool {
    !entry_files(dir).is_empty()
}

/// Whether process `pid` holds an `flock` on `path`, as `/proc/locks` says.
fn holds_flock(pid: Pid, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .is_ok_and(|m| flock_takers(m.ino()).contains(&pid.as_raw_nonzero().to_string()))
}

/// Whether process `pid` has `path` open.
fn has_open(pid: Pid, path: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", pid.as_raw_nonzero())) else {
        return false;
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .any(|target| target == path)
}

/// A leader stopped (SIGSTOP) while it holds the lock of the heavy kernel's entry, before
/// writing it, in `dir`; and the lock file's path. A leader that finished before it could be
/// caught, or was stopped after publishing, is discarded and the attempt made again in a
/// fresh directory (the kernel cannot be made slow enough to be sure on a loaded machine).
fn stopped_leader() -> (tempfile::TempDir, PathBuf, Worker, PathBuf) {
    for _ in 0..5 {
        let (tmp, dir, _) = setup();
        let mut leader = Job::new("opencl", &dir, "heavy").spawn();
        leader.wait_ready();
        let caught = loop {
            if leader.child.try_wait().unwrap().is_some() {
                break None;
            }
            let lock = lock_files(&dir).pop().map(|name| dir.join(name));
            if let Some(lock) = lock.filter(|lock| holds_flock(leader.pid(), lock)) {
                leader.signal(Signal::STOP);
                break Some(lock);
            }
            std::hint::spin_loop();
        };
        match caught {
            Some(lock) if holds_flock(leader.pid(), &lock) && !has_entry(&dir) => {
                return (tmp, dir, leader, lock);
            }
            Some(_) => leader.kill(),
            None => drop(leader.finish()),
        }
    }
    panic!("the leader finished its build five times before it could be stopped");
}

/// Six processes miss one kernel at the same moment: one compiles it, five load its binary.
#[test]
fn six_processes_at_once_compile_once() {
    // Its workers need an OpenCL device.
    let Some(_) = Context::for_test() else {
        return;
    };
    six_at_once(&[]);
}

/// The same with PoCL's own kernel cache off: PoCL then unpacks a loaded binary into a
/// directory named in the binary, and removes it when the program is released. Five processes
/// loading one binary at once must not share that directory.
#[test]
fn six_processes_at_once_compile_once_with_pocls_cache_off() {
    // Its workers need an OpenCL device.
    let Some(_) = Context::for_test() else {
        return;
    };
    six_at_once(&[("POCL_KERNEL_CACHE", OsStr::new("0"))]);
}

/// Six processes (with `env`) miss one kernel at the same moment: one compiles it, five load
/// its binary, all six launch it and get the right output. The leader's binary is held back
/// (PoCL), and the five wait for it: a sibling is built for them, and counted, as a second
/// compile.
fn six_at_once(env: &[(&str, &OsStr)]) {
    let (_tmp, dir, go) = setup();
    let reports = Job {
        go: Some(go),
        env,
        ..Job::new("opencl", &dir, "ok")
    }
    .at_once(6);
    assert!(all_correct(&reports), "{reports:?}");
    assert_sums(
        &reports,
        &[
            ("builds", 2),
            ("metric_builds", 2),
            ("loads", 5),
            ("timeouts", 0),
            ("takeovers", 0),
        ],
    );
    assert_eq!(lock_files(&dir), Vec::<String>::new());
}

/// On PoCL (the driver of these tests) a process that built a program holds its binary back
/// until its cache is flushed, so that the entry carries what its launches compiled; a process
/// that waits for the entry meanwhile makes the first one write it at once.
#[test]
fn a_waiting_process_gets_a_held_back_entry_before_the_leader_flushes() {
    // Its workers need an OpenCL device.
    let Some(_) = Context::for_test() else {
        return;
    };
    let (written_for_the_follower, flushed) = served_then_flushed(&[]);
    assert!(
        flushed >= written_for_the_follower,
        "the flush replaced the entry ({written_for_the_follower} bytes) with a smaller one \
         ({flushed} bytes)"
    );
}

/// The entry written for a waiting process is a sibling program's binary, never launched: with
/// PoCL's own kernel cache off it lacks the code the leader's launch compiled, and the leader's
/// flush replaces it with its own program's binary, which holds that code.
#[test]
fn the_flush_stores_the_launches_code_that_a_waiters_entry_lacks() {
    // Its workers need an OpenCL device.
    let Some(_) = Context::for_test() else {
        return;
    };
    let off = [("POCL_KERNEL_CACHE", OsStr::new("0"))];
    let (written_for_the_follower, flushed) = served_then_flushed(&off);
    assert!(
        flushed > written_for_the_follower,
        "the flush left the entry written for the follower ({written_for_the_follower} bytes; \
         now {flushed} bytes)"
    );
}

/// Why the entry for a waiting process is a second compile (a sibling) and not the leader's
/// program packed at once and loaded again from those bytes for its caller, which would save
/// that compile: PoCL packs a program loaded from a binary as the bytes it was loaded from,
/// whatever its launches compiled since, so the entry rewritten at the flush would never carry
/// the launches' code. A program built from source and launched the same way packs that code.
#[test]
fn a_program_loaded_from_a_binary_packs_without_its_launches_code() {
    let (tmp, dir, _go) = setup();
    let Some(context) = Context::for_test() else {
        return;
    };
    // A program of this run's own: with PoCL's cache on, programs of one preprocessed source
    // share PoCL's directory, and launches of other runs or tests would already have put their
    // code there.
    let nanos = std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    let source = format!(
        "{}__constant uint run_{}_{nanos} = 0;\n",
        kernel_source(LIGHT_ROUNDS, false),
        std::process::id()
    );
    let open = |dir: &Path| {
        let disk = Persistence::open(PersistenceConfig::in_dir(dir)).unwrap();
        OpenClCache::new(OpenClOptions {
            persistence: Some(Arc::new(disk)),
            ..OpenClOptions::default()
        })
        .unwrap()
    };
    let find = |cache: &OpenClCache| {
        cache
            .find_or_build(context.context(), context.device(), &[&source], "")
            .unwrap()
    };

    // Packed before any launch, as the leader's program would be for processes that wait.
    let leader = open(&dir);
    let built = find(&leader);
    leader.flush();
    let early = built.value().binary().unwrap().len();

    let loader = open(&dir);
    let loaded = find(&loader);
    let stats = loader.stats();
    assert_eq!((stats.source_builds, stats.binary_loads), (0, 1));
    assert!(launch(&context, loaded.value(), LIGHT_ROUNDS));
    let loaded_after_launch = loaded.value().binary().unwrap().len();

    let elsewhere = open(&tmp.path().join("elsewhere"));
    let compiled = find(&elsewhere);
    assert_eq!(elsewhere.stats().source_builds, 1);
    assert!(launch(&context, compiled.value(), LIGHT_ROUNDS));
    elsewhere.flush();
    let compiled_after_launch = compiled.value().binary().unwrap().len();

    assert_eq!(
        loaded_after_launch, early,
        "the loaded program's binary changed after its launch"
    );
    assert!(
        compiled_after_launch > early,
        "the launch compiled nothing a binary holds ({compiled_after_launch} against {early} \
         bytes)"
    );
}

/// A leader (with `env`) that has built and launched but not flushed, then a follower that
/// loads without compiling, then the leader's flush: the entry's size as the follower found it,
/// and after the flush.
fn served_then_flushed(env: &[(&str, &OsStr)]) -> (u64, u64) {
    let (tmp, dir, _go) = setup();
    let hold = tmp.path().join("hold");
    let mut leader = Job {
        hold: Some(hold.clone()),
        env,
        ..Job::new("opencl", &dir, "ok")
    }
    .spawn();
    leader.wait_for("launched");
    // Built and launched, not written: the leader still holds the entry's lock.
    assert!(!has_entry(&dir), "{:?}", names_in(&dir));
    let lock = dir.join(lock_files(&dir).pop().expect("the leader's lock file"));
    assert!(holds_flock(leader.pid(), &lock));

    let follower = Job::new("opencl", &dir, "ok").spawn().finish();
    assert!(all_correct(std::slice::from_ref(&follower)), "{follower:?}");
    assert_sums(
        std::slice::from_ref(&follower),
        &[("builds", 0), ("loads", 1), ("waits", 1), ("timeouts", 0)],
    );
    let entry = entry_files(&dir)
        .pop()
        .expect("the entry the follower loaded");
    let written_for_the_follower = std::fs::metadata(&entry).unwrap().len();
    assert_eq!(lock_files(&dir), Vec::<String>::new());

    std::fs::write(&hold, b"").unwrap();
    let leader = leader.finish();
    // Its program, and a sibling built for the follower's entry: two compiles, counted as two
    // in its statistics, its metrics and the directory's figures (the follower compiled none).
    assert_sums(
        std::slice::from_ref(&leader),
        &[
            ("builds", 2),
            ("metric_builds", 2),
            ("directory_builds", 2),
            ("waits", 0),
        ],
    );
    let flushed = std::fs::metadata(&entry).unwrap().len();
    assert_eq!(lock_files(&dir), Vec::<String>::new());
    (written_for_the_follower, flushed)
}

/// The leader is killed while five processes wait for it: one of them takes over and builds,
/// the other four load what it wrote.
#[test]
fn a_killed_leader_is_taken_over_by_one_waiter() {
    // Its workers need an OpenCL device.
    let Some(_) = Context::for_test() else {
        return;
    };
    let (_tmp, dir, leader, lock) = stopped_leader();
    let followers = Job::new("opencl", &dir, "heavy").spawn_ready(5);
    // A follower is waiting once it has the lock file open and sleeps between two attempts at
    // the lock: killing the leader any earlier could let it lock at the first attempt, as if
    // it had never waited.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !followers
        .iter()
        .all(|f| has_open(f.pid(), &lock) && sleeps(f.pid()))
    {
        assert!(
            Instant::now() < deadline,
            "the followers never waited on the lock"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    leader.kill();
    let reports = finish_all(followers);
    assert!(all_correct(&reports), "{reports:?}");
    assert_sums(
        &reports,
        &[
            // The program and the sibling built for the four that waited on the new leader.
            ("builds", 2),
            ("loads", 4),
            ("takeovers", 1),
            ("waits", 5),
            ("timeouts", 0),
        ],
    );
    assert_eq!(lock_files(&dir), Vec::<String>::new());
}

/// The leader hangs (stopped) holding the lock; followers with a 50 ms lock timeout each give
/// up waiting and build themselves.
#[test]
fn a_hung_leader_costs_the_lock_timeout_then_each_builds() {
    // Its workers need an OpenCL device.
    let Some(_) = Context::for_test() else {
        return;
    };
    let (tmp, dir, leader, _lock) = stopped_leader();
    let go = tmp.path().join("go");
    let reports = Job {
        timeout: "0.05".into(),
        go: Some(go),
        ..Job::new("opencl", &dir, "heavy")
    }
    .at_once(5);
    leader.kill();
    assert!(all_correct(&reports), "{reports:?}");
    assert_sums(
        &reports,
        &[("timeouts", 5), ("builds", 5), ("takeovers", 0)],
    );
}

/// The build fails: nobody hangs and nobody succeeds; each process builds itself and gets its
/// own build error (the documented behaviour: an error is not cached across processes).
#[test]
fn a_failing_build_sends_every_process_to_its_own_error() {
    // Its workers need an OpenCL device.
    let Some(_) = Context::for_test() else {
        return;
    };
    let (_tmp, dir, reports) = six_together("opencl", "broken");
    assert!(reports.iter().all(|r| r["error"] == "build"), "{reports:?}");
    assert_sums(&reports, &[("attempts", 6), ("builds", 0)]);
    // A leader whose build failed is not a dead one: nobody takes over from it.
    assert_sums(&reports, &[("takeovers", 0), ("timeouts", 0)]);
    assert!(!has_entry(&dir));
}

/// An untrusted directory, and a disabled disk tier: the lookup works from memory and nothing
/// at all (no lock file) is created in the directory.
#[test]
fn untrusted_or_disabled_directories_get_no_lock_file() {
    // Its workers need an OpenCL device.
    let Some(_) = Context::for_test() else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, dir, _go) = setup();
    std::fs::create_dir(&dir).unwrap();
    for (mode, disabled, state) in [(0o777, false, "untrusted"), (0o700, true, "unavailable")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut env = vec![("KCACHE_DIR", dir.as_os_str())];
        if disabled {
            env.push(("KCACHE_DISABLE", OsStr::new("1")));
        }
        let report = Job {
            timeout: "env".into(),
            env: &env,
            ..Job::new("opencl", &dir, "ok")
        }
        .spawn()
        .finish();
        assert_eq!(report["disk"], state, "{report:?}");
        assert_eq!(report["correct"], "1", "{report:?}");
        assert_eq!(report["builds"], "1", "{report:?}");
        assert_eq!(names_in(&dir), Vec::<String>::new());
    }
}

/// CUDA on the test kit's stand-in driver (no CUDA driver runs here): six processes at once
/// link once, the other five load the cubin.
#[test]
fn six_cuda_processes_at_once_link_once() {
    let (_tmp, dir, reports) = six_together("cuda", "ok");
    assert!(all_correct(&reports), "{reports:?}");
    assert_sums(&reports, &[("builds", 1), ("loads", 5)]);
    assert_eq!(lock_files(&dir), Vec::<String>::new());
}
