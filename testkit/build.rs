//! Builds the libraries that stand in for the CUDA driver (`c-tests/cuda/fake_cuda.c`) and NVRTC
//! (`c-tests/cuda/fake_nvrtc.c`), once, into `OUT_DIR`. No GPU and no CUDA toolkit are available
//! in CI. The Rust tests, the benchmark, the C tests (`c-tests/cuda/run.sh`) and
//! `scripts/gpu-check --test-driver` all load these same files, so every one of them tests the
//! stand-ins built with the flags below.
//!
//! The compiler is the one the `cc` crate picks (`$CC`, else the platform's `cc`); its default
//! flags are left out so that the library is the same whatever profile builds this crate.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// C11 with warnings as errors, exporting only the entry points the stand-ins define as visible.
const FLAGS: &[&str] = &[
    "-std=c11",
    "-O1",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let sources = manifest.join("../c-tests/cuda");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    for (name, env_name) in [
        ("fake_cuda", "KCACHE_TESTKIT_FAKE_CUDA"),
        ("fake_nvrtc", "KCACHE_TESTKIT_FAKE_NVRTC"),
    ] {
        let source = sources.join(format!("{name}.c"));
        let library = out.join(format!("lib{name}.so"));
        link(compiler.path(), &source, &library);
        println!("cargo:rerun-if-changed={}", source.display());
        println!("cargo:rustc-env={env_name}={}", library.display());
    }
}

fn link(cc: &Path, source: &Path, library: &Path) {
    let status = Command::new(cc)
        .args(FLAGS)
        .arg("-o")
        .arg(library)
        .arg(source)
        .arg("-lm")
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cc.display()));
    assert!(status.success(), "building {} failed", source.display());
}
