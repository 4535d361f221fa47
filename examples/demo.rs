//! The kcache demo: builds a real OpenCL kernel without any cache (the peer, in a process of
//! its own), then through the cache, finds it again in memory, then starts a fresh process
//! that loads the program binary from disk; every program is run and its output checked
//! against the CPU. Prints, per step, the lookup, the first launch and their sum, with ratios
//! against the plain build, and the cache statistics.
//!
//! ```text
//! scripts/demo                                  # installs PoCL if needed, then runs this
//! cargo run --release --example demo            # a temporary cache directory, removed after
//! cargo run --release --example demo -- --cache-dir DIR
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kcache::backend::opencl::{DeviceIdentity, OpenClCache, OpenClOptions, OpenClStats};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::{BuiltProgram, Context, Matmul, run_kernel};

const SOURCE: &str = r#"
// C = A * B for N x N row-major matrices, one work item per element of C.
__kernel void matmul(__global float *c, __global const float *a, __global const float *b,
                     int n) {
    int row = get_global_id(0) / n;
    int col = get_global_id(0) % n;
    float sum = 0.0f;
    for (int k = 0; k < n; k++)
        sum += a[row * n + k] * b[k * n + col];
    c[row * n + col] = sum;
}
"#;
const OPTIONS: &str = "-cl-mad-enable";
const N: usize = 96;
/// Lookups timed together for the memory hit, whose single duration is below clock noise.
const HIT_LOOKUPS: u32 = 100_000;

type Error = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [flag] if flag == "--plain-process" => plain_process(),
        [flag, dir] if flag == "--second-process" => second_process(Path::new(dir)),
        [flag, dir] if flag == "--cache-dir" => demo(Some(PathBuf::from(dir))),
        [] => demo(None),
        _ => Err("usage: demo [--cache-dir DIR]".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn open_cache(dir: &Path) -> Result<OpenClCache, Error> {
    let disk = Persistence::open(PersistenceConfig::in_dir(dir))?;
    Ok(OpenClCache::new(OpenClOptions {
        persistence: Some(Arc::new(disk)),
        ..OpenClOptions::default()
    })?)
}

/// Runs the kernel on fixed inputs, returns how long the launch took (buffers, kernel, run,
/// read back) and compares every element with the CPU's product.
fn run_and_check(context: &Context, program: &impl BuiltProgram) -> Result<Duration, Error> {
    let mut matmul = Matmul::new(N);
    let start = Instant::now();
    run_kernel(context, program, "matmul", &mut matmul.args(), N * N)?;
    let elapsed = start.elapsed();
    matmul.check()?;
    Ok(elapsed)
}

/// How long a step took to get its program, and to run it once.
#[derive(Clone, Copy)]
struct Step {
    lookup: Duration,
    launch: Duration,
}

impl Step {
    fn total(self) -> Duration {
        self.lookup + self.launch
    }

    fn print(self) {
        println!("lookup_ns={}", self.lookup.as_nanos());
        println!("launch_ns={}", self.launch.as_nanos());
    }
}

/// The peer, in a process of its own so that it pays the driver's first-build setup as
/// process 1's cold lookup does: `clCreateProgramWithSource` + `clBuildProgram` and the first
/// launch, without kcache. Reports `key=value` lines.
fn plain_process() -> Result<(), Error> {
    let context = Context::first_device()?;
    let start = Instant::now();
    let program = context.build_uncached(&[SOURCE], OPTIONS)?;
    let lookup = start.elapsed();
    let launch = run_and_check(&context, &program)?;
    Step { lookup, launch }.print();
    Ok(())
}

/// The fresh process: nothing in memory, the binary on disk. Reports `key=value` lines.
fn second_process(dir: &Path) -> Result<(), Error> {
    let context = Context::first_device()?;
    let cache = open_cache(dir)?;
    let start = Instant::now();
    let lease = cache.find_or_build(context.context(), context.device(), &[SOURCE], OPTIONS)?;
    let lookup = start.elapsed();
    let launch = run_and_check(&context, lease.value())?;
    Step { lookup, launch }.print();
    drop(lease);
    cache.flush();
    print_stats(&cache.stats());
    Ok(())
}

fn print_stats(s: &OpenClStats) {
    for (name, value) in stat_rows(s) {
        println!("{name}={value}");
    }
}

fn stat_rows(s: &OpenClStats) -> [(&'static str, u64); 12] {
    [
        ("compiled from source", s.source_builds),
        ("loaded from disk binary", s.binary_loads),
        ("memory hits", s.memory.hits),
        ("memory misses", s.memory.misses),
        ("disk hits", s.disk_hits),
        ("disk misses", s.disk_misses),
        ("disk lock waits (other process)", s.disk.lock_waits),
        ("binaries written to disk", s.disk.puts),
        ("disk writes pending", s.disk.pending_writes),
        ("disk writes failed", s.disk.failed_writes),
        ("binaries rejected", s.binaries_rejected),
        ("programs in memory", s.memory.entries),
    ]
}

/// What a child process (this executable again, with `args`) reported.
struct Report(String);

impl Report {
    fn run(what: &str, args: &[&std::ffi::OsStr]) -> Result<Report, Error> {
        let output = Command::new(std::env::current_exe()?).args(args).output()?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(format!("the {what} failed: {stderr}").into());
        }
        Ok(Report(String::from_utf8(output.stdout)?))
    }

    fn value(&self, name: &str) -> Result<u64, Error> {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| format!("a child process did not report {name}"))?
            .parse()
            .map_err(Into::into)
    }

    fn step(&self) -> Result<Step, Error> {
        Ok(Step {
            lookup: Duration::from_nanos(self.value("lookup_ns")?),
            launch: Duration::from_nanos(self.value("launch_ns")?),
        })
    }
}

fn demo(dir: Option<PathBuf>) -> Result<(), Error> {
    let temporary = match dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("kcache-demo-").tempdir()?),
    };
    let dir = dir.unwrap_or_else(|| temporary.as_ref().unwrap().path().to_path_buf());

    let context = Context::first_device()?;
    let identity = DeviceIdentity::query(context.device())?;
    println!("kcache demo: OpenCL program cache");
    println!("  platform   {}", identity.platform_name);
    println!("  device     {}", identity.device_name);
    println!("  driver     {}", identity.driver_version);
    println!("  kernel     matmul {N}x{N} (float), options \"{OPTIONS}\"");
    println!("  disk tier  {}", dir.display());
    if std::env::var("POCL_KERNEL_CACHE").as_deref() != Ok("0") {
        println!("  note       PoCL's own kernel cache is on: the cold build may be its cache hit");
    }
    println!();

    let plain = Report::run("plain-build process", &["--plain-process".as_ref()])?.step()?;

    let cache = open_cache(&dir)?;
    let start = Instant::now();
    let cold = cache.find_or_build(context.context(), context.device(), &[SOURCE], OPTIONS)?;
    let lookup = start.elapsed();
    let cold_step = Step {
        lookup,
        launch: run_and_check(&context, cold.value())?,
    };
    drop(cold);

    let start = Instant::now();
    for _ in 0..HIT_LOOKUPS {
        let hit = cache.find_or_build(context.context(), context.device(), &[SOURCE], OPTIONS)?;
        std::hint::black_box(hit.value().raw());
    }
    let lookup = start.elapsed() / HIT_LOOKUPS;
    let hit = cache.find_or_build(context.context(), context.device(), &[SOURCE], OPTIONS)?;
    let hit_step = Step {
        lookup,
        launch: run_and_check(&context, hit.value())?,
    };
    drop(hit);
    // Dropping the cache would flush too; flushing first lets the statistics show the writes.
    cache.flush();
    let first_stats = cache.stats();
    drop(cache);

    let args = ["--second-process".as_ref(), dir.as_os_str()];
    let second = Report::run("second process", &args)?;
    let disk_step = second.step()?;

    println!(
        "{:<40} {:>4}  {:<21} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "step", "proc", "program came from", "lookup", "launch", "total", "vs plain", "vs cold"
    );
    let rows = [
        (
            "0. plain build + first launch, no cache",
            "0",
            "compiled from source",
            plain,
        ),
        (
            "1. first lookup (cold) + first launch",
            "1",
            "compiled from source",
            cold_step,
        ),
        (
            "2. same lookup again + launch",
            "1",
            "memory (L1)",
            hit_step,
        ),
        (
            "3. new process: lookup + first launch",
            "2",
            "disk (L2) binary",
            disk_step,
        ),
    ];
    for (step, process, from, time) in rows {
        let ratio = |peer: Step| peer.total().as_secs_f64() / time.total().as_secs_f64();
        println!(
            "{step:<40} {process:>4}  {from:<21} {:>10} {:>10} {:>10} {:>8.2}x {:>8.2}x",
            format_duration(time.lookup),
            format_duration(time.launch),
            format_duration(time.total()),
            ratio(plain),
            ratio(cold_step),
        );
    }
    println!("(\"vs\": that step's total over this one's; above 1 is faster)");
    println!("(the memory hit is the mean of {HIT_LOOKUPS} lookups; its launch is the program's");
    println!(" second, its work-group code compiled by the first)");
    println!();
    println!(
        "{:<34} {:>10} {:>10}",
        "cache statistics", "process 1", "process 2"
    );
    for (name, first) in stat_rows(&first_stats) {
        println!("{name:<34} {first:>10} {:>10}", second.value(name)?);
    }
    println!();
    println!("every program was run: {N}x{N} results matched the CPU");
    Ok(())
}

fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}
