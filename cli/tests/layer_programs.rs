//! kcache's OpenCL layer under unmodified programs, through `kcache run` (and `OPENCL_LAYERS`
//! set by hand): pyopencl's published examples and clinfo give the same output with and
//! without it, and their builds come from the cache once it holds them. Real processes on PoCL.
//!
//! The layer library must be built next to the command (`cargo build --workspace`, which the
//! test command's `cargo test --workspace` does).

mod common;
use common::python;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kcache::disk::DirectoryCounters;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::needs;

/// pyopencl's examples as Debian installs them (python-pyopencl-doc).
const EXAMPLES: &str = "/usr/share/doc/python-pyopencl-doc/examples";

/// One cache directory and PoCL kernel cache per test.
struct Setup {
    _temp: tempfile::TempDir,
    dir: PathBuf,
    pocl: PathBuf,
    /// The layer's library.
    layer: PathBuf,
}

impl Setup {
    /// For programs of the system's Python with PyOpenCL; `None` when the machine lacks it,
    /// the layer or an OpenCL device (the test skipped).
    fn new() -> Option<Setup> {
        Setup::for_program(python())
    }

    /// For runs of `program`; `None` when the machine lacks it, the layer or an OpenCL device.
    fn for_program(program: &str) -> Option<Setup> {
        let layer = common::layer_can_run(program)?;
        let temp = tempfile::tempdir().unwrap();
        let [dir, pocl] = ["kcache", "pocl"].map(|name| temp.path().join(name));
        Some(Setup {
            _temp: temp,
            dir,
            pocl,
            layer,
        })
    }

    /// `PROGRAM ARGS` as is (`layer` false) or under `kcache run`, with the test's
    /// directories, pyopencl's own binary cache off (its hits would be binaries, which the
    /// layer passes through) and `extra` variables.
    fn command(&self, layer: bool, program: &[&str], extra: &[(&str, &str)]) -> Command {
        let mut command = if layer {
            let mut command = Command::new(env!("CARGO_BIN_EXE_kcache"));
            command.arg("run").arg("--");
            command.args(program);
            command
        } else {
            let mut command = Command::new(program[0]);
            command.args(&program[1..]);
            command
        };
        common::pocl_clean(&mut command)
            .env("KCACHE_DIR", &self.dir)
            .env("POCL_CACHE_DIR", &self.pocl)
            .envs(extra.iter().copied());
        command
    }

    fn run(&self, layer: bool, program: &[&str], extra: &[(&str, &str)]) -> Output {
        let output = self.command(layer, program, extra).output().unwrap();
        assert!(
            output.status.success(),
            "{program:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// The directory's counters, summed over every process that used it.
    fn counters(&self) -> DirectoryCounters {
        let cache = Persistence::open(PersistenceConfig::in_dir(&self.dir)).unwrap();
        cache.directory_stats().unwrap().counters
    }

    /// Entry files in the directory (none if it does not exist).
    fn entries(&self) -> usize {
        if !self.dir.exists() {
            return 0;
        }
        Persistence::open(PersistenceConfig::in_dir(&self.dir))
            .unwrap()
            .entries()
            .unwrap()
            .len()
    }
}

/// A pyopencl example, unchanged, with numpy's generator seeded so that its output is the
/// same from run to run; `None` when it is not installed (the test skipped).
fn example(name: &str) -> Option<Vec<String>> {
    let path = format!("{EXAMPLES}/{name}");
    needs::met(needs::file(
        &path,
        "apt install python-pyopencl-doc; scripts/test installs it",
    ))?;
    let script = format!(
        "import numpy, sys; numpy.random.seed(0); sys.argv = [{path:?}]; \
         exec(compile(open({path:?}).read(), {path:?}, 'exec'))"
    );
    Some(vec![python().into(), "-c".into(), script])
}

fn args(program: &[String]) -> Vec<&str> {
    program.iter().map(String::as_str).collect()
}

/// Without the layer, cold with it, warm with it: the same output; the cold run compiles, the
/// warm one compiles nothing and reads every program from disk.
fn same_output_cold_and_warm(program: &[&str], programs: u64) {
    let Some(setup) = Setup::for_program(program[0]) else {
        return;
    };
    let compiled = same_summary_cold_and_warm(&setup, program, &[], |out| out.stdout.clone());
    assert_eq!(compiled, programs, "compiles of the cold run");
    assert_eq!(setup.entries() as u64, programs);
}

/// Runs `program` without the layer, then cold and warm with it, each run with the variables
/// `fresh` set to an empty directory of its own: the same `summary` of the three outputs; the
/// warm run compiles nothing, passes nothing through, and every build it asks for comes from
/// the disk, each entry once at least. The cold run's compiles, at least one.
fn same_summary_cold_and_warm<T: PartialEq + std::fmt::Debug>(
    setup: &Setup,
    program: &[&str],
    fresh: &[&str],
    summary: impl Fn(&Output) -> T,
) -> u64 {
    let runs = tempfile::tempdir().unwrap();
    let run = |layer: bool, n: usize| {
        let dirs: Vec<(String, String)> = fresh
            .iter()
            .map(|name| {
                let dir = runs.path().join(format!("{n}-{name}"));
                std::fs::create_dir(&dir).unwrap();
                (name.to_string(), dir.to_string_lossy().into_owned())
            })
            .collect();
        let extra: Vec<(&str, &str)> = dirs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        setup.run(layer, program, &extra)
    };
    let plain = summary(&run(false, 0));
    assert_eq!(setup.entries(), 0, "nothing is cached without the layer");
    let cold = run(true, 1);
    assert_eq!(summary(&cold), plain, "cold output of {program:?}");
    let after_cold = setup.counters();
    assert!(
        after_cold.builds > 0,
        "the cold run compiled: {after_cold:?}"
    );
    let warm = run(true, 2);
    assert_eq!(summary(&warm), plain, "warm output of {program:?}");
    let after_warm = setup.counters();
    assert_eq!(
        after_warm.builds, after_cold.builds,
        "the warm run compiled nothing: {after_warm:?}"
    );
    // Every build the cold run asked for is read from disk now. The cold run's compiles may
    // include siblings (PoCL: a second context of the process asking for an entry still held
    // back has one built, docs/opencl.md), which are compiles but not builds asked for.
    let asked = after_warm.disk_hits - after_cold.disk_hits;
    assert!(
        asked >= setup.entries() as u64 && asked <= after_cold.builds + after_cold.disk_hits,
        "the warm run read from disk every build it asked for: {after_cold:?} {after_warm:?}"
    );
    assert_eq!(after_warm.passed_through, 0, "{after_warm:?}");
    after_cold.builds
}

#[test]
fn pyopencl_demo_runs_the_same_and_warm_compiles_nothing() {
    let Some(program) = example("demo.py") else {
        return;
    };
    same_output_cold_and_warm(&args(&program), 1);
}

#[test]
fn pyopencl_elementwise_demo_runs_the_same_and_warm_compiles_nothing() {
    let Some(program) = example("demo_elementwise.py") else {
        return;
    };
    same_output_cold_and_warm(&args(&program), 3);
}

#[test]
fn pyopencl_array_demo_runs_the_same_and_warm_compiles_nothing() {
    let Some(program) = example("demo_array.py") else {
        return;
    };
    same_output_cold_and_warm(&args(&program), 2);
}

#[test]
fn clinfo_runs_the_same_under_the_layer() {
    // clinfo builds one program per device to ask for a kernel's work-group figures.
    same_output_cold_and_warm(&["clinfo"], 1);
}

#[test]
fn opencl_layers_set_by_hand_works_as_kcache_run() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let Some(program) = example("demo.py") else {
        return;
    };
    let plain = setup.run(false, &args(&program), &[]);
    let layers = setup.layer.to_str().unwrap();
    let by_hand = setup.run(false, &args(&program), &[("OPENCL_LAYERS", layers)]);
    assert_eq!(by_hand.stdout, plain.stdout);
    assert_eq!(setup.counters().builds, 1);
    assert_eq!(setup.entries(), 1);
}

#[test]
fn kcache_disable_passes_every_build_through() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let Some(program) = example("demo_elementwise.py") else {
        return;
    };
    let plain = setup.run(false, &args(&program), &[]);
    let disabled = setup.run(true, &args(&program), &[("KCACHE_DISABLE", "1")]);
    assert_eq!(disabled.stdout, plain.stdout);
    assert_eq!(setup.entries(), 0, "no entry written with KCACHE_DISABLE=1");
    assert!(!setup.dir.exists(), "the directory is not even created");
}

#[test]
fn six_processes_starting_at_once_compile_once() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let Some(program) = example("demo.py") else {
        return;
    };
    let plain = setup.run(false, &args(&program), &[]);
    let children: Vec<_> = (0..6)
        .map(|_| {
            setup
                .command(true, &args(&program), &[])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout, plain.stdout);
    }
    let counters = setup.counters();
    // One compile. On PoCL a process that waits for it may cost one more, the sibling build
    // whose binary the waiting processes are given (docs/node.md); none when the first process
    // reached its flush before it saw the wait, and wrote its own program's binary then.
    assert!(
        counters.builds == 1 || (counters.lock_waits > 0 && counters.builds == 2),
        "one compile for six processes: {counters:?}"
    );
    assert_eq!(counters.disk_hits, 5, "the others read it: {counters:?}");
    assert_eq!(setup.entries(), 1);
}

/// What a program can see of a build: status, options, log, kernels, reference counts, the
/// kernel's program, its source; and a launch's result.
const OBSERVE: &str = r#"
import sys, numpy, pyopencl as cl
source = sys.argv[1]
options = sys.argv[2].split()
platform = cl.get_platforms()[0]
device = platform.get_devices()[0]
def build(context):
    program = cl.Program(context, source)
    try:
        program.build(options=options)
    except cl.RuntimeError as e:
        print("build failed:", e.code, str(e).strip().splitlines()[0])
        print("status:", program.get_build_info(device, cl.program_build_info.STATUS))
        print("log:", program.get_build_info(device, cl.program_build_info.LOG).strip())
        return None
    print("status:", program.get_build_info(device, cl.program_build_info.STATUS))
    print("options:", program.get_build_info(device, cl.program_build_info.OPTIONS))
    print("kernels:", program.get_info(cl.program_info.KERNEL_NAMES))
    print("num kernels:", program.get_info(cl.program_info.NUM_KERNELS))
    print("source kept:", program.get_info(cl.program_info.SOURCE) == source)
    print("binaries:", len(program.get_info(cl.program_info.BINARIES)),
          min(program.get_info(cl.program_info.BINARY_SIZES)) > 0)
    print("refcount:", program.get_info(cl.program_info.REFERENCE_COUNT))
    kernel = cl.Kernel(program, "twice")
    print("kernel program:", kernel.get_info(cl.kernel_info.PROGRAM) == program)
    print("refcount with a kernel:", program.get_info(cl.program_info.REFERENCE_COUNT))
    queue = cl.CommandQueue(context)
    data = numpy.arange(16, dtype=numpy.float32)
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
    kernel(queue, data.shape, None, buffer)
    cl.enqueue_copy(queue, data, buffer)
    print("result:", data.tolist())
    return program
contexts = int(sys.argv[3])
kept = [build(cl.Context([device])) for _ in range(contexts)]
"#;

const TWICE: &str = "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }";

fn observe(source: &str, options: &str, contexts: usize) -> Vec<String> {
    vec![
        python().into(),
        "-c".into(),
        OBSERVE.into(),
        source.into(),
        options.into(),
        contexts.to_string(),
    ]
}

#[test]
fn what_a_program_sees_of_a_served_build_is_the_drivers() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let program = observe(TWICE, "-cl-fast-relaxed-math -DUNUSED=1", 1);
    let plain = setup.run(false, &args(&program), &[]);
    let text = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(text.contains("kernel program: True"), "{text}");
    let cold = setup.run(true, &args(&program), &[]);
    assert_eq!(String::from_utf8_lossy(&cold.stdout), text);
    let warm = setup.run(true, &args(&program), &[]);
    assert_eq!(String::from_utf8_lossy(&warm.stdout), text);
    assert_eq!(setup.counters().builds, 1, "the warm run was served");
}

#[test]
fn the_same_source_in_two_contexts_is_served_in_both() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let program = observe(TWICE, "", 2);
    let plain = setup.run(false, &args(&program), &[]);
    let cold = setup.run(true, &args(&program), &[]);
    assert_eq!(cold.stdout, plain.stdout);
    let after_cold = setup.counters();
    let warm = setup.run(true, &args(&program), &[]);
    assert_eq!(warm.stdout, plain.stdout);
    let after_warm = setup.counters();
    assert_eq!(
        after_warm.builds, after_cold.builds,
        "the warm run compiled nothing"
    );
    assert_eq!(
        after_warm.disk_hits - after_cold.disk_hits,
        2,
        "one read per context"
    );
}

/// `output` with the names of PoCL's temporary source files (`tempfile_XXXXXX.cl`, different
/// in every build) made alike.
fn without_temporary_names(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let mut parts = text.split("tempfile_");
    let mut out = parts.next().unwrap_or_default().to_owned();
    for part in parts {
        out.push_str("tempfile_*");
        out.push_str(part.trim_start_matches(|c: char| c.is_ascii_alphanumeric()));
    }
    out
}

#[test]
fn a_failing_build_gives_the_drivers_error_and_log() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let broken = "__kernel void twice(__global float *x) { x[get_global_id(0)] *= undefined; }";
    let program = observe(broken, "", 1);
    let plain = setup.run(false, &args(&program), &[]);
    let text = without_temporary_names(&plain.stdout);
    assert!(text.contains("build failed: -11"), "{text}");
    assert!(
        text.contains("undeclared identifier 'undefined'"),
        "the log: {text}"
    );
    let layered = setup.run(true, &args(&program), &[]);
    assert_eq!(without_temporary_names(&layered.stdout), text);
    assert_eq!(setup.entries(), 0, "a failed build is not stored");
}

#[test]
fn kcache_run_reports_what_it_saved_and_keeps_the_exit_status() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let Some(program) = example("demo.py") else {
        return;
    };
    let run = |setup: &Setup| {
        let mut command = setup.command(false, &[env!("CARGO_BIN_EXE_kcache"), "run"], &[]);
        command.arg("--stats").arg("--").args(&program);
        command.output().unwrap()
    };
    let cold = run(&setup);
    assert!(cold.status.success());
    let cold_report = String::from_utf8_lossy(&cold.stderr).into_owned();
    assert!(
        cold_report.contains("0 program builds served from the cache"),
        "{cold_report}"
    );
    assert!(cold_report.contains("1 compiled"), "{cold_report}");
    let warm = run(&setup);
    let warm_report = String::from_utf8_lossy(&warm.stderr).into_owned();
    assert!(
        warm_report.contains("1 program builds served from the cache (1 from disk"),
        "{warm_report}"
    );
    assert!(warm_report.contains("0 compiled"), "{warm_report}");

    let status = setup
        .command(true, &["sh", "-c", "exit 7"], &[])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7));
    let layers = setup
        .run(true, &["sh", "-c", "echo \"$OPENCL_LAYERS\""], &[])
        .stdout;
    assert_eq!(
        String::from_utf8_lossy(&layers).trim(),
        setup.layer.to_str().unwrap()
    );
}

/// Compile once per cluster: two nodes (a cache directory and a PoCL cache each) share one
/// real `redis-server` and an operator key; the program's builds on node A go to the store,
/// and node B, with an empty directory, compiles nothing and gives the same output.
#[cfg(feature = "remote")]
#[test]
fn a_second_node_compiles_nothing_with_the_remote_tier() {
    use kcache_testkit::redis::RedisServer;

    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("operator.key");
    kcache_testkit::write_key_file(&key_file, &[7; 32]);
    let remote = [
        ("KCACHE_REMOTE_URL", url.as_str()),
        ("KCACHE_KEY_FILE", key_file.to_str().unwrap()),
    ];
    let Some(program) = example("demo_elementwise.py") else {
        return;
    };
    let (Some(a), Some(b)) = (Setup::new(), Setup::new()) else {
        return;
    };
    let plain = a.run(false, &args(&program), &[]);

    let on_a = a.run(true, &args(&program), &remote);
    assert_eq!(on_a.stdout, plain.stdout, "node A's output");
    let counters_a = a.counters();
    assert_eq!(counters_a.builds, 3, "node A compiled: {counters_a:?}");
    assert_eq!(counters_a.remote_hits, 0, "{counters_a:?}");

    let on_b = b.run(true, &args(&program), &remote);
    assert_eq!(on_b.stdout, plain.stdout, "node B's output");
    let counters_b = b.counters();
    assert_eq!(
        counters_b.builds, 0,
        "node B compiled nothing: {counters_b:?}"
    );
    assert_eq!(
        counters_b.remote_hits, 3,
        "every program from the store: {counters_b:?}"
    );
    assert_eq!(b.entries(), 3, "node B keeps them on its disk too");
}

#[test]
fn the_layer_exports_only_its_two_entry_points() {
    let Some(layer) = common::layer() else {
        return;
    };
    let output = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(layer)
        .output()
        .unwrap();
    assert!(output.status.success(), "nm failed");
    let mut symbols: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().last().map(str::to_owned))
        .collect();
    symbols.sort();
    assert_eq!(symbols, ["clGetLayerInfo", "clInitLayer"]);
}

/// Builds `sys.argv[1]` programs (of five sources) in one context, makes kernels of each (one
/// by name, and its clone, kept past the program), releases them all,
/// and prints the context's reference count before and after. Each program and kernel holds
/// a reference to its context, and so does each served build the layer keeps for a program.
const MANY: &str = r#"
import gc, sys, pyopencl as cl
device = cl.get_platforms()[0].get_devices()[0]
context = cl.Context([device])
count = cl.context_info.REFERENCE_COUNT
before = context.get_info(count)
names = set()
for i in range(int(sys.argv[1])):
    name = "k%d" % (i % 5)
    source = "__kernel void %s(__global float *x) { x[0] = %d; }" % (name, i % 5)
    program = cl.Program(context, source).build()
    kernel = cl.Kernel(program, name)
    clone = kernel.clone()
    del program, kernel
    gc.collect()
    names.add(clone.get_info(cl.kernel_info.FUNCTION_NAME))
    del clone
    gc.collect()
print("kernels:", sorted(names))
print("context references:", before, context.get_info(count))
"#;

#[test]
fn what_the_layer_keeps_for_a_program_goes_with_its_release() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let program = vec![python(), "-c", MANY, "40"];
    let plain = setup.run(false, &program, &[]);
    let text = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(text.contains("context references: 1 1"), "{text}");
    let layered = setup.run(true, &program, &[]);
    assert_eq!(
        String::from_utf8_lossy(&layered.stdout),
        text,
        "the served builds and the kernels' links to their programs are released"
    );
    let counters = setup.counters();
    assert_eq!(counters.builds, 5, "{counters:?}");
    assert_eq!(counters.disk_hits, 35, "{counters:?}");
}

/// Builds `sys.argv[1]` programs of one 4 MiB source (a comment and a kernel), each kept alive
/// by a kernel only (the program itself released first), then releases the kernels, and says
/// whether the process's resident memory grew by less than half of what the sources take.
const LARGE_SOURCES: &str = r#"
import gc, sys, pyopencl as cl
def resident_mib():
    status = open("/proc/self/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024
device = cl.get_platforms()[0].get_devices()[0]
context = cl.Context([device])
source = "/*" + "x" * (4 << 20) + "*/\n__kernel void k(__global float *x) { x[0] = 1; }"
count = int(sys.argv[1])
cl.Program(context, source).build()
gc.collect()
before = resident_mib()
kernels = []
for _ in range(count):
    program = cl.Program(context, source).build()
    kernels.append(cl.Kernel(program, "k"))
    del program
del kernels
gc.collect()
print("grew by less than half the sources:", resident_mib() - before < count * 4 // 2)
"#;

#[test]
fn the_source_of_a_program_built_by_the_driver_goes_with_its_last_release() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let program = [python(), "-c", LARGE_SOURCES, "40"];
    // Large blocks straight from and back to the system, so that resident memory shows what
    // is still allocated (glibc's threshold otherwise rises after the first free).
    let malloc = ("MALLOC_MMAP_THRESHOLD_", "1048576");
    let plain = setup.run(false, &program, &[malloc]);
    let text = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert_eq!(text, "grew by less than half the sources: True\n");
    // With KCACHE_DISABLE=1 every build goes to the driver, and the kernels of a driver's build
    // hold their program without the layer seeing their releases.
    let disabled = setup.run(true, &program, &[malloc, ("KCACHE_DISABLE", "1")]);
    assert_eq!(String::from_utf8_lossy(&disabled.stdout), text, "disabled");
    let served = setup.run(true, &program, &[malloc]);
    assert_eq!(String::from_utf8_lossy(&served.stdout), text, "served");
    assert_eq!(setup.counters().builds, 1, "served, once compiled");
}

/// CLBlast's own test of its AXPY routines (Debian's clblast-tests, all precisions, results
/// checked against a reference BLAS): every line of its report the same without the layer,
/// cold and warm.
#[test]
fn clblast_xaxpy_test_passes_the_same_and_warm_compiles_nothing() {
    let program = "/usr/bin/clblast_test_xaxpy";
    let Some(setup) = Setup::for_program(program) else {
        return;
    };
    let report = |out: &Output| String::from_utf8_lossy(&out.stdout).into_owned();
    same_summary_cold_and_warm(&setup, &[program], &[], |out| {
        let text = report(out);
        assert!(text.contains("test(s) passed"), "{text}");
        assert!(!text.contains(" 0 test(s) passed"), "{text}");
        text
    });
}

/// hashcat 6.2.6 (Debian's), a three-letter mask attack on an MD5: it builds its kernels with
/// `clCompileProgram` and `clLinkProgram`, with computed `#include`s of its headers. Its own
/// kernel cache and session files go to a new directory each run, so that each run builds.
#[test]
fn hashcat_cracks_the_same_and_warm_compiles_nothing() {
    let Some(setup) = Setup::for_program("hashcat") else {
        return;
    };
    let attack = [
        "hashcat",
        "-m",
        "0",
        "-a",
        "3",
        "900150983cd24fb0d6963f7d28e17f72",
        "?l?l?l",
        "--potfile-disable",
        "--force",
        "-D",
        "1",
        "--quiet",
    ];
    let fresh = ["XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"];
    same_summary_cold_and_warm(&setup, &attack, &fresh, |out| {
        let cracked = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(cracked, "900150983cd24fb0d6963f7d28e17f72:abc");
        cracked
    });
}

/// The test files of the installed PyOpenCL's release, fetched by
/// `scripts/fetch-pyopencl-tests` (which the test command runs) into the target directory;
/// `None` when they are not there (the test skipped), with the reason the script left where
/// PyPI could not be reached.
fn pyopencl_tests() -> Option<PathBuf> {
    let target = Path::new(env!("CARGO_BIN_EXE_kcache"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("pyopencl-tests");
    let version = Command::new(python())
        .args(["-c", "import pyopencl; print(pyopencl.VERSION_TEXT)"])
        .output()
        .unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    let dir = target.join(version.trim()).join("test");
    if dir.is_dir() {
        return Some(dir);
    }
    let what = match std::fs::read_to_string(target.join("UNREACHABLE")) {
        Ok(why) => format!("PyOpenCL's test files could not be fetched: {}", why.trim()),
        Err(_) => format!("{} is missing", dir.display()),
    };
    let install = format!(
        "run scripts/fetch-pyopencl-tests {}",
        target.parent().unwrap().display()
    );
    needs::met(Err(needs::Missing::new(what, install)))
}

/// pytest on the test file `path`, the tests chosen by `select` (pytest's `-k`; all if empty).
fn pytest<'a>(path: &'a Path, select: &'a str) -> Vec<&'a str> {
    let mut program = vec![
        python(),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        path.to_str().unwrap(),
    ];
    if !select.is_empty() {
        program.extend(["-k", select]);
    }
    program
}

/// Runs PyOpenCL's test file `file` (tests chosen by `select`, pytest's `-k`) unchanged: the
/// same counts of passed, skipped and failed tests without the layer, cold and warm.
fn pyopencl_suite(file: &str, select: &str) {
    let Some(setup) = Setup::new() else {
        return;
    };
    let Some(dir) = pyopencl_tests() else {
        return;
    };
    let path = dir.join(file);
    let program = pytest(&path, select);
    same_summary_cold_and_warm(&setup, &program, &[], |out| {
        let text = String::from_utf8_lossy(&out.stdout);
        // The summary line: "41 passed, 1 skipped, 2 xfailed, 9 warnings in 7.52s".
        let line = text
            .lines()
            .rev()
            .find(|line| line.contains(" passed"))
            .unwrap_or_else(|| panic!("no summary: {text}"));
        let line = line.trim_matches(|c| c == '=' || c == ' ');
        let counts = line.split(" in ").next().unwrap_or_default().to_string();
        assert!(
            !counts.split(", ").any(|count| count.ends_with(" failed")),
            "{text}"
        );
        counts
    });
}

/// PyOpenCL's `test_can_build_and_run_binary` launches a kernel and returns without waiting
/// for it, so the layer publishes the binaries it holds back (at a program's release, and at
/// exit) while PoCL may still be compiling that launch: the two at once aborted one run in two
/// on a busy machine. Fifty runs, two at a time beside two busy threads, each with a cache
/// directory of its own (every run cold) and PoCL's own kernel cache off: none fails.
#[test]
fn pyopencl_binary_test_never_aborts_while_launches_run() {
    let Some(dir) = pyopencl_tests() else {
        return;
    };
    let path = dir.join("test_wrapper.py");
    let program = pytest(&path, "test_can_build_and_run_binary");
    if Setup::new().is_none() {
        return;
    }
    let _load = kcache_testkit::load::Load::start(2);
    let mut failed = Vec::new();
    for round in 0..25 {
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let setup = Setup::new().expect("the layer is built: checked above");
                let child = setup
                    .command(true, &program, &[("POCL_KERNEL_CACHE", "0")])
                    .env("XDG_CACHE_HOME", setup.dir.with_file_name("xdg"))
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (setup, child)
            })
            .collect();
        for (setup, child) in runs {
            let output = child.wait_with_output().unwrap();
            if !output.status.success() {
                failed.push(format!(
                    "round {round}: {}: {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                ));
            } else {
                // Each run stored its two programs: the test's and the random generator's.
                assert!(setup.entries() >= 2, "{}", setup.entries());
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 50 runs failed: {failed:?}",
        failed.len()
    );
}

#[test]
fn pyopencl_test_wrapper_passes_the_same_and_warm_compiles_nothing() {
    pyopencl_suite("test_wrapper.py", "");
}

#[test]
fn pyopencl_test_algorithm_passes_the_same_and_warm_compiles_nothing() {
    pyopencl_suite("test_algorithm.py", "elwise or reduction or copy_if");
}

#[test]
fn pyopencl_test_array_passes_the_same_and_warm_compiles_nothing() {
    // The random number generators' kernels include Random123's headers, which include
    // <stddef.h>: the compiler's own header.
    pyopencl_suite(
        "test_array.py",
        "random_float_in_range and (Philox or Threefry)",
    );
}
