//! The kcache demo: compiles a real OpenCL kernel through the cache, finds it again in memory,
//! then starts a fresh process that loads the program binary from disk; every program is run
//! and its output checked against the CPU. Prints the timings and cache statistics.
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

use kcache::backend::opencl::{DeviceIdentity, OpenClCache, OpenClOptions, OpenClStats, Program};
use kcache::disk::{DiskCache, DiskConfig};
use kcache_testkit::opencl::{Context, KernelArg, run_kernel};

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
    let disk = DiskCache::open(DiskConfig::in_dir(dir))?;
    Ok(OpenClCache::new(OpenClOptions {
        disk: Some(Arc::new(disk)),
        ..OpenClOptions::default()
    })?)
}

/// Runs the kernel on fixed inputs and compares every element with the CPU's product.
fn run_and_check(context: &Context, program: &Program) -> Result<(), Error> {
    let a: Vec<f32> = (0..N * N).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..N * N).map(|i| ((i * 5) % 11) as f32 * 0.5).collect();
    let mut c = vec![0.0f32; N * N];
    let mut args = [
        KernelArg::Floats(&mut c),
        KernelArg::Input(&a),
        KernelArg::Input(&b),
        KernelArg::Int(N as i32),
    ];
    run_kernel(context, program, "matmul", &mut args, N * N)?;
    for row in 0..N {
        for col in 0..N {
            let expected: f32 = (0..N).map(|k| a[row * N + k] * b[k * N + col]).sum();
            let got = c[row * N + col];
            // Small integers and halves: every partial sum is exact in f32.
            if got != expected {
                return Err(format!("c[{row}][{col}] is {got}, expected {expected}").into());
            }
        }
    }
    Ok(())
}

/// The fresh process: nothing in memory, the binary on disk. Reports `key=value` lines.
fn second_process(dir: &Path) -> Result<(), Error> {
    let context = Context::first_device()?;
    let cache = open_cache(dir)?;
    let start = Instant::now();
    let lease = cache.find_or_build(context.context(), context.device(), &[SOURCE], OPTIONS)?;
    let elapsed = start.elapsed();
    run_and_check(&context, lease.value())?;
    println!("time_ns={}", elapsed.as_nanos());
    print_stats(&cache.stats());
    Ok(())
}

fn print_stats(s: &OpenClStats) {
    for (name, value) in stat_rows(s) {
        println!("{name}={value}");
    }
}

fn stat_rows(s: &OpenClStats) -> [(&'static str, u64); 8] {
    [
        ("compiled from source", s.source_builds),
        ("loaded from disk binary", s.binary_loads),
        ("memory hits", s.memory.hits),
        ("memory misses", s.memory.misses),
        ("disk hits", s.disk_hits),
        ("disk misses", s.disk_misses),
        ("binaries rejected", s.binaries_rejected),
        ("programs in memory", s.memory.entries),
    ]
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

    let cache = open_cache(&dir)?;
    let start = Instant::now();
    let cold = cache.find_or_build(context.context(), context.device(), &[SOURCE], OPTIONS)?;
    let cold_time = start.elapsed();
    run_and_check(&context, cold.value())?;
    drop(cold);

    let start = Instant::now();
    for _ in 0..HIT_LOOKUPS {
        let hit = cache.find_or_build(context.context(), context.device(), &[SOURCE], OPTIONS)?;
        std::hint::black_box(hit.value().raw());
    }
    let hit_time = start.elapsed() / HIT_LOOKUPS;
    let hit = cache.find_or_build(context.context(), context.device(), &[SOURCE], OPTIONS)?;
    run_and_check(&context, hit.value())?;
    drop(hit);
    let first_stats = cache.stats();
    drop(cache);

    let output = Command::new(std::env::current_exe()?)
        .arg("--second-process")
        .arg(&dir)
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "the second process failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let report = String::from_utf8(output.stdout)?;
    let value = |name: &str| -> Result<u64, Error> {
        report
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| format!("the second process did not report {name}"))?
            .parse()
            .map_err(Into::into)
    };
    let disk_time = Duration::from_nanos(value("time_ns")?);

    println!(
        "{:<34} {:>7}  {:<22} {:>12}  {:>12}",
        "step", "process", "program came from", "time", "vs cold"
    );
    let rows = [
        (
            "1. first lookup (cold)",
            1,
            "compiled from source",
            cold_time,
        ),
        ("2. same lookup again", 1, "memory (L1)", hit_time),
        (
            "3. same lookup, new process",
            2,
            "disk (L2) binary",
            disk_time,
        ),
    ];
    for (step, process, from, time) in rows {
        let speedup = cold_time.as_secs_f64() / time.as_secs_f64().max(1e-12);
        println!(
            "{step:<34} {process:>7}  {from:<22} {:>12}  {:>11}x",
            format_duration(time),
            thousands(speedup.round() as u64)
        );
    }
    println!("(the memory hit is the mean of {HIT_LOOKUPS} lookups)");
    println!();
    println!(
        "{:<34} {:>10} {:>10}",
        "cache statistics", "process 1", "process 2"
    );
    for (name, first) in stat_rows(&first_stats) {
        println!("{name:<34} {first:>10} {:>10}", value(name)?);
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

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
