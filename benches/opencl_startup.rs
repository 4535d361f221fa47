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
use kcache::disk::{DiskCache, DiskConfig};
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
                    "__kernel void mix(__global float *y) {{\n\
                     uint v = get_global_id(0);\n\
                     v ^= v >> 7; v *= 0x9E3779B1u; v += {k}u;\n\
                     y[get_global_id(0)] = (float)(v & 255u);\n}}\n"
                ),
                options: "",
                kernel: "mix",
                matmul: false,
            })
            .collect(),
        other => panic!("unknown workload {other}"),
    }
}

/// `mix`'s output for work item `i` of program `k`.
fn mixed(i: u32, k: u32) -> f32 {
    let mut v = i;
    v ^= v >> 7;
    v = v.wrapping_mul(0x9E37_79B1).wrapping_add(k);
    (v & 255) as f32
}

/// The child: builds every program (timed), launches and checks each, prints the build time.
fn child(workload_name: &str, cache: &str) {
    let programs = workload(workload_name);
    let context = Context::first_device().unwrap();
    let cache = (cache != "plain").then(|| {
        let disk = DiskCache::open(DiskConfig::in_dir(cache)).unwrap();
        OpenClCache::new(OpenClOptions {
            disk: Some(disk.into()),
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
    for (k, (program, p)) in built.iter().zip(&programs).enumerate() {
        launch_and_check(&context, program.as_ref(), p, k as u32);
    }
    println!("build_us={}", build.as_micros());
    drop(built);
    drop(cache);
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
        assert!((0..ITEMS as u32).all(|i| y[i as usize] == mixed(i, k)));
    }
}

/// One run of a workload in a new process: (build, whole process).
fn run(workload: &str, home: &Path, cache: &str, pocl_cache: bool) -> (Duration, Duration) {
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
    let build_us: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("build_us="))
        .unwrap_or_else(|| panic!("no build time in {out}"))
        .parse()
        .unwrap();
    (Duration::from_micros(build_us), whole)
}

const COLUMNS: [&str; 4] = [
    "original",
    "kcache cold",
    "kcache warm",
    "PoCL's own cache, warm",
];

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
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
    let rounds: usize = std::env::var(ROUNDS).map_or(3, |r| r.parse().unwrap());
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let workloads: Vec<&str> = ["matmul5", "programs100", "demo"]
        .into_iter()
        .filter(|w| named.is_empty() || named.iter().any(|n| n == w))
        .collect();
    println!("| | {} |", COLUMNS.join(" | "));
    println!("|---|{}", "---:|".repeat(COLUMNS.len()));
    for workload in workloads {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        // Fills PoCL's own cache for its column.
        run(workload, &home, "plain", true);
        let mut runs: Vec<Vec<(Duration, Duration)>> = vec![Vec::new(); COLUMNS.len()];
        for round in 0..rounds {
            let dir = tmp.path().join(format!("kcache-{round}"));
            let dir = dir.to_str().unwrap();
            runs[0].push(run(workload, &home, "plain", false));
            runs[1].push(run(workload, &home, dir, false));
            runs[2].push(run(workload, &home, dir, false));
            runs[3].push(run(workload, &home, "plain", true));
        }
        let medians: Vec<(Duration, Duration)> = runs
            .into_iter()
            .map(|r| {
                let (builds, wholes): (Vec<_>, Vec<_>) = r.into_iter().unzip();
                (median(builds), median(wholes))
            })
            .collect();
        let original = medians[0].1.as_secs_f64();
        let cells: Vec<String> = medians
            .iter()
            .map(|&(build, whole)| {
                let ratio = whole.as_secs_f64() / original;
                format!("{} / {} ({ratio:.2}×)", format(build), format(whole))
            })
            .collect();
        println!(
            "| {workload}: build / whole process | {} |",
            cells.join(" | ")
        );
    }
    println!("\nmedians of {rounds} interleaved rounds; (×): whole process over the original's");
}
