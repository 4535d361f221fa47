//! Whole OpenCL programs as users run them, on the machine's OpenCL implementation (PoCL):
//! each run is a new process that builds its programs, launches each once (with an explicit
//! work-group size, for which PoCL compiles code at the first launch), checks every output and
//! exits, freeing its cache. Three workloads:
//!
//! - `matmul5`: five matrix-multiply programs, as in an exercise that tries five variants;
//! - `programs100`: a hundred small programs built at start-up, then launched;
//! - `demo`: the one program of `examples/demo.rs`.
//!
//! and four ways of running them, interleaved round by round:
//!
//! - `original`: `clCreateProgramWithSource` + `clBuildProgram`, PoCL's kernel cache off;
//! - `kcache cold`: through an `OpenClCache` on an empty directory, PoCL's cache off;
//! - `kcache warm`: the same directory again, PoCL's cache off;
//! - `PoCL's own cache, warm`: the original program with PoCL's cache on, after one run that
//!   filled it.
//!
//! Every process gets PoCL's own settings but for `POCL_KERNEL_CACHE`, and one home directory
//! per workload (`XDG_CACHE_HOME`, where PoCL keeps its directories), so that the user's PoCL
//! cache neither helps nor grows. It prints the medians as the table of `docs/benchmarks.md`:
//! the build (every lookup) and the whole process (start to exit, as the parent sees it).
//!
//! ```text
//! cargo bench --bench opencl_startup                      # every workload, 3 rounds
//! KCACHE_BENCH_ROUNDS=5 cargo bench --bench opencl_startup -- matmul5 demo
//! ```

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kcache::backend::opencl::{OpenClCache, OpenClOptions, cl_program};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::{BuiltProgram, Context, KernelArg, Matmul, run_kernel_in_groups};
use kcache_testkit::successful_stdout;

const CHILD_WORKLOAD: &str = "KCACHE_BENCH_STARTUP_WORKLOAD";
/// `plain` or a kcache directory.
const CHILD_CACHE: &str = "KCACHE_BENCH_STARTUP_CACHE";
const ROUNDS: &str = "KCACHE_BENCH_ROUNDS";

/// Rows of the matrices of `matmul5` and `demo`.
const N: usize = 64;
/// Work items of each `programs100` kernel, and their work-group size.
const ITEMS: usize = 256;
const GROUP: usize = 16;

/// A program of a workload: its source, options, kernel, and how to launch and check it.
struct Program {
    source: String,
    options: &'static str,
    kernel: &'static str,
    matmul: bool,
}

fn workload(name: &str) -> Vec<Program> {
    let matmul = |unroll: usize, options| Program {
        source: format!(
            "__kernel void matmul(__global float *c, __global const float *a,\n\
             __global const float *b, int n) {{\n\
             int row = get_global_id(0) / n, col = get_global_id(0) % n;\n\
             float sum = 0.0f;\n\
             #pragma unroll {unroll}\n\
             for (int k = 0; k < n; k++) sum += a[row * n + k] * b[k * n + col];\n\
             c[row * n + col] = sum;\n}}\n"
        ),
        options,
        kernel: "matmul",
        matmul: true,
    };
    match name {
        "matmul5" => (1..=5).map(|u| matmul(u, "")).collect(),
        "demo" => vec![matmul(1, "-cl-mad-enable")],
        "programs100" => (0..100)
            .map(|k| Program {
                source: format!(
                    "__kernel void scramble(__global float *y) {{\n\
                     uint v = get_global_id(0);\n\
                     v ^= v >> 7; v *= 0x9E3779B1u; v += {k}u;\n\
                     y[get_global_id(0)] = (float)(v & 255u);\n}}\n"
                ),
                options: "",
                kernel: "scramble",
                matmul: false,
            })
            .collect(),
        other => panic!("unknown workload {other}"),
    }
}

/// `scramble`'s output for work item `i` of program `k`.
fn scrambled(i: u32, k: u32) -> f32 {
    let mut v = i;
    v ^= v >> 7;
    v = v.wrapping_mul(0x9E37_79B1).wrapping_add(k);
    (v & 255) as f32
}

/// The child: builds every program, launches and checks each, frees them and the cache, and
/// prints how long each of the three took.
fn child(workload_name: &str, cache: &str) {
    let programs = workload(workload_name);
    let context = Context::first_device().unwrap();
    let cache = (cache != "plain").then(|| {
        let disk = Persistence::open(PersistenceConfig::in_dir(cache)).unwrap();
        OpenClCache::new(OpenClOptions {
            persistence: Some(disk.into()),
            ..OpenClOptions::default()
        })
        .unwrap()
    });
    let started = Instant::now();
    let built: Vec<Box<dyn BuiltProgram>> = programs
        .iter()
        .map(|p| -> Box<dyn BuiltProgram> {
            let sources = [p.source.as_str()];
            match &cache {
                Some(cache) => Box::new(
                    cache
                        .find_or_build_program(
                            context.context(),
                            context.device(),
                            &sources,
                            p.options,
                        )
                        .unwrap(),
                ),
                None => Box::new(context.build_uncached(&sources, p.options).unwrap()),
            }
        })
        .collect();
    let build = started.elapsed();
    let started = Instant::now();
    for (k, (program, p)) in built.iter().zip(&programs).enumerate() {
        launch_and_check(&context, program.as_ref(), p, k as u32);
    }
    let launch = started.elapsed();
    let started = Instant::now();
    drop(built);
    drop(cache);
    let free = started.elapsed();
    println!(
        "build_us={} launch_us={} free_us={}",
        build.as_micros(),
        launch.as_micros(),
        free.as_micros()
    );
}

/// A program handle borrowed from a built program of either kind.
struct Handle(cl_program);

impl BuiltProgram for Handle {
    fn raw(&self) -> cl_program {
        self.0
    }
}

fn launch_and_check(context: &Context, program: &dyn BuiltProgram, p: &Program, k: u32) {
    let program = Handle(program.raw());
    if p.matmul {
        let mut m = Matmul::new(N);
        run_kernel_in_groups(
            context,
            &program,
            p.kernel,
            &mut m.args(),
            N * N,
            Some(GROUP),
        )
        .unwrap();
        m.check().unwrap();
    } else {
        let mut y = vec![0.0f32; ITEMS];
        let mut args = [KernelArg::Floats(&mut y)];
        run_kernel_in_groups(context, &program, p.kernel, &mut args, ITEMS, Some(GROUP)).unwrap();
        assert!((0..ITEMS as u32).all(|i| y[i as usize] == scrambled(i, k)));
    }
}

/// How long a run's parts took.
#[derive(Clone, Copy)]
struct Run {
    build: Duration,
    launch: Duration,
    /// Freeing the programs and the cache (which writes what it held back).
    free: Duration,
    whole: Duration,
}

/// One run of a workload in a new process.
fn run(workload: &str, home: &Path, cache: &str, pocl_cache: bool) -> Run {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KCACHE_") {
            cmd.env_remove(name);
        }
    }
    cmd.env(CHILD_WORKLOAD, workload)
        .env(CHILD_CACHE, cache)
        .env("XDG_CACHE_HOME", home)
        .env_remove("POCL_CACHE_DIR")
        .env("POCL_KERNEL_CACHE", if pocl_cache { "1" } else { "0" });
    let started = Instant::now();
    let out = successful_stdout(workload, &mut cmd);
    let whole = started.elapsed();
    let line = out
        .lines()
        .find(|l| l.starts_with("build_us="))
        .unwrap_or_else(|| panic!("no times in {out}"));
    let part = |name: &str| {
        let value = line
            .split(' ')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix("_us="))
            .unwrap_or_else(|| panic!("no {name} in {line}"));
        Duration::from_micros(value.parse().unwrap())
    };
    Run {
        build: part("build"),
        launch: part("launch"),
        free: part("free"),
        whole,
    }
}

const COLUMNS: [&str; 4] = [
    "original",
    "kcache cold",
    "kcache warm",
    "PoCL's own cache, warm",
];

/// The median of each part of `runs`.
fn median(runs: &[Run]) -> Run {
    let of = |part: fn(&Run) -> Duration| {
        let mut values: Vec<Duration> = runs.iter().map(part).collect();
        values.sort();
        values[values.len() / 2]
    };
    Run {
        build: of(|r| r.build),
        launch: of(|r| r.launch),
        free: of(|r| r.free),
        whole: of(|r| r.whole),
    }
}

fn format(d: Duration) -> String {
    if d >= Duration::from_secs(10) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn main() {
    if let Ok(workload) = std::env::var(CHILD_WORKLOAD) {
        return child(&workload, &std::env::var(CHILD_CACHE).unwrap());
    }
    // Without a device (`cargo test --all-targets` on a bare machine), this says so and
    // measures nothing.
    if Context::for_test().is_none() {
        return;
    }
    let rounds: usize = std::env::var(ROUNDS).map_or(3, |r| r.parse().unwrap());
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let workloads: Vec<&str> = ["matmul5", "programs100", "demo"]
        .into_iter()
        .filter(|w| named.is_empty() || named.iter().any(|n| n == w))
        .collect();
    let mut table = vec![
        format!("| | {} |", COLUMNS.join(" | ")),
        format!("|---|{}", "---:|".repeat(COLUMNS.len())),
    ];
    let mut parts = table.clone();
    for workload in workloads {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        // Fills PoCL's own cache for its column.
        run(workload, &home, "plain", true);
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); COLUMNS.len()];
        for round in 0..rounds {
            let dir = tmp.path().join(format!("kcache-{round}"));
            let dir = dir.to_str().unwrap();
            runs[0].push(run(workload, &home, "plain", false));
            runs[1].push(run(workload, &home, dir, false));
            runs[2].push(run(workload, &home, dir, false));
            runs[3].push(run(workload, &home, "plain", true));
        }
        let medians: Vec<Run> = runs.iter().map(|r| median(r)).collect();
        let original = medians[0].whole.as_secs_f64();
        let cells = medians.iter().map(|r| {
            let ratio = r.whole.as_secs_f64() / original;
            format!("{} / {} ({ratio:.2}×)", format(r.build), format(r.whole))
        });
        let cells: Vec<String> = cells.collect();
        table.push(format!(
            "| {workload}: build / whole process | {} |",
            cells.join(" | ")
        ));
        let cells = medians.iter().map(|r| {
            format!(
                "{} / {} / {}",
                format(r.build),
                format(r.launch),
                format(r.free)
            )
        });
        let cells: Vec<String> = cells.collect();
        parts.push(format!(
            "| {workload}: build / launches / free | {} |",
            cells.join(" | ")
        ));
        println!("{workload} done");
    }
    println!("\n{}\n\n{}", table.join("\n"), parts.join("\n"));
    println!("\nmedians of {rounds} interleaved rounds; (×): whole process over the original's");
}
