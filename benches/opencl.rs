//! What a program costs to get, on the machine's OpenCL implementation (PoCL in CI):
//!
//! - `cold`: `clCreateProgramWithSource` + `clBuildProgram` with PoCL's kernel cache off;
//! - `pocl cache hit`: the same with PoCL's own kernel cache on and warm;
//! - `kcache disk hit`: a new kcache (empty memory) in a new context, the binary on disk;
//! - `kcache remote hit`: the same with an empty disk tier and the binary in the remote tier
//!   (a `redis-server` on loopback), as on a new node;
//! - `kcache memory hit`: a lookup that finds the program in memory.
//!
//! PoCL reads its cache settings once per process, so the first three run in child processes
//! of this binary with the environment each needs; the child times only the lookups. The
//! closing table (with `--bench`) gives ratios from one back-to-back run in which every
//! measured lookup is the first of a brand-new process, the situation the disk tier is for.

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group};
use kcache::backend::opencl::{OpenClCache, OpenClOptions, OpenClStats};
use kcache::disk::OperatorKey;
use kcache::remote::RemoteConfig;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::Context;
use kcache_testkit::redis::RedisServer;
use kcache_testkit::successful_stdout;

const SOURCE: &str = r#"
__kernel void nbody_step(__global float4 *pos, __global float4 *vel, float dt, int n) {
    int i = get_global_id(0);
    float4 p = pos[i];
    float4 a = (float4)(0.0f);
    for (int j = 0; j < n; j++) {
        float4 d = pos[j] - p;
        float r2 = d.x * d.x + d.y * d.y + d.z * d.z + 1e-3f;
        a += d * (pos[j].w * native_rsqrt(r2 * r2 * r2));
    }
    vel[i] += a * dt;
    pos[i] += vel[i] * dt;
}
"#;

const CHILD_MODE: &str = "KCACHE_BENCH_OPENCL_MODE";
const CHILD_ITERS: &str = "KCACHE_BENCH_OPENCL_ITERS";
const CHILD_DIR: &str = "KCACHE_BENCH_OPENCL_DIR";
const CHILD_REMOTE: &str = "KCACHE_BENCH_OPENCL_REMOTE";
/// The operator key of the remote mode's disk tiers (the remote tier needs one).
const OPERATOR_KEY: [u8; 32] = [7; 32];

/// One way of getting the program, run in a child process.
#[derive(Clone, Copy)]
enum Mode {
    Cold,
    PoclHit,
    KcacheDisk,
    KcacheRemote,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Cold => "cold",
            Mode::PoclHit => "pocl-hit",
            Mode::KcacheDisk => "kcache-disk",
            Mode::KcacheRemote => "kcache-remote",
        }
    }

    fn parse(name: &str) -> Option<Mode> {
        [
            Mode::Cold,
            Mode::PoclHit,
            Mode::KcacheDisk,
            Mode::KcacheRemote,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// Runs `iters` lookups of `mode` in a child process and returns their total time.
fn in_child(mode: Mode, iters: u64, dirs: &Dirs) -> Duration {
    let pocl_cache = match mode {
        Mode::PoclHit => "1",
        Mode::Cold | Mode::KcacheDisk | Mode::KcacheRemote => "0",
    };
    let stdout = successful_stdout(
        &format!("the {} child", mode.name()),
        Command::new(std::env::current_exe().unwrap())
            .env(CHILD_MODE, mode.name())
            .env(CHILD_ITERS, iters.to_string())
            .env(CHILD_DIR, &dirs.kcache)
            .env(CHILD_REMOTE, dirs.redis.url())
            .env("POCL_KERNEL_CACHE", pocl_cache)
            .env("POCL_CACHE_DIR", &dirs.pocl),
    );
    let nanos = stdout
        .lines()
        .find_map(|l| l.strip_prefix("nanos="))
        .expect("the child reports nanos=")
        .parse()
        .unwrap();
    Duration::from_nanos(nanos)
}

/// The child side: times `iters` lookups, each in a new context (and, for kcache, a new
/// cache), so nothing but the tier under test can answer.
fn child(mode: Mode, iters: u64, dir: &Path, remote: &str) {
    let device = Context::first_device().unwrap().device();
    let disk = Arc::new(Persistence::open(PersistenceConfig::in_dir(dir)).unwrap());
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let context = Context::new(device).unwrap();
        match mode {
            Mode::Cold | Mode::PoclHit => {
                let start = Instant::now();
                let program = context.build_uncached(&[SOURCE], "").unwrap();
                total += start.elapsed();
                drop(program);
            }
            Mode::KcacheDisk => {
                let (time, stats) = timed_lookup(&disk, &context);
                total += time;
                assert_eq!(stats.binary_loads, 1, "served from disk");
            }
            Mode::KcacheRemote => {
                // A new node: its disk tier is empty.
                let empty = tempfile::tempdir().unwrap();
                let disk = Arc::new(Persistence::open(keyed(empty.path(), remote)).unwrap());
                let (time, stats) = timed_lookup(&disk, &context);
                total += time;
                assert_eq!(
                    disk.remote_stats().unwrap().hits,
                    1,
                    "served from the remote"
                );
                assert_eq!(stats.source_builds, 0);
            }
        }
    }
    println!("nanos={}", total.as_nanos());
}

/// How long the first lookup of a new kcache on `disk` takes, and the cache's counters after.
fn timed_lookup(disk: &Arc<Persistence>, context: &Context) -> (Duration, OpenClStats) {
    let cache = OpenClCache::new(OpenClOptions {
        persistence: Some(Arc::clone(disk)),
        ..OpenClOptions::default()
    })
    .unwrap();
    let start = Instant::now();
    let lease = cache
        .find_or_build(context.context(), context.device(), &[SOURCE], "")
        .unwrap();
    let time = start.elapsed();
    drop(lease);
    (time, cache.stats())
}

struct Dirs {
    kcache: std::path::PathBuf,
    pocl: std::path::PathBuf,
    redis: RedisServer,
    _root: tempfile::TempDir,
}

/// A disk tier in `dir` under [`OPERATOR_KEY`], with the remote tier at `url` behind it.
fn keyed(dir: &Path, url: &str) -> PersistenceConfig {
    PersistenceConfig {
        key: Some(OperatorKey::new(OPERATOR_KEY.to_vec()).unwrap()),
        remote: Some(RemoteConfig::at(url)),
        ..PersistenceConfig::in_dir(dir)
    }
}

/// Fresh cache directories and store, all warm: the binary is on kcache's disk, in its remote
/// tier and in PoCL's cache.
fn warm_dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let redis = RedisServer::start().expect("the remote tier's rows need redis-server");
    // Another node's disk: the build it makes goes to the remote.
    warm(Persistence::open(keyed(&root.path().join("node"), &redis.url())).unwrap());
    let dirs = Dirs {
        kcache: root.path().join("kcache"),
        pocl: root.path().join("pocl"),
        redis,
        _root: root,
    };
    std::fs::create_dir(&dirs.pocl).unwrap();
    warm(Persistence::open(PersistenceConfig::in_dir(&dirs.kcache)).unwrap());
    in_child(Mode::PoclHit, 1, &dirs);
    dirs
}

/// Builds the program through a cache on `disk`, and flushes its binary to the disk (and to
/// the remote tier behind it, if any).
fn warm(disk: Persistence) {
    Context::first_device()
        .unwrap()
        .store_program(Arc::new(disk), SOURCE);
}

fn lookups(c: &mut Criterion) {
    let dirs = warm_dirs();
    let mut group = c.benchmark_group("opencl");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    for (name, mode) in [
        ("cold (POCL_KERNEL_CACHE=0)", Mode::Cold),
        ("pocl cache hit", Mode::PoclHit),
        ("kcache disk hit", Mode::KcacheDisk),
        ("kcache remote hit", Mode::KcacheRemote),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| in_child(mode, iters, &dirs))
        });
    }
    group.finish();

    let memory = MemoryHit::new();
    c.bench_function("opencl/kcache memory hit", |b| b.iter(|| memory.hit()));
}

/// A memory-only cache that already holds the program, for timing hits.
struct MemoryHit {
    context: Context,
    cache: OpenClCache,
}

impl MemoryHit {
    fn new() -> Self {
        let this = MemoryHit {
            context: Context::first_device().unwrap(),
            cache: OpenClCache::new(OpenClOptions::default()).unwrap(),
        };
        this.hit();
        this
    }

    fn hit(&self) {
        let lease = self
            .cache
            .find_or_build(self.context.context(), self.context.device(), &[SOURCE], "")
            .unwrap();
        black_box(lease.value().raw());
    }
}

criterion_group!(benches, lookups);

/// One back-to-back run: each disk-side figure is the median of single lookups, each the first
/// lookup of a new process.
fn ratios() {
    const RUNS: usize = 5;
    let dirs = warm_dirs();
    let median = |mode: Mode| {
        let mut times: Vec<Duration> = (0..RUNS).map(|_| in_child(mode, 1, &dirs)).collect();
        times.sort();
        times[RUNS / 2]
    };
    let cold = median(Mode::Cold);
    let pocl = median(Mode::PoclHit);
    let disk = median(Mode::KcacheDisk);
    let remote = median(Mode::KcacheRemote);
    let warm = MemoryHit::new();
    const HITS: u32 = 1_000_000;
    let start = Instant::now();
    for _ in 0..HITS {
        warm.hit();
    }
    let memory = start.elapsed() / HITS;

    println!("\nOpenCL program lookup, first lookup of a new process (median of {RUNS}):");
    println!("{:<34} {:>12} {:>14}", "path", "time", "cold / this");
    for (name, time) in [
        ("cold build (POCL_KERNEL_CACHE=0)", cold),
        ("PoCL kernel cache hit", pocl),
        ("kcache disk (L2) hit", disk),
        ("kcache remote (L3) hit", remote),
        ("kcache memory (L1) hit", memory),
    ] {
        println!(
            "{name:<34} {:>12} {:>13.0}x",
            format!("{time:.2?}"),
            cold.as_secs_f64() / time.as_secs_f64()
        );
    }
    println!(
        "kcache disk hit vs PoCL cache hit: {:.1}x faster",
        pocl.as_secs_f64() / disk.as_secs_f64()
    );
}

fn main() {
    if let Ok(mode) = std::env::var(CHILD_MODE) {
        let mode = Mode::parse(&mode).expect("a known mode");
        let iters = std::env::var(CHILD_ITERS).unwrap().parse().unwrap();
        let dir = std::env::var_os(CHILD_DIR).unwrap();
        let remote = std::env::var(CHILD_REMOTE).unwrap();
        child(mode, iters, Path::new(&dir), &remote);
        return;
    }
    // Without a device or `redis-server` (`cargo test --all-targets` on a bare machine), this
    // says so and measures nothing.
    if Context::for_test().is_none() || kcache_testkit::redis::installed().is_none() {
        return;
    }
    // `KCACHE_BENCH_OPS=<n>`: only `n` memory hits, for an instruction counter
    // (`scripts/hit-compare`).
    if let Ok(ops) = std::env::var("KCACHE_BENCH_OPS") {
        let warm = MemoryHit::new();
        (0..ops.parse::<u32>().unwrap()).for_each(|_| warm.hit());
        return;
    }
    kcache_testkit::bench::main(benches, ratios);
}
