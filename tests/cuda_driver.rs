//! Loading the CUDA driver, and what happens without one.
//!
//! No GPU is available in CI: `kcache_testkit::cuda::FakeDriver` is a private copy of the
//! test-kit's build of `c-tests/cuda/fake_cuda.c`, a test library that stands in for the real
//! driver (`libcuda.so.1`).

use std::path::Path;

use kcache::Error;
use kcache::backend::cuda::{CudaCache, CudaOptions, Driver};
use kcache_testkit::cuda::FakeDriver;
use kcache_testkit::{rerun_test, successful_stdout};

mod cuda_common;
use cuda_common::{assert_unavailable, child_line};

#[test]
fn a_missing_driver_library_is_unavailable() {
    assert_unavailable(
        Driver::load_from(Path::new("/nonexistent/libcuda.so.1")),
        "no CUDA driver",
    );
}

#[test]
fn a_library_without_the_driver_entry_points_is_unavailable() {
    assert_unavailable(Driver::load_from(Path::new("libc.so.6")), "lacks cuInit");
}

/// Set in the child runs of `child_cache_new`.
const CHILD_ENV: &str = "KCACHE_CUDA_TEST_CHILD";

/// Not a test on its own: the tests below run this binary again with [`CHILD_ENV`] set and an
/// environment of their choosing, because `KCACHE_CUDA_LIBRARY` and the fake driver's own
/// switches are read from the process environment.
#[test]
fn child_cache_new() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    match CudaCache::new(CudaOptions::default()) {
        Ok(cache) => println!("CHILD ok version={}", cache.driver().version()),
        Err(Error::Unavailable(message)) => println!("CHILD unavailable: {message}"),
        Err(other) => println!("CHILD other: {other}"),
    }
}

fn child(envs: &[(&str, &std::ffi::OsStr)]) -> String {
    let mut child = rerun_test("child_cache_new");
    child.env(CHILD_ENV, "1").envs(envs.iter().copied());
    child_line(&successful_stdout("child", &mut child))
}

/// [`child`] with `KCACHE_CUDA_LIBRARY` naming `fake` and the fake driver's switch `name` set.
fn child_on(fake: &FakeDriver, name: &str, value: &str) -> String {
    child(&[
        ("KCACHE_CUDA_LIBRARY", fake.path().as_os_str()),
        (name, value.as_ref()),
    ])
}

#[test]
fn kcache_cuda_library_names_the_driver() {
    let fake = FakeDriver::new();
    let line = child_on(&fake, "FAKECUDA_DRIVER_VERSION", "12080");
    assert_eq!(line, "ok version=12080");

    let line = child(&[("KCACHE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1".as_ref())]);
    assert!(line.starts_with("unavailable: no CUDA driver"), "{line}");
}

#[test]
fn a_driver_whose_init_fails_is_unavailable() {
    // What the real driver does on a machine with the library installed but no usable GPU.
    let fake = FakeDriver::new();
    let line = child_on(&fake, "FAKECUDA_INIT_RESULT", "100");
    assert!(
        line.starts_with("unavailable: no usable CUDA driver"),
        "{line}"
    );
    assert!(
        line.contains("no CUDA-capable device is detected (CUresult 100)"),
        "{line}"
    );
}

#[test]
fn device_queries() {
    let fake = FakeDriver::new();
    let driver = fake.driver();
    assert_eq!(driver.version(), 12040);
    assert_eq!(driver.path(), fake.path());
    let d1 = driver.device(1).unwrap();
    assert_eq!(driver.device_name(d1).unwrap(), "kcache fake GPU 1");
    assert_eq!(driver.compute_capability(d1).unwrap(), (9, 0));
    assert_eq!(
        driver
            .compute_capability(driver.device(0).unwrap())
            .unwrap(),
        (8, 0)
    );
    match driver.device(7) {
        Err(Error::Backend(message)) => {
            assert!(
                message.contains("invalid device ordinal (CUresult 101)"),
                "{message}"
            )
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert_eq!(driver.describe(12345), "CUresult 12345");
    assert!(driver.current_context().unwrap().is_null());
}

/// The driver's build is the real file name behind `libcuda.so.1`. A driver installed as a
/// regular file of that name names no build: its size and a digest of its content stand in for
/// one in the disk key, so that a driver update never reuses the older build's binaries.
#[test]
fn a_driver_file_that_names_no_build_is_keyed_by_its_content() {
    let fake = FakeDriver::unversioned();
    let build = fake.driver().build().to_owned();
    let bytes = std::fs::read(fake.path()).unwrap();
    assert_eq!(
        build,
        format!(
            "libcuda.so.1 ({} bytes, blake3 {})",
            bytes.len(),
            blake3::hash(&bytes).to_hex()
        )
    );
    assert_eq!(FakeDriver::new().driver().build(), "libcuda.so.0.0.0");
}
