//! Never a wrong kernel, never a lost driver error under the OpenCL layer: a program whose
//! source `#include`s a header is built again when the header changes, for every way a source
//! can include a file, and a compiled object (`clCompileProgram`, embedded headers included)
//! when its headers change, and a build for a context of several devices; a computed `#include`
//! of the options' macros and a header found nowhere are keyed; one that reads what kcache
//! cannot key goes to the driver; a build the driver refuses is refused; a release racing a
//! build leaves the build with its program.
//! Real processes on PoCL, each run in a working directory of the test's, where relative names
//! are found.

mod common;
use common::python;

use std::path::PathBuf;
use std::process::Command;

use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::needs;

/// Builds the source in the file `argv[1]` with the options `argv[2]`, runs its kernel `k`
/// (one work-item writing one int) and prints what it wrote.
const PROBE: &str = r#"
import sys, numpy, pyopencl as cl
ctx = cl.create_some_context(interactive=False)
queue = cl.CommandQueue(ctx)
program = cl.Program(ctx, open(sys.argv[1]).read()).build(options=sys.argv[2].split())
out = numpy.zeros(1, numpy.int32)
buf = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, out.nbytes)
program.k(queue, (1,), None, buf)
cl.enqueue_copy(queue, out, buf)
print(int(out[0]))
"#;

/// A working directory with its files, a cache directory and a PoCL cache of its own.
struct Work {
    temp: tempfile::TempDir,
}

impl Work {
    /// `None` when the machine cannot run the probes (the test skipped).
    fn new(files: &[(&str, &str)]) -> Option<Work> {
        common::layer_can_run(python())?;
        let work = Work {
            temp: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir(work.cwd()).unwrap();
        std::fs::write(work.cwd().join("probe.py"), PROBE).unwrap();
        for (name, text) in files {
            work.write(name, text);
        }
        Some(work)
    }

    fn cwd(&self) -> PathBuf {
        self.temp.path().join("cwd")
    }

    fn write(&self, name: &str, text: &str) {
        let path = self.cwd().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Runs the probe on `kernel.cl` with `options`, under the layer or not; its value, and
    /// what `kcache run --stats` said.
    fn run(&self, layer: bool, options: &str) -> (i64, String) {
        let (stdout, stderr) = self.output(layer, &[python(), "probe.py", "kernel.cl", options]);
        (stdout.trim().parse().unwrap(), stderr)
    }

    /// Runs `program` in the working directory, under the layer or not: its standard output
    /// and error.
    fn output(&self, layer: bool, probe: &[&str]) -> (String, String) {
        self.output_with(layer, probe, &[])
    }

    /// [`Work::output`] with the variables `env` set.
    fn output_with(&self, layer: bool, probe: &[&str], env: &[(&str, &str)]) -> (String, String) {
        let mut command = if layer {
            let mut command = Command::new(env!("CARGO_BIN_EXE_kcache"));
            command.args(["run", "--stats", "--"]).args(probe);
            command
        } else {
            let mut command = Command::new(probe[0]);
            command.args(&probe[1..]);
            command
        };
        let output = common::pocl_clean(&mut command)
            .current_dir(self.cwd())
            .env("KCACHE_DIR", self.temp.path().join("kcache"))
            .env("POCL_CACHE_DIR", self.temp.path().join("pocl"))
            .env("POCL_KERNEL_CACHE", "0")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{probe:?} failed: {stderr}");
        (String::from_utf8_lossy(&output.stdout).into_owned(), stderr)
    }

    /// Under the layer, checked against the driver's own value.
    fn served(&self, options: &str) -> (i64, String) {
        let (driver, _) = self.run(false, options);
        let (value, stats) = self.run(true, options);
        assert_eq!(
            value, driver,
            "the layer's kernel differs from the driver's: {stats}"
        );
        (value, stats)
    }

    fn entries(&self) -> usize {
        let dir = self.temp.path().join("kcache");
        Persistence::open(PersistenceConfig::in_dir(&dir))
            .unwrap()
            .entries()
            .unwrap()
            .len()
    }
}

/// The number before `what` in `kcache run --stats`'s line.
fn stat(stats: &str, what: &str) -> u64 {
    let line = stats
        .lines()
        .find(|l| l.starts_with("kcache run:"))
        .unwrap_or_else(|| panic!("no statistics in {stats}"));
    let before = &line[..line
        .find(what)
        .unwrap_or_else(|| panic!("no {what:?} in {line}"))];
    before
        .split_whitespace()
        .last()
        .and_then(|n| n.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("no count before {what:?} in {line}"))
}

/// Builds, rebuilds unchanged (served), changes `header` to `changed` (compiled again, the new
/// value), and changes it back (served: the first entry is still right).
fn rebuilt_when_changed(work: &Work, options: &str, header: &str, changed: &str, values: [i64; 2]) {
    let (first, stats) = work.served(options);
    assert_eq!(first, values[0]);
    assert_eq!(stat(&stats, "compiled"), 1, "{stats}");
    let (again, stats) = work.served(options);
    assert_eq!((again, stat(&stats, "compiled")), (values[0], 0), "{stats}");
    let old = std::fs::read_to_string(work.cwd().join(header)).unwrap();
    work.write(header, changed);
    let (second, stats) = work.served(options);
    assert_eq!(second, values[1], "a stale kernel: {stats}");
    assert_eq!(stat(&stats, "compiled"), 1, "{stats}");
    work.write(header, &old);
    let (back, stats) = work.served(options);
    assert_eq!((back, stat(&stats, "compiled")), (values[0], 0), "{stats}");
    assert_eq!(work.entries(), 2);
}

const USES_VAL: &str = "__kernel void k(__global int *o) { o[0] = VAL; }\n";

fn kernel(include: &str) -> String {
    format!("{include}\n{USES_VAL}")
}

#[test]
fn a_quoted_include_relative_to_the_working_directory() {
    let Some(work) = Work::new(&[
        ("kernel.cl", &kernel("#include \"hdr/h.h\"")),
        ("hdr/h.h", "#define VAL 1\n"),
    ]) else {
        return;
    };
    rebuilt_when_changed(&work, "", "hdr/h.h", "#define VAL 2\n", [1, 2]);
}

#[test]
fn an_angled_include_through_a_separate_i_option() {
    let Some(work) = Work::new(&[
        ("kernel.cl", &kernel("#include <h.h>")),
        ("inc/h.h", "#define VAL 3\n"),
    ]) else {
        return;
    };
    rebuilt_when_changed(&work, "-I inc", "inc/h.h", "#define VAL 4\n", [3, 4]);
}

#[test]
fn an_include_through_a_joined_i_option_of_an_absolute_directory() {
    let Some(work) = Work::new(&[
        ("kernel.cl", &kernel("#include \"h.h\"")),
        ("inc/h.h", "#define VAL 5\n"),
    ]) else {
        return;
    };
    let options = format!("-I{}", work.cwd().join("inc").display());
    rebuilt_when_changed(&work, &options, "inc/h.h", "#define VAL 6\n", [5, 6]);
}

#[test]
fn a_header_included_by_a_header_beside_it() {
    let Some(work) = Work::new(&[
        ("kernel.cl", &kernel("#include <outer.h>")),
        ("inc/outer.h", "#include \"inner.h\"\n"),
        ("inc/inner.h", "#define VAL 7\n"),
    ]) else {
        return;
    };
    rebuilt_when_changed(&work, "-I inc", "inc/inner.h", "#define VAL 8\n", [7, 8]);
}

#[test]
fn an_include_next_of_the_header_further_on_the_search_path() {
    let Some(work) = Work::new(&[
        ("kernel.cl", &kernel("#include <v.h>")),
        ("a/v.h", "#include_next <v.h>\n#define VAL (BASE + 1)\n"),
        ("b/v.h", "#define BASE 40\n"),
    ]) else {
        return;
    };
    rebuilt_when_changed(&work, "-I a -I b", "b/v.h", "#define BASE 50\n", [41, 51]);
}

#[test]
fn an_include_of_an_absolute_path() {
    let Some(work) = Work::new(&[("abs/h.h", "#define VAL 9\n")]) else {
        return;
    };
    let path = work.cwd().join("abs/h.h");
    work.write(
        "kernel.cl",
        &kernel(&format!("#include \"{}\"", path.display())),
    );
    rebuilt_when_changed(&work, "", "abs/h.h", "#define VAL 10\n", [9, 10]);
}

#[test]
fn a_computed_include_of_the_options_macros() {
    // hashcat's way: the directory and a two-level stringizing macro come from -D options.
    let Some(work) = Work::new(&[
        ("kernel.cl", &kernel("#include M2S(INCLUDE_PATH/inc.h)")),
        ("OpenCL/inc.h", "#define VAL 17\n"),
    ]) else {
        return;
    };
    let options = format!(
        "-D INCLUDE_PATH={} -D XM2S(x)=#x -D M2S(x)=XM2S(x)",
        work.cwd().join("OpenCL").display()
    );
    rebuilt_when_changed(
        &work,
        &options,
        "OpenCL/inc.h",
        "#define VAL 18\n",
        [17, 18],
    );
}

#[test]
fn a_header_found_nowhere_in_a_branch_not_compiled() {
    // hashcat's inc_vendor.h includes <metal_stdlib> for Metal only; PoCL has no such header.
    let Some(work) = Work::new(&[(
        "kernel.cl",
        &kernel("#if defined IS_METAL\n#include <metal_stdlib>\n#else\n#define VAL 19\n#endif"),
    )]) else {
        return;
    };
    let (first, stats) = work.served("");
    assert_eq!((first, stat(&stats, "compiled")), (19, 1), "{stats}");
    assert_eq!(stat(&stats, "passed through"), 0, "{stats}");
    let (again, stats) = work.served("");
    assert_eq!((again, stat(&stats, "compiled")), (19, 0), "{stats}");
    // Its absence is keyed: the header appearing where the compiler would find it is a new
    // key, compiled again, though this build does not read it.
    work.write("metal_stdlib", "#define VAL 20\n");
    let (appeared, stats) = work.served("");
    assert_eq!((appeared, stat(&stats, "compiled")), (19, 1), "{stats}");
    let (metal, stats) = work.served("-DIS_METAL");
    assert_eq!((metal, stat(&stats, "compiled")), (20, 1), "{stats}");
}

#[test]
fn a_header_that_appears_earlier_on_the_search_path() {
    let Some(work) = Work::new(&[
        ("kernel.cl", &kernel("#include <h.h>")),
        ("second/h.h", "#define VAL 11\n"),
    ]) else {
        return;
    };
    let (first, _) = work.served("-I first -I second");
    assert_eq!(first, 11);
    work.write("first/h.h", "#define VAL 12\n");
    let (shadowed, stats) = work.served("-I first -I second");
    assert_eq!(shadowed, 12, "a stale kernel: {stats}");
    assert_eq!(stat(&stats, "compiled"), 1, "{stats}");
}

#[test]
fn a_has_include_probe_of_a_file_that_appears() {
    let Some(work) = Work::new(&[(
        "kernel.cl",
        "#if __has_include(\"opt.h\")\n#define VAL 13\n#else\n#define VAL 14\n#endif\n\
         __kernel void k(__global int *o) { o[0] = VAL; }\n",
    )]) else {
        return;
    };
    let (absent, _) = work.served("");
    assert_eq!(absent, 14);
    work.write("opt.h", "\n");
    let (present, stats) = work.served("");
    assert_eq!(present, 13, "a stale kernel: {stats}");
    assert_eq!(stat(&stats, "compiled"), 1, "{stats}");
}

#[test]
fn a_computed_include_goes_to_the_driver_every_time() {
    let Some(work) = Work::new(&[
        (
            "kernel.cl",
            &kernel("#define HEADER \"hdr/h.h\"\n#include HEADER"),
        ),
        ("hdr/h.h", "#define VAL 15\n"),
    ]) else {
        return;
    };
    let (first, stats) = work.served("");
    assert_eq!(first, 15);
    assert_eq!(stat(&stats, "passed through"), 1, "{stats}");
    assert!(
        stats.contains("cannot know all it reads"),
        "the first pass-through is not logged: {stats}"
    );
    work.write("hdr/h.h", "#define VAL 16\n");
    let (second, stats) = work.served("");
    assert_eq!(second, 16);
    assert_eq!(stat(&stats, "passed through"), 1, "{stats}");
    assert_eq!(work.entries(), 0, "a build kcache cannot key was stored");
}

/// Builds a program, builds it again, makes a kernel of it and builds it once more, printing
/// what each build returned.
const REBUILD: &str = r#"
import pyopencl as cl
ctx = cl.create_some_context(interactive=False)
program = cl._cl._Program(ctx, "__kernel void k(__global int *o) { o[0] = 1; }")
def build(what):
    try:
        program.build("", None)
        print(what, 0)
    except cl.Error as e:
        print(what, e.code)
build("first build:")
build("again, no kernel alive:")
kernel = cl.Kernel(program, "k")
build("again, a kernel alive:")
"#;

#[test]
fn a_build_of_a_program_whose_kernel_is_alive_is_refused_as_the_driver_refuses_it() {
    let Some(work) = Work::new(&[("rebuild.py", REBUILD)]) else {
        return;
    };
    let program = [python(), "rebuild.py"];
    let (plain, _) = work.output(false, &program);
    assert!(plain.contains("a kernel alive: -59"), "{plain}");
    for run in ["cold", "warm"] {
        let (served, stats) = work.output(true, &program);
        assert_eq!(served, plain, "{run}: {stats}");
    }
    assert_eq!(work.entries(), 1);
}

/// Releases a program's last reference on one thread while another builds it, then creates a
/// program, which the driver may give the freed handle: the new one must not have a build.
const RELEASE_RACE: &str = r#"
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static cl_program program;
static cl_device_id device;

static void *build(void *unused) {
  (void)unused;
  printf("build: %d\n", clBuildProgram(program, 1, &device, "", NULL, NULL));
  return NULL;
}

int main(void) {
  cl_platform_id platform;
  cl_int code;
  if (clGetPlatformIDs(1, &platform, NULL) != CL_SUCCESS ||
      clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL) != CL_SUCCESS)
    return 2;
  cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &code);
  /* Enough functions that the build takes far longer than the wait below. */
  size_t size = 4000 * 96 + 128, used = 0;
  char *source = malloc(size);
  if (source == NULL) return 2;
  for (int i = 0; i < 4000; i++)
    used += (size_t)snprintf(source + used, size - used,
                             "float f%d(float x) { return x * %d.0f + sin(x); }\n", i, i);
  snprintf(source + used, size - used, "__kernel void k(__global float *y) { y[0] = f1(y[0]); }\n");
  const char *text = source;
  program = clCreateProgramWithSource(context, 1, &text, NULL, &code);
  pthread_t builder;
  pthread_create(&builder, NULL, build, NULL);
  usleep(300000);
  clReleaseProgram(program);
  const char *other = "__kernel void other(__global int *o) { o[0] = 2; }";
  cl_program next = clCreateProgramWithSource(context, 1, &other, NULL, &code);
  pthread_join(builder, NULL);
  cl_build_status status = CL_BUILD_SUCCESS;
  clGetProgramBuildInfo(next, device, CL_PROGRAM_BUILD_STATUS, sizeof status, &status, NULL);
  printf("new program's build status: %d\n", status);
  size_t kernels = 0;
  printf("new program's kernel count query: %d\n",
         clGetProgramInfo(next, CL_PROGRAM_NUM_KERNELS, sizeof kernels, &kernels, NULL));
  clReleaseProgram(next);
  clReleaseContext(context);
  free(source);
  return 0;
}
"#;

/// Releasing a program while it builds is the application's race, not a driver's call to make
/// safe, so only the layer's side is checked: the build keeps its program, whose freed handle
/// the next program cannot then inherit with the build attached.
#[test]
fn a_release_racing_a_build_never_gives_the_build_to_another_program() {
    let Some(work) = Work::new(&[("race.c", RELEASE_RACE)]) else {
        return;
    };
    let headers = needs::file(
        "/usr/include/CL/cl.h",
        "apt install opencl-c-headers ocl-icd-opencl-dev; scripts/test installs them",
    );
    let Some(_) = needs::met(headers) else {
        return;
    };
    let cc = Command::new("cc")
        .current_dir(work.cwd())
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-D_DEFAULT_SOURCE",
        ])
        .args(["race.c", "-o", "race", "-lOpenCL", "-lpthread"])
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let race = work.cwd().join("race");
    let (out, stats) = work.output(true, &[race.to_str().unwrap()]);
    assert!(out.contains("build: 0\n"), "{out}{stats}");
    assert!(
        out.contains("new program's build status: -1\n"),
        "the new program got the build: {out:?} {stats}"
    );
    assert!(
        out.contains("new program's kernel count query: -45\n"),
        "the new program got the build: {out:?} {stats}"
    );
}

/// Compiles `helper.cl` (which includes the embedded header `emb.h`, made of the text
/// `argv[1]`, and the file `inc/fs.h` through `-I inc`) and `main.cl`, links the first into a
/// library and the library with the second into an executable, runs its kernel `k` and prints
/// what it wrote, then what the compile of the helper reports of itself.
const COMPILE_LINK: &str = r#"
import sys, numpy, pyopencl as cl
ctx = cl.create_some_context(interactive=False)
dev = ctx.devices[0]
embedded = cl._cl._Program(ctx, sys.argv[1])
helper = cl._cl._Program(ctx, open("helper.cl").read())
helper.compile("-I inc", None, [("emb.h", embedded)])
main = cl._cl._Program(ctx, open("main.cl").read())
main.compile("", None, [])
library = cl._cl._Program.link(ctx, [helper], "-create-library", None)
program = cl._cl._Program.link(ctx, [main, library], "", None)
queue = cl.CommandQueue(ctx)
out = numpy.zeros(1, numpy.int32)
buf = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, out.nbytes)
kernel = cl.Kernel(program, "k")
kernel.set_args(buf)
cl.enqueue_nd_range_kernel(queue, kernel, (1,), None)
cl.enqueue_copy(queue, out, buf)
print(int(out[0]))
info = cl.program_build_info
print(helper.get_build_info(dev, info.STATUS), repr(helper.get_build_info(dev, info.OPTIONS)),
      helper.get_build_info(dev, info.BINARY_TYPE), library.get_build_info(dev, info.BINARY_TYPE))
"#;

impl Work {
    /// The compile + link probe with the embedded header `embedded`, under the layer or not:
    /// the kernel's value, what the compile reported of itself, and the layer's statistics.
    fn compile_link(&self, layer: bool, embedded: &str) -> (i64, String, String) {
        let (out, stats) = self.output(layer, &[python(), "compile_link.py", embedded]);
        let (value, info) = out.split_once('\n').unwrap();
        (value.parse().unwrap(), info.to_owned(), stats)
    }
}

#[test]
fn compile_and_link_are_served_and_compiled_again_when_a_header_changes() {
    let Some(work) = Work::new(&[
        ("compile_link.py", COMPILE_LINK),
        (
            "helper.cl",
            "#include \"emb.h\"\n#include <fs.h>\nint helper(int x) { return x + EMB + FS; }\n",
        ),
        (
            "main.cl",
            "int helper(int x);\n__kernel void k(__global int *o) { o[0] = helper(1); }\n",
        ),
        ("inc/fs.h", "#define FS 20\n"),
    ]) else {
        return;
    };
    let emb = |value: u32| format!("#define EMB {value}\n");
    // Each run: the driver's value and report, then the layer's, and how many of the two
    // compiles the layer served.
    let check = |embedded: &str, value: i64, compiled: u64| {
        let (driver, driver_info, _) = work.compile_link(false, embedded);
        assert_eq!(driver, value);
        let (served, info, stats) = work.compile_link(true, embedded);
        assert_eq!(served, driver, "a stale kernel: {stats}");
        assert_eq!(info, driver_info, "{stats}");
        assert_eq!(stat(&stats, "compiled"), compiled, "{stats}");
        assert_eq!(
            stat(&stats, "program builds served"),
            2 - compiled,
            "{stats}"
        );
    };
    check(&emb(100), 121, 2);
    check(&emb(100), 121, 0);
    // The embedded header's text, then the file's, changed: the helper compiled again.
    check(&emb(200), 221, 1);
    work.write("inc/fs.h", "#define FS 30\n");
    check(&emb(200), 231, 1);
    // Back to the first: its entry is still right.
    work.write("inc/fs.h", "#define FS 20\n");
    check(&emb(100), 121, 0);
    assert_eq!(work.entries(), 4, "two helpers of three headers, one main");
}

/// Builds `kernel.cl` with `-I .` for every device of a context of all the platform's devices,
/// runs its kernel on each, and prints the program's binary sizes as the driver reports them
/// (zero or not) and each device's value.
const DEVICES: &str = r#"
import numpy, pyopencl as cl
devices = cl.get_platforms()[0].get_devices()
ctx = cl.Context(devices)
program = cl.Program(ctx, open("kernel.cl").read()).build(options=["-I", "."])
print("binaries:", [size > 0 for size in program.binary_sizes])
for i, device in enumerate(devices):
    queue = cl.CommandQueue(ctx, device)
    out = numpy.zeros(1, numpy.int32)
    buf = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, out.nbytes)
    program.k(queue, (1,), None, buf, numpy.int32(i))
    cl.enqueue_copy(queue, out, buf)
    print("device", i, int(out[0]))
"#;

#[test]
fn a_context_of_two_devices_is_served_one_entry_per_kind_of_device() {
    let Some(work) = Work::new(&[
        ("devices.py", DEVICES),
        (
            "kernel.cl",
            "#include \"h.h\"\n__kernel void k(__global int *o, int d) { o[0] = VAL * 10 + d; }\n",
        ),
        ("h.h", "#define VAL 4\n"),
    ]) else {
        return;
    };
    // PoCL's CPU driver, twice: two devices of one identity.
    let two = [("POCL_DEVICES", "pthread pthread")];
    let run = |layer| work.output_with(layer, &[python(), "devices.py"], &two);
    let (plain, _) = run(false);
    assert_eq!(
        plain, "binaries: [True, True]\ndevice 0 40\ndevice 1 41\n",
        "not a context of two devices"
    );
    let (cold, stats) = run(true);
    assert_eq!(cold, plain, "{stats}");
    assert_eq!(stat(&stats, "compiled"), 1, "one kind of device: {stats}");
    let (warm, stats) = run(true);
    assert_eq!(warm, plain, "{stats}");
    assert_eq!(stat(&stats, "compiled"), 0, "{stats}");
    assert_eq!(stat(&stats, "program builds served"), 1, "{stats}");
    work.write("h.h", "#define VAL 5\n");
    let (changed, stats) = run(true);
    assert_eq!(
        changed,
        plain.replace(" 4", " 5"),
        "a stale kernel: {stats}"
    );
    assert_eq!(stat(&stats, "compiled"), 1, "{stats}");
    assert_eq!(work.entries(), 2);
}
