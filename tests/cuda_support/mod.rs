//! The test driver library for the CUDA integration tests and benchmark.
//!
//! No GPU is available in CI, so these do not talk to the real NVIDIA driver: they build
//! `c-tests/cuda/fake_cuda.c`, a library that stands in for `libcuda.so.1` (same entry points,
//! same prototypes), and point kcache at it. The real driver path is exercised by
//! `scripts/gpu-check` on a GPU machine. The tests that use the stand-in's own counters and
//! switches live in the crate, under `src/backend/cuda/tests/`.
//!
//! Each [`FakeDriver`] is a private copy of the library file, so the dynamic loader gives it
//! its own globals.

#![allow(dead_code)] // Each target uses a different subset.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kcache::backend::cuda::Driver;
use kcache::backend::cuda::testing::build_test_library;
use tempfile::TempDir;

/// One private instance of the fake driver.
pub struct FakeDriver {
    path: PathBuf,
    _dir: TempDir,
}

impl FakeDriver {
    pub fn new() -> FakeDriver {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libcuda.so.1");
        let built = build_test_library("fake_cuda", Path::new(env!("CARGO_TARGET_TMPDIR")));
        std::fs::copy(built, &path).unwrap();
        FakeDriver { path, _dir: dir }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// kcache's view of this library instance.
    pub fn driver(&self) -> Arc<Driver> {
        Arc::new(Driver::load_from(&self.path).unwrap())
    }
}
