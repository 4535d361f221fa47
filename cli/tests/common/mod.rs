//! What every test of the command needs: running the built `kcache` on a directory, with an
//! empty environment so that no `KCACHE_*` variable of the caller leaks in.
// Each test binary uses some of these helpers, none uses all.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kcache_testkit::needs;
use kcache_testkit::opencl::Context;
use serde_json::Value;

/// Runs `kcache --dir DIR ARGS`.
pub fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kcache"))
        .env_clear()
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

/// The JSON a successful `kcache --dir DIR ARGS` printed, of schema 1.
pub fn json(dir: &Path, args: &[&str]) -> Value {
    let output = run(dir, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["schema"], 1);
    value
}

/// The directory counter `name` of the JSON of `stats --json`.
pub fn counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name}"))
}

/// The Python with numpy and pyopencl that the layer's tests run: the system's.
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// The OpenCL layer's library, beside the command: `cargo build --workspace` builds it
/// (`scripts/test` does), `cargo test` alone does not. `None` when it is not there, the test
/// skipped ([`needs::met`]).
pub fn layer() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_BIN_EXE_kcache")).with_file_name("libkcache_opencl_layer.so");
    needs::met(needs::file(
        path,
        "run cargo build --workspace; scripts/test does",
    ))
}

/// What the layer's tests need to run `program` under it: the layer, an OpenCL device, and the
/// program itself (the system's Python with numpy and PyOpenCL where it is [`python`]); the
/// layer's path, or `None` when one is missing, the test skipped ([`needs::met`]).
pub fn layer_can_run(program: &str) -> Option<PathBuf> {
    let layer = layer()?;
    Context::for_test()?;
    let need = if program == python() {
        needs::python(
            program,
            "numpy, pyopencl",
            "apt install python3-numpy python3-pyopencl; scripts/test installs them",
        )
    } else {
        let package = match program {
            "/usr/bin/clblast_test_xaxpy" => "clblast-tests",
            other => other,
        };
        let install = format!("apt install {package}; scripts/test installs it");
        needs::program(program, &install)
    };
    needs::met(need)?;
    Some(layer)
}

/// `command` with no setting of the caller's that would change what the OpenCL layer or the
/// driver does: no layer of the caller's, no kcache switch or log level, PyOpenCL's own cache off
/// and its first platform chosen without asking.
pub fn pocl_clean(command: &mut Command) -> &mut Command {
    command
        .env("PYOPENCL_NO_CACHE", "1")
        .env("PYOPENCL_CTX", "0")
        .env_remove("OPENCL_LAYERS")
        .env_remove("KCACHE_DISABLE")
        .env_remove("KCACHE_LOG")
}
