//! Compile once per node, on the machine's OpenCL implementation (PoCL in CI). Every figure
//! is a whole process's first use of a kernel: its lookup (the program, cached or not) and its
//! first launch, which on PoCL compiles the work-group code. Each process is this executable
//! again, in worker mode; all run with `POCL_KERNEL_CACHE=0` and a PoCL directory of their
//! own, and each kcache configuration starts from a fresh cache directory:
//!
//! - **fleet**: N processes (N = 1, 2, 4, 8) start the same two kernels at the same moment
//!   (they poll for a go file), with kcache sharing one cache directory and without it (plain
//!   `clBuildProgram`): the wall time until the last process has run both, and the compiles;
//! - **first process**: a process with kcache and an empty cache directory (cold) against a
//!   plain build, same kernel, measured alternately: the miss's overhead;
//! - **warm process**: a process whose cache directory an earlier process left warm (lookup,
//!   launch, then dropping its cache, which flushes: on PoCL that is when a lone process
//!   stores its binaries) against the plain build;
//! - **cluster** (`cargo bench --bench node -- cluster` runs it alone): four nodes, each a
//!   process with a keyed cache directory of its own, start the same two kernels at the same
//!   moment, sharing no store, a Redis tier (one `redis-server` on loopback, empty at each run) or
//!   an object store (one SeaweedFS, an empty bucket); and one node alone. Skipped, with a
//!   message, when `redis-server` is not installed.
//!
//! With kcache a process also flushes before it exits (on PoCL a lone process's binaries are
//! made and written then): that time is reported apart, and in the fleet's second wall time.
//!
//! These are process-level figures, so criterion does not fit: each configuration is repeated
//! and the median printed. Without `--bench` (as `cargo test --all-targets` runs it) it makes
//! one small pass of each, a smoke run.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use kcache::backend::opencl::{OpenClCache, OpenClOptions};
use kcache::disk::OperatorKey;
use kcache::object_store::ObjectStoreConfig;
use kcache::remote::{RemoteConfig, RemoteStats};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::{BuiltProgram, Context, KernelArg, Matmul, run_kernel_in_groups};
use kcache_testkit::seaweed;
use zeroize::Zeroizing;

const SAXPY: &str = r#"
__kernel void saxpy(__global float *y, __global const float *x, float a) {
    int i = get_global_id(0);
    y[i] = a * x[i] + y[i];
}
"#;

/// C = A * B for N x N row-major matrices, N a multiple of TILE: one work-group per TILE x
/// TILE tile of C, which walks A's row of tiles and B's column of tiles through local memory.
const MATMUL: &str = r#"
#define TILE 16
__kernel __attribute__((reqd_work_group_size(TILE * TILE, 1, 1)))
void matmul_tiled(__global float *c, __global const float *a, __global const float *b, int n) {
    __local float ta[TILE][TILE];
    __local float tb[TILE][TILE];
    int tiles = n / TILE;
    int ty = get_local_id(0) / TILE;
    int tx = get_local_id(0) % TILE;
    int row = get_group_id(0) / tiles * TILE + ty;
    int col = get_group_id(0) % tiles * TILE + tx;
    float sum = 0.0f;
    for (int t = 0; t < tiles; t++) {
        ta[ty][tx] = a[row * n + t * TILE + tx];
        tb[ty][tx] = b[(t * TILE + ty) * n + col];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TILE; k++)
            sum += ta[ty][k] * tb[k][tx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    c[row * n + col] = sum;
}
"#;
const MATMUL_N: usize = 128;
const MATMUL_LOCAL: usize = 16 * 16;
const SAXPY_N: usize = 4096;

const WORKER: &str = "KCACHE_BENCH_NODE_WORKER";
const WORKER_KERNELS: &str = "KCACHE_BENCH_NODE_KERNELS";
const WORKER_DIR: &str = "KCACHE_BENCH_NODE_DIR";
const WORKER_GO: &str = "KCACHE_BENCH_NODE_GO";
/// A cluster node: its cache directory is keyed with [`OPERATOR_KEY`], and has the remote tier
/// at this URL when it is not empty.
const WORKER_NODE: &str = "KCACHE_BENCH_NODE_REMOTE";
/// The operator key of a cluster's nodes (the remote tier needs one; nodes without it have it
/// too, so that both sides sign and verify alike).
const OPERATOR_KEY: [u8; 32] = [9; 32];

#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    Saxpy,
    Matmul,
}

impl Kernel {
    const ALL: [Kernel; 2] = [Kernel::Saxpy, Kernel::Matmul];

    fn name(self) -> &'static str {
        match self {
            Kernel::Saxpy => "saxpy",
            Kernel::Matmul => "matmul_tiled",
        }
    }

    fn parse(names: &str) -> Vec<Kernel> {
        names
            .split(',')
            .map(|n| {
                *Kernel::ALL
                    .iter()
                    .find(|k| k.name() == n)
                    .expect("a kernel")
            })
            .collect()
    }

    fn source(self) -> &'static str {
        match self {
            Kernel::Saxpy => SAXPY,
            Kernel::Matmul => MATMUL,
        }
    }

    /// Runs the kernel once on fixed inputs, returns how long the launch took (buffers,
    /// kernel, run, read back) and checks every element against the CPU.
    fn launch(self, context: &Context, program: &impl BuiltProgram) -> Duration {
        match self {
            Kernel::Saxpy => {
                let x: Vec<f32> = (0..SAXPY_N).map(|i| i as f32).collect();
                let mut y = vec![1.0f32; SAXPY_N];
                let mut args = [
                    KernelArg::Floats(&mut y),
                    KernelArg::Input(&x),
                    KernelArg::Float(2.0),
                ];
                let start = Instant::now();
                run_kernel_in_groups(context, program, self.name(), &mut args, SAXPY_N, None)
                    .unwrap();
                let elapsed = start.elapsed();
                for (i, v) in y.iter().enumerate() {
                    assert_eq!(*v, 2.0 * i as f32 + 1.0, "saxpy element {i}");
                }
                elapsed
            }
            Kernel::Matmul => {
                let (n, local) = (MATMUL_N, Some(MATMUL_LOCAL));
                let mut matmul = Matmul::new(n);
                let mut args = matmul.args();
                let start = Instant::now();
                run_kernel_in_groups(context, program, self.name(), &mut args, n * n, local)
                    .unwrap();
                let elapsed = start.elapsed();
                matmul.check().unwrap();
                elapsed
            }
        }
    }
}

/// How a process gets its programs.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `clCreateProgramWithSource` + `clBuildProgram`, no cache.
    Plain,
    /// `OpenClCache::find_or_build` with a disk tier.
    Kcache,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Kcache => "kcache",
        }
    }
}

/// The worker process: sets up, waits for the go file if it has one (saying `ready` first),
/// then looks up and launches each kernel in turn, and reports `key=value` lines.
fn worker(mode: &str, kernels: &[Kernel], dir: &Path, go: Option<&Path>, node: Option<&str>) {
    let context = Context::first_device().unwrap();
    let config = match node {
        None => PersistenceConfig::in_dir(dir),
        // The shared store: none, Redis (`redis://…`), or an object store (`http://…`).
        Some(store) => PersistenceConfig {
            key: Some(OperatorKey::new(OPERATOR_KEY.to_vec()).unwrap()),
            remote: store.starts_with("redis").then(|| RemoteConfig::at(store)),
            object_store: store.starts_with("http").then(|| ObjectStoreConfig {
                access_key_id: Some(seaweed::ACCESS_KEY_ID.into()),
                secret_access_key: Some(Zeroizing::new(seaweed::SECRET_ACCESS_KEY.into())),
                timeout: Some(Duration::from_secs(5)),
                ..ObjectStoreConfig::at(store)
            }),
            ..PersistenceConfig::in_dir(dir)
        },
    };
    let disk = (mode == Mode::Kcache.name()).then(|| Arc::new(Persistence::open(config).unwrap()));
    let cache = disk.as_ref().map(|disk| {
        OpenClCache::new(OpenClOptions {
            persistence: Some(Arc::clone(disk)),
            ..OpenClOptions::default()
        })
        .unwrap()
    });
    if let Some(go) = go {
        println!("ready");
        while !go.exists() {
            thread::sleep(Duration::from_micros(200));
        }
    }
    for &kernel in kernels {
        let sources = [kernel.source()];
        let start = Instant::now();
        let launch = match &cache {
            Some(cache) => {
                let device = context.device();
                let lease = cache
                    .find_or_build(context.context(), device, &sources, "")
                    .unwrap();
                println!("{}.lookup_ns={}", kernel.name(), start.elapsed().as_nanos());
                kernel.launch(&context, lease.value())
            }
            None => {
                let program = context.build_uncached(&sources, "").unwrap();
                println!("{}.lookup_ns={}", kernel.name(), start.elapsed().as_nanos());
                kernel.launch(&context, &program)
            }
        };
        println!("{}.launch_ns={}", kernel.name(), launch.as_nanos());
    }
    let unix_now = || {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
        now.unwrap().as_nanos()
    };
    println!("done_unix_ns={}", unix_now());
    let (builds, loads) = cache.as_ref().map_or((kernels.len() as u64, 0), |cache| {
        // What dropping the cache does: the held-back binaries made and written.
        let start = Instant::now();
        cache.flush();
        println!("flush_ns={}", start.elapsed().as_nanos());
        let stats = cache.stats();
        println!("lock_waits={}", stats.disk.lock_waits);
        if let Some(disk) = disk.as_ref().filter(|disk| !disk.store_stats().is_empty()) {
            let stores = disk.store_stats();
            let sum = |of: fn(&RemoteStats) -> u64| stores.iter().map(|(_, s)| of(s)).sum::<u64>();
            println!("remote_hits={}", sum(|s| s.hits));
            println!("lease_waits={}", sum(|s| s.lease_waits));
        }
        (stats.source_builds, stats.binary_loads)
    });
    println!("flushed_unix_ns={}", unix_now());
    println!("source_builds={builds}");
    println!("binary_loads={loads}");
}

/// What a worker reported.
struct Report(String);

impl Report {
    fn value(&self, name: &str) -> u128 {
        self.find(name)
            .unwrap_or_else(|| panic!("a worker did not report {name}:\n{}", self.0))
    }

    fn find(&self, name: &str) -> Option<u128> {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .map(|v| v.parse().unwrap())
    }

    fn time(&self, kernel: Kernel, what: &str) -> Duration {
        let nanos = self.value(&format!("{}.{what}_ns", kernel.name()));
        Duration::from_nanos(nanos as u64)
    }

    /// The lookup and the first launch of every kernel, added up.
    fn step(&self, kernels: &[Kernel]) -> Step {
        let add = |what| kernels.iter().map(|&k| self.time(k, what)).sum();
        let (lookup, launch) = (add("lookup"), add("launch"));
        // A plain process has nothing to flush.
        let flush = Duration::from_nanos(self.find("flush_ns").unwrap_or(0) as u64);
        Step {
            lookup,
            launch,
            total: lookup + launch,
            flush,
            exit: lookup + launch + flush,
        }
    }
}

/// A worker of `mode` for `kernels` with its kcache directory `dir`, and PoCL's own
/// directory `pocl`, one per process: PoCL compiles in it even with its kernel cache off, and
/// processes that compile the same program at once in a shared one can break each other's
/// builds ("Final linking of kernel ... failed").
fn worker_command(mode: Mode, kernels: &[Kernel], dir: &Path, pocl: &Path) -> Command {
    std::fs::create_dir_all(pocl).unwrap();
    let names: Vec<&str> = kernels.iter().map(|k| k.name()).collect();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .env(WORKER, mode.name())
        .env(WORKER_KERNELS, names.join(","))
        .env(WORKER_DIR, dir)
        .env("POCL_KERNEL_CACHE", "0")
        .env("POCL_CACHE_DIR", pocl);
    command
}

/// One worker, alone.
fn run_worker(mode: Mode, kernels: &[Kernel], dir: &Path) -> Report {
    let pocl = tempfile::tempdir().unwrap();
    let output = worker_command(mode, kernels, dir, pocl.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "a {} worker failed:\n{stdout}\n{}",
        mode.name(),
        String::from_utf8_lossy(&output.stderr)
    );
    Report(stdout)
}

/// One fleet run: its wall times (go file to the last process's last launch, and to the end
/// of the last flush) and its reports.
fn fleet_once(mode: Mode, processes: usize) -> (Duration, Duration, Vec<Report>) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("kcache");
    together(root.path(), processes, |_, pocl| {
        worker_command(mode, &Kernel::ALL, &dir, pocl)
    })
}

/// Starts `processes` workers, `command(i, its PoCL directory)` each, and lets them go at the
/// same moment once all are set up: the wall times (go file to the last process's last
/// launch, and to the end of the last flush) and their reports.
fn together(
    root: &Path,
    processes: usize,
    command: impl Fn(usize, &Path) -> Command,
) -> (Duration, Duration, Vec<Report>) {
    let go = root.join("go");
    let mut children: Vec<_> = (0..processes)
        .map(|i| {
            command(i, &root.join(format!("pocl-{i}")))
                .env(WORKER_GO, &go)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|child| BufReader::new(child.stdout.take().unwrap()))
        .collect();
    for output in &mut outputs {
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n", "a worker failed before the start");
    }
    let start = SystemTime::now();
    File::create(&go).unwrap();
    let reports: Vec<Report> = children
        .iter_mut()
        .zip(outputs)
        .map(|(child, mut output)| {
            let mut stdout = String::new();
            output.read_to_string(&mut stdout).unwrap();
            assert!(
                child.wait().unwrap().success(),
                "a worker failed:\n{stdout}"
            );
            Report(stdout)
        })
        .collect();
    let start = start.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    let until = |what| {
        let last = reports.iter().map(|r| r.value(what)).max().unwrap();
        Duration::from_nanos(last as u64) - start
    };
    (until("done_unix_ns"), until("flushed_unix_ns"), reports)
}

/// A fleet configuration's median wall time over `runs`, with the compiles and lock waits of
/// the median run.
struct Fleet {
    wall: Duration,
    /// The median process's first launches (both kernels).
    launch: Duration,
    /// Up to the end of the last flush.
    wall_flushed: Duration,
    compiles: u128,
    lock_waits: u128,
}

fn fleet(mode: Mode, processes: usize, runs: usize) -> Fleet {
    let mut results: Vec<(Duration, Duration, Vec<Report>)> =
        (0..runs).map(|_| fleet_once(mode, processes)).collect();
    results.sort_by_key(|(_, flushed, _)| *flushed);
    let wall_flushed = results[runs / 2].1;
    results.sort_by_key(|(wall, _, _)| *wall);
    let (wall, _, reports) = &results[runs / 2];
    let sum = |name| reports.iter().map(|r| r.value(name)).sum();
    let steps = reports.iter().map(|r| r.step(&Kernel::ALL)).collect();
    Fleet {
        wall: *wall,
        launch: median(steps).launch,
        wall_flushed,
        compiles: sum("source_builds"),
        lock_waits: match mode {
            Mode::Plain => 0,
            Mode::Kcache => sum("lock_waits"),
        },
    }
}

/// A table printed row by row, its header first: each cell padded to its column's `widths`,
/// right-aligned but for a first column of row names (`names`), left-aligned.
struct Table {
    widths: &'static [usize],
    names: bool,
}

impl Table {
    fn row<T: std::fmt::Display>(&self, cells: impl IntoIterator<Item = T>) {
        let mut line = String::new();
        for (i, (cell, &width)) in cells.into_iter().zip(self.widths).enumerate() {
            if i > 0 {
                line.push(' ');
            }
            line += &if i == 0 && self.names {
                format!("{cell:<width$}")
            } else {
                format!("{cell:>width$}")
            };
        }
        println!("{line}");
    }
}

/// A time as the tables show it.
fn time(d: Duration) -> String {
    format!("{d:.2?}")
}

/// A ratio as the tables show it.
fn times(ratio: f64) -> String {
    format!("{ratio:.2}x")
}

fn fleets(sizes: &[usize], runs: usize) {
    println!(
        "\nfleet: N processes start {} and {} at once (median of {runs} runs)",
        Kernel::Saxpy.name(),
        Kernel::Matmul.name()
    );
    let table = Table {
        widths: &[3, 11, 11, 13, 13, 13, 17, 13, 15, 16, 10],
        names: false,
    };
    table.row([
        "N",
        "plain wall",
        "kcache wall",
        "plain launch",
        "kcache launch",
        "plain/kcache",
        "kcache +flush",
        "kcache/alone",
        "plain compiles",
        "kcache compiles",
        "lock waits",
    ]);
    let mut alone = None;
    for &n in sizes {
        let plain = fleet(Mode::Plain, n, runs);
        let kcache = fleet(Mode::Kcache, n, runs);
        let alone = *alone.get_or_insert(kcache.wall);
        let over = |a: Duration, b: Duration| times(a.as_secs_f64() / b.as_secs_f64());
        let flushed = format!(
            "{} ({})",
            time(kcache.wall_flushed),
            over(plain.wall, kcache.wall_flushed)
        );
        table.row([
            n.to_string(),
            time(plain.wall),
            time(kcache.wall),
            time(plain.launch),
            time(kcache.launch),
            over(plain.wall, kcache.wall),
            flushed,
            over(kcache.wall, alone),
            plain.compiles.to_string(),
            kcache.compiles.to_string(),
            kcache.lock_waits.to_string(),
        ]);
    }
    println!("(compiles: clBuildProgram from source in the lookups, all processes together;");
    println!(" launch: the median process's first launches of both kernels;");
    println!(" kcache +flush: until the last process's flush, and plain/that;");
    println!(" kcache/alone: this fleet's wall time over one kcache process's)");
}

/// A process's lookup and first launch, of all its kernels together.
#[derive(Clone, Copy)]
struct Step {
    lookup: Duration,
    launch: Duration,
    total: Duration,
    /// kcache's flush before the process exits.
    flush: Duration,
    /// `total` and `flush`.
    exit: Duration,
}

/// A column of a table of steps: its header, and the time of a step it shows.
type Column = (&'static str, fn(&Step) -> Duration);

/// The median of each column on its own.
fn median(mut steps: Vec<Step>) -> Step {
    let middle = steps.len() / 2;
    let mut pick = |key: fn(&Step) -> Duration| {
        steps.sort_by_key(key);
        key(&steps[middle])
    };
    Step {
        lookup: pick(|s| s.lookup),
        launch: pick(|s| s.launch),
        total: pick(|s| s.total),
        flush: pick(|s| s.flush),
        exit: pick(|s| s.exit),
    }
}

/// Plain, cold and warm processes for one kernel, measured alternately.
fn single_processes(kernel: Kernel, runs: usize) {
    let kernels = [kernel];
    let root = tempfile::tempdir().unwrap();
    let warm_dir = root.path().join("warm");
    // The earlier process: lookup, launch, then its cache flushed.
    run_worker(Mode::Kcache, &kernels, &warm_dir);
    let (mut plain, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        plain.push(run_worker(Mode::Plain, &kernels, &warm_dir).step(&kernels));
        let cold_dir = root.path().join(format!("cold-{run}"));
        cold.push(run_worker(Mode::Kcache, &kernels, &cold_dir).step(&kernels));
        let report = run_worker(Mode::Kcache, &kernels, &warm_dir);
        assert_eq!(
            report.value("binary_loads"),
            1,
            "the warm process loads the binary"
        );
        assert_eq!(
            report.value("source_builds"),
            0,
            "the warm process compiles nothing"
        );
        warm.push(report.step(&kernels));
    }
    let plain = median(plain);
    println!(
        "\n{}: one process, lookup + first launch (median of {runs})",
        kernel.name()
    );
    let table = Table {
        widths: &[38, 10, 10, 10, 10, 15, 14, 15],
        names: true,
    };
    let columns: [Column; 4] = [
        ("lookup", |s| s.lookup),
        ("launch", |s| s.launch),
        ("total", |s| s.total),
        ("flush", |s| s.flush),
    ];
    // The same, as plain's time over the process's.
    let ratios: [Column; 3] = [
        ("plain÷ (lookup)", |s| s.lookup),
        ("plain÷ (total)", |s| s.total),
        ("plain÷ (+flush)", |s| s.exit),
    ];
    let headers = columns.iter().chain(&ratios).map(|(header, _)| *header);
    table.row(std::iter::once("process").chain(headers));
    for (name, step) in [
        ("plain build, no cache", plain),
        ("kcache, empty cache directory (cold)", median(cold)),
        ("kcache, warm cache directory", median(warm)),
    ] {
        let shown = columns.iter().map(|(_, of)| time(of(&step)));
        let vs = ratios
            .iter()
            .map(|(_, of)| times(of(&plain).as_secs_f64() / of(&step).as_secs_f64()));
        table.row(std::iter::once(name.to_owned()).chain(shown).chain(vs));
    }
}

#[path = "node/cluster.rs"]
mod cluster;

fn main() {
    if let Ok(mode) = std::env::var(WORKER) {
        let kernels = Kernel::parse(&std::env::var(WORKER_KERNELS).unwrap());
        let dir = std::env::var_os(WORKER_DIR).unwrap();
        let go = std::env::var_os(WORKER_GO);
        let node = std::env::var(WORKER_NODE).ok();
        worker(
            &mode,
            &kernels,
            Path::new(&dir),
            go.as_deref().map(Path::new),
            node.as_deref(),
        );
        return;
    }
    // Without a device (`cargo test --all-targets` on a bare machine), this says so and
    // measures nothing.
    if Context::for_test().is_none() {
        return;
    }
    if std::env::args().any(|a| a == "cluster") {
        cluster::cold_starts(5);
        return;
    }
    // `cargo test --all-targets` runs this binary without `--bench`: a smoke run only.
    if !std::env::args().any(|a| a == "--bench") {
        fleets(&[2], 1);
        single_processes(Kernel::Saxpy, 1);
        return;
    }
    fleets(&[1, 2, 4, 8], 3);
    for kernel in Kernel::ALL {
        single_processes(kernel, 5);
    }
    println!("(plain÷: the plain build's time over this process's; above 1 is faster)");
    cluster::cold_starts(5);
}
