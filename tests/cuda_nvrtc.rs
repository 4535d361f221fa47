//! CUDA C++ source through NVRTC, then the same link/load/cache path as PTX.
//!
//! No GPU and no CUDA toolkit are available in CI: the test-kit (`kcache_testkit::cuda`) builds
//! two test libraries that stand in for the real ones, `c-tests/cuda/fake_cuda.c` for the driver
//! (`libcuda.so.1`) and `c-tests/cuda/fake_nvrtc.c` for NVRTC (`libnvrtc.so`).

use std::path::Path;
use std::sync::Arc;

use kcache::Error;
use kcache::backend::cuda::{CUcontext, Context, CudaCache, CudaOptions, JitOption, Nvrtc};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::assert_err;
use kcache_testkit::cuda::{FakeDriver, FakeNvrtc};

mod cuda_common;
use cuda_common::assert_unavailable;

const SOURCE: &str = "extern \"C\" __global__ void scale(float *x, float a) {\n\
                      x[threadIdx.x] *= a;\n}\n";

fn ctx(raw: CUcontext) -> Option<Context> {
    // SAFETY: the fake driver created `raw`; the tests never destroy it while cached.
    unsafe { Context::from_raw(raw) }
}

fn cache(driver: &FakeDriver, nvrtc: Arc<Nvrtc>, disk: Option<&Path>) -> CudaCache {
    CudaCache::new(CudaOptions {
        persistence: disk
            .map(|d| Arc::new(Persistence::open(PersistenceConfig::in_dir(d)).unwrap())),
        driver: Some(driver.driver()),
        nvrtc: Some(nvrtc),
        ..CudaOptions::default()
    })
    .unwrap()
}

/// The stand-in driver and NVRTC, a context on device 0 and a cache without a disk tier.
fn memory_only() -> (FakeDriver, FakeNvrtc, CUcontext, CudaCache) {
    let (driver, nvrtc) = (FakeDriver::new(), FakeNvrtc::new());
    let c0 = driver.create_context(0);
    let cache = cache(&driver, nvrtc.nvrtc(), None);
    (driver, nvrtc, c0, cache)
}

#[test]
fn cuda_source_is_compiled_for_the_device_once_then_cached() {
    let (driver, nvrtc) = (FakeDriver::new(), FakeNvrtc::new());
    let dir = tempfile::tempdir().unwrap();
    let c0 = driver.create_context(0);
    let cache = cache(&driver, nvrtc.nvrtc(), Some(dir.path()));

    let lease = cache
        .find_or_build_source(ctx(c0), SOURCE, &[], &[])
        .unwrap();
    assert!(!lease.function("scale").unwrap().is_null());
    assert_eq!(nvrtc.compiles(), 1);
    assert_eq!(
        nvrtc.last_arch(),
        "sm_80",
        "a cubin for the context's device, by default"
    );
    assert_eq!(
        driver.counter("link_complete"),
        0,
        "NVRTC's cubin needs no link"
    );

    let again = cache
        .find_or_build_source(ctx(c0), SOURCE, &[], &[])
        .unwrap();
    assert_eq!(again.raw(), lease.raw());
    assert_eq!(nvrtc.compiles(), 1);

    // The same text as PTX is another module: inputs of the two kinds never share an entry.
    assert_err!(
        cache.find_or_build_ptx(ctx(c0), SOURCE.as_bytes(), &[]),
        Error::Build(_)
    );

    let c1 = driver.create_context(1);
    cache
        .find_or_build_source(ctx(c1), SOURCE, &[], &[])
        .unwrap();
    assert_eq!(nvrtc.last_arch(), "sm_90");
    // PTX for an older architecture is linked for the device, as the driver does.
    cache
        .find_or_build_source(ctx(c1), SOURCE, &["-arch=compute_75"], &[])
        .unwrap();
    assert_eq!(
        nvrtc.last_arch(),
        "compute_75",
        "an explicit architecture wins"
    );

    let stats = cache.stats();
    assert_eq!((stats.nvrtc_compiles, stats.nvrtc_failures), (3, 0));
}

#[test]
fn a_warm_start_skips_nvrtc_and_the_link_and_the_nvrtc_version_is_in_the_key() {
    let (driver, nvrtc) = (FakeDriver::new(), FakeNvrtc::new());
    let dir = tempfile::tempdir().unwrap();
    let c0 = driver.create_context(0);
    cache(&driver, nvrtc.nvrtc(), Some(dir.path()))
        .find_or_build_source(ctx(c0), SOURCE, &["-DSCALE=2"], &[])
        .unwrap();
    assert_eq!((nvrtc.compiles(), driver.counter("link_complete")), (1, 0));

    let warm = cache(&driver, nvrtc.nvrtc(), Some(dir.path()));
    let lease = warm
        .find_or_build_source(ctx(c0), SOURCE, &["-DSCALE=2"], &[])
        .unwrap();
    assert!(!lease.function("scale").unwrap().is_null());
    assert_eq!((nvrtc.compiles(), driver.counter("link_complete")), (1, 0));
    assert_eq!(warm.stats().cubin_loads, 1);

    // Other options: another entry.
    warm.find_or_build_source(ctx(c0), SOURCE, &["-DSCALE=3"], &[])
        .unwrap();
    assert_eq!(nvrtc.compiles(), 2);

    // A newer NVRTC may emit other PTX: its cubins are not reused.
    nvrtc.set_version(12, 9);
    let upgraded = cache(&driver, nvrtc.nvrtc(), Some(dir.path()));
    upgraded
        .find_or_build_source(ctx(c0), SOURCE, &["-DSCALE=2"], &[])
        .unwrap();
    assert_eq!(nvrtc.compiles(), 3);
    assert_eq!(upgraded.stats().cubin_loads, 0);
}

#[test]
fn a_compile_error_is_a_build_error_with_the_log() {
    let (driver, _nvrtc, c0, cache) = memory_only();
    match cache.find_or_build_source(ctx(c0), "#error no\n", &[], &[]) {
        Err(Error::Build(e)) => {
            assert_eq!(e.code, 6, "NVRTC_ERROR_COMPILATION");
            assert!(e.message.contains("#error directive"), "{}", e.message);
        }
        other => panic!("expected a build error, got {other:?}"),
    }
    assert_eq!(driver.counter("link_create"), 0);
    let stats = cache.stats();
    assert_eq!(
        (stats.nvrtc_compiles, stats.nvrtc_failures, stats.links),
        (1, 1, 0)
    );
}

#[test]
fn no_nvrtc_is_unavailable() {
    assert_unavailable(
        Nvrtc::load_from(Path::new("/nonexistent/libnvrtc.so")),
        "cannot load NVRTC",
    );
    // The driver library is no NVRTC.
    let driver = FakeDriver::new();
    assert_unavailable(Nvrtc::load_from(driver.path()), "lacks nvrtcVersion");
}

/// JIT options are applied by the driver's linker to PTX only ("Compiler options will be applied
/// to inputs to this linker action which must be compiled from PTX"): an NVRTC cubin for a real
/// architecture (`-arch=sm_XY`) is loaded without a link, so JIT options given with it would be
/// dropped while still keying the module. The combination is refused before any compile.
#[test]
fn jit_options_with_a_real_architecture_are_refused() {
    let (driver, nvrtc, c0, cache) = memory_only();
    let jit = [JitOption::MaxRegisters(32)];
    for options in [&["-arch=sm_80"][..], &["--gpu-architecture", "sm_80"][..]] {
        match cache.find_or_build_source(ctx(c0), SOURCE, options, &jit) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains("sm_80"), "{message}")
            }
            other => panic!("{options:?}: expected an invalid argument, got {other:?}"),
        }
    }
    assert_eq!(nvrtc.compiles(), 0);
    assert_eq!(driver.counter("link_create"), 0);
    // A virtual architecture is linked, so it takes JIT options.
    cache
        .find_or_build_source(ctx(c0), SOURCE, &["-arch=compute_80"], &jit)
        .unwrap();
    assert_eq!(driver.counter("last_max_registers"), 32);
}

/// `-dlto` makes NVRTC generate LTO IR and no cubin: `nvrtcGetCUBINSize` sets 0. An empty image
/// is never handed to `cuModuleLoadDataEx`, which takes no size and would read a header from
/// the empty buffer's dangling pointer: the lookup fails as a build error.
#[test]
fn an_empty_nvrtc_cubin_is_a_build_error_not_a_load() {
    let (driver, nvrtc, c0, cache) = memory_only();
    match cache.find_or_build_source(ctx(c0), SOURCE, &["-arch=sm_80", "-dlto"], &[]) {
        Err(Error::Build(e)) => assert!(e.message.contains("no cubin"), "{e}"),
        other => panic!("expected a build error, got {other:?}"),
    }
    assert_eq!(nvrtc.compiles(), 1);
    assert_eq!(
        driver.counter("module_load") + driver.counter("module_load_failed"),
        0
    );
    assert_eq!(cache.stats().nvrtc_failures, 1);
}

/// NVRTC takes an option and its value as one string or as two (`"--gpu-architecture"
/// "compute_80"`): the two-string form names the architecture too, so kcache adds none of its
/// own and links the PTX for `compute_80` instead of loading a cubin for the device.
#[test]
fn an_architecture_given_as_two_strings_is_the_callers() {
    let (_driver, nvrtc, c0, cache) = memory_only();
    let lease = cache
        .find_or_build_source(ctx(c0), SOURCE, &["--gpu-architecture", "compute_80"], &[])
        .unwrap();
    assert!(!lease.function("scale").unwrap().is_null());
    assert_eq!(nvrtc.last_arch(), "compute_80");
    assert_eq!(cache.stats().links, 1, "PTX, linked");
}

/// NVRTC makes the cubins of CUDA C++ itself, so its build is part of the disk key: a patch
/// release (same `nvrtcVersion`, another `libnvrtc.so.12.4.<patch>`) compiles anew instead of
/// reusing the older compiler's cubins; the same build hits.
#[test]
fn the_disk_key_holds_the_nvrtc_build() {
    let driver = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let c0 = driver.create_context(0);
    let lookup = |nvrtc: &FakeNvrtc| {
        let cache = cache(&driver, nvrtc.nvrtc(), Some(dir.path()));
        cache
            .find_or_build_source(ctx(c0), SOURCE, &[], &[])
            .unwrap();
        cache.flush();
        let stats = cache.stats();
        (stats.nvrtc_compiles, stats.cubin_loads)
    };
    let old = FakeNvrtc::with_build("12.4.127");
    assert_eq!(old.nvrtc().build(), "libnvrtc.so.12.4.127");
    assert_eq!(lookup(&old), (1, 0));
    assert_eq!(lookup(&FakeNvrtc::with_build("12.4.127")), (0, 1));
    let patched = FakeNvrtc::with_build("12.4.131");
    assert_eq!(patched.nvrtc().version(), old.nvrtc().version());
    assert_eq!(lookup(&patched), (1, 0));
}

/// An NVRTC newer than the driver makes PTX the driver's JIT refuses: when the PTX path is
/// needed (JIT options here), the lookup fails before compiling, with the driver's code for it
/// (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`) and what to do instead.
#[test]
fn ptx_from_an_nvrtc_newer_than_the_driver_is_refused_before_compiling() {
    let (driver, nvrtc) = (FakeDriver::new(), FakeNvrtc::new());
    nvrtc.set_version(13, 0);
    let c0 = driver.create_context(0);
    let cache = cache(&driver, nvrtc.nvrtc(), None);
    let jit = [JitOption::MaxRegisters(32)];
    for options in [&[][..], &["-arch=compute_80"][..]] {
        match cache.find_or_build_source(ctx(c0), SOURCE, options, &jit) {
            Err(Error::Build(e)) => {
                assert_eq!(e.code, 222, "{e}");
                assert!(e.message.contains("--maxrregcount"), "{e}");
            }
            other => panic!("{options:?}: expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(nvrtc.compiles(), 0, "nothing compiled");
    assert_eq!(driver.counter("link_create"), 0);
}

/// The fake NVRTC reads no header; kcache does, and keys them (`docs/cuda.md`).
#[test]
fn a_changed_header_is_compiled_again_and_a_computed_include_is_cached_nowhere() {
    let (_driver, nvrtc, c0, cache) = memory_only();
    let headers = tempfile::tempdir().unwrap();
    let header = headers.path().join("scale.cuh");
    std::fs::write(&header, "#define SCALE 2.0f\n").unwrap();
    let include = format!("--include-path={}", headers.path().display());
    let options = [include.as_str()];
    let keyed = format!("#include \"scale.cuh\"\n{SOURCE}");
    let build = |source: &str| {
        cache
            .find_or_build_source(ctx(c0), source, &options, &[])
            .unwrap()
    };
    drop(build(&keyed));
    drop(build(&keyed));
    assert_eq!(nvrtc.compiles(), 1);
    std::fs::write(&header, "#define SCALE 3.0f\n").unwrap();
    drop(build(&keyed));
    assert_eq!(
        nvrtc.compiles(),
        2,
        "a changed header served its old module"
    );
    let computed = format!("#define HEADER \"scale.cuh\"\n#include HEADER\n{SOURCE}");
    drop(build(&computed));
    drop(build(&computed));
    assert_eq!(nvrtc.compiles(), 4);
    assert_eq!(cache.stats().passed_through, 2);
}
