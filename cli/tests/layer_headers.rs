//! Never a stale kernel under the OpenCL layer: a program whose source `#include`s a header is
//! built again when the header changes, for every way a source can include a file, and one
//! that reads what kcache cannot key goes to the driver. Real processes on PoCL, each run in a
//! working directory of the test's, where relative names are found.

use std::path::{Path, PathBuf};
use std::process::Command;

use kcache::disk::{Persistence, PersistenceConfig};

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

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

fn layer_is_built() {
    let layer = Path::new(env!("CARGO_BIN_EXE_kcache")).with_file_name("libkcache_opencl_layer.so");
    assert!(layer.is_file(), "{} is not built", layer.display());
}

/// A working directory with its files, a cache directory and a PoCL cache of its own.
struct Work {
    temp: tempfile::TempDir,
}

impl Work {
    fn new(files: &[(&str, &str)]) -> Work {
        layer_is_built();
        let work = Work {
            temp: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir(work.cwd()).unwrap();
        std::fs::write(work.cwd().join("probe.py"), PROBE).unwrap();
        for (name, text) in files {
            work.write(name, text);
        }
        work
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
        let probe = [python(), "probe.py", "kernel.cl", options];
        let mut command = if layer {
            let mut command = Command::new(env!("CARGO_BIN_EXE_kcache"));
            command.args(["run", "--stats", "--"]).args(probe);
            command
        } else {
            let mut command = Command::new(probe[0]);
            command.args(&probe[1..]);
            command
        };
        let output = command
            .current_dir(self.cwd())
            .env("KCACHE_DIR", self.temp.path().join("kcache"))
            .env("POCL_CACHE_DIR", self.temp.path().join("pocl"))
            .env("POCL_KERNEL_CACHE", "0")
            .env("PYOPENCL_NO_CACHE", "1")
            .env("PYOPENCL_CTX", "0")
            .env_remove("OPENCL_LAYERS")
            .env_remove("KCACHE_DISABLE")
            .env_remove("KCACHE_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "the probe failed: {stderr}");
        let value = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap();
        (value, stderr)
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
    let work = Work::new(&[
        ("kernel.cl", &kernel("#include \"hdr/h.h\"")),
        ("hdr/h.h", "#define VAL 1\n"),
    ]);
    rebuilt_when_changed(&work, "", "hdr/h.h", "#define VAL 2\n", [1, 2]);
}

#[test]
fn an_angled_include_through_a_separate_i_option() {
    let work = Work::new(&[
        ("kernel.cl", &kernel("#include <h.h>")),
        ("inc/h.h", "#define VAL 3\n"),
    ]);
    rebuilt_when_changed(&work, "-I inc", "inc/h.h", "#define VAL 4\n", [3, 4]);
}

#[test]
fn an_include_through_a_joined_i_option_of_an_absolute_directory() {
    let work = Work::new(&[
        ("kernel.cl", &kernel("#include \"h.h\"")),
        ("inc/h.h", "#define VAL 5\n"),
    ]);
    let options = format!("-I{}", work.cwd().join("inc").display());
    rebuilt_when_changed(&work, &options, "inc/h.h", "#define VAL 6\n", [5, 6]);
}

#[test]
fn a_header_included_by_a_header_beside_it() {
    let work = Work::new(&[
        ("kernel.cl", &kernel("#include <outer.h>")),
        ("inc/outer.h", "#include \"inner.h\"\n"),
        ("inc/inner.h", "#define VAL 7\n"),
    ]);
    rebuilt_when_changed(&work, "-I inc", "inc/inner.h", "#define VAL 8\n", [7, 8]);
}

#[test]
fn an_include_of_an_absolute_path() {
    let work = Work::new(&[("abs/h.h", "#define VAL 9\n")]);
    let path = work.cwd().join("abs/h.h");
    work.write(
        "kernel.cl",
        &kernel(&format!("#include \"{}\"", path.display())),
    );
    rebuilt_when_changed(&work, "", "abs/h.h", "#define VAL 10\n", [9, 10]);
}

#[test]
fn a_header_that_appears_earlier_on_the_search_path() {
    let work = Work::new(&[
        ("kernel.cl", &kernel("#include <h.h>")),
        ("second/h.h", "#define VAL 11\n"),
    ]);
    let (first, _) = work.served("-I first -I second");
    assert_eq!(first, 11);
    work.write("first/h.h", "#define VAL 12\n");
    let (shadowed, stats) = work.served("-I first -I second");
    assert_eq!(shadowed, 12, "a stale kernel: {stats}");
    assert_eq!(stat(&stats, "compiled"), 1, "{stats}");
}

#[test]
fn a_has_include_probe_of_a_file_that_appears() {
    let work = Work::new(&[(
        "kernel.cl",
        "#if __has_include(\"opt.h\")\n#define VAL 13\n#else\n#define VAL 14\n#endif\n\
         __kernel void k(__global int *o) { o[0] = VAL; }\n",
    )]);
    let (absent, _) = work.served("");
    assert_eq!(absent, 14);
    work.write("opt.h", "\n");
    let (present, stats) = work.served("");
    assert_eq!(present, 13, "a stale kernel: {stats}");
    assert_eq!(stat(&stats, "compiled"), 1, "{stats}");
}

#[test]
fn a_computed_include_goes_to_the_driver_every_time() {
    let work = Work::new(&[
        (
            "kernel.cl",
            &kernel("#define HEADER \"hdr/h.h\"\n#include HEADER"),
        ),
        ("hdr/h.h", "#define VAL 15\n"),
    ]);
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
