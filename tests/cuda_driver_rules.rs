//! The CUDA cache against what NVIDIA documents of the driver, on the test driver library.
//!
//! No GPU or CUDA driver can run in CI, so `kcache_testkit::cuda::FakeDriver` (a copy of
//! `c-tests/cuda/fake_cuda.c`) is a test double for `libcuda.so.1`. Each test here switches on
//! a documented driver behaviour in the stand-in (a load of a good image failing with
//! `CUDA_ERROR_OUT_OF_MEMORY`, say) and asserts what kcache does about it.

use std::sync::{Arc, Mutex, MutexGuard};

use tempfile::TempDir;

use kcache::Error;
use kcache::backend::cuda::{CUcontext, Context, CudaCache, CudaOptions, JitOption};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::cuda::{FakeDriver, FakeNvrtc, PrimaryContext, SAXPY_CUDA, SAXPY_PTX};

const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
const CUDA_ERROR_INVALID_CONTEXT: i32 = 201;
const CUDA_ERROR_NO_BINARY_FOR_GPU: i32 = 209;
const CUDA_ERROR_UNSUPPORTED_PTX_VERSION: i32 = 222;
const CUDA_ERROR_ILLEGAL_ADDRESS: i32 = 700;
const CUDA_ERROR_CONTEXT_IS_DESTROYED: i32 = 709;

fn ctx(raw: CUcontext) -> Option<Context> {
    // SAFETY: the fake driver created `raw`; no test here destroys a context.
    unsafe { Context::from_raw(raw) }
}

fn cache(fake: &FakeDriver, dir: &TempDir) -> CudaCache {
    let disk = Persistence::open(PersistenceConfig::in_dir(dir.path().join("l2"))).unwrap();
    CudaCache::new(CudaOptions {
        persistence: Some(Arc::new(disk)),
        driver: Some(fake.driver()),
        ..CudaOptions::default()
    })
    .unwrap()
}

/// A new driver; a disk tier in a new directory holding SAXPY's cubin for device 0; a context
/// there; and a fresh cache on that tier whose next cubin load fails with `code`.
fn next_load_fails(code: i32) -> (FakeDriver, TempDir, CUcontext, CudaCache) {
    let fake = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let c0 = fake.create_context(0);
    let cold = cache(&fake, &dir);
    cold.find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    cold.flush();
    assert_eq!(fake.counter("link_create"), 1);
    let warm = cache(&fake, &dir);
    fake.fail_next_loads(1, code);
    (fake, dir, c0, warm)
}

/// `cuModuleLoadDataEx` also fails for reasons that say nothing about the image: out of memory,
/// an invalid context, the sticky error of an earlier launch. Such a failure reaches the caller
/// with its `CUresult`, and the cubin stays on disk: the next lookup loads it, never links.
#[test]
fn a_load_failing_for_the_moment_keeps_the_cubin() {
    for code in [
        CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_INVALID_CONTEXT,
        CUDA_ERROR_ILLEGAL_ADDRESS,
    ] {
        let (fake, _dir, c0, warm) = next_load_fails(code);
        match warm.find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[]) {
            Err(Error::Build(e)) => {
                assert_eq!(e.code, code, "{e}");
                assert!(e.message.contains("cuModuleLoadDataEx"), "{e}");
            }
            other => panic!("code {code}: expected the load's error, got {other:?}"),
        }
        let stats = warm.stats();
        assert_eq!((stats.cubins_rejected, stats.links), (0, 0), "code {code}");
        assert_eq!(fake.counter("link_create"), 1, "code {code}: not relinked");

        let lease = warm
            .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
            .unwrap();
        assert!(!lease.function("saxpy").unwrap().is_null());
        let stats = warm.stats();
        assert_eq!((stats.cubin_loads, stats.links), (1, 0), "code {code}");
    }
}

/// The results that condemn the image itself (`CUDA_ERROR_INVALID_IMAGE`,
/// `CUDA_ERROR_NO_BINARY_FOR_GPU`, `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`) drop the cubin and
/// relink the PTX; the caller never sees them.
#[test]
fn a_load_refusing_the_image_relinks() {
    for code in [
        CUDA_ERROR_NO_BINARY_FOR_GPU,
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    ] {
        let (fake, _dir, c0, warm) = next_load_fails(code);
        warm.find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
            .unwrap();
        let stats = warm.stats();
        assert_eq!((stats.cubins_rejected, stats.links), (1, 1), "code {code}");
        assert_eq!(fake.counter("link_create"), 2, "code {code}");
    }
}

fn nvrtc_cache(fake: &FakeDriver, nvrtc: &FakeNvrtc) -> CudaCache {
    CudaCache::new(CudaOptions {
        driver: Some(fake.driver()),
        nvrtc: Some(nvrtc.nvrtc()),
        ..CudaOptions::default()
    })
    .unwrap()
}

/// The stand-in driver, a context on device 0 and a cache with the stand-in NVRTC.
fn on_device_0() -> (FakeDriver, CUcontext, CudaCache) {
    let fake = FakeDriver::new();
    let c0 = fake.create_context(0);
    let cache = nvrtc_cache(&fake, &FakeNvrtc::new());
    (fake, c0, cache)
}

/// Builds SAXPY from CUDA source on a context of `device`, with the stand-in NVRTC set up by
/// `configure`, and checks the kernel is there.
fn saxpy_from_source(
    device: i32,
    configure: impl FnOnce(&FakeNvrtc),
) -> (FakeDriver, FakeNvrtc, CUcontext, CudaCache) {
    let (fake, nvrtc) = (FakeDriver::new(), FakeNvrtc::new());
    configure(&nvrtc);
    let context = fake.create_context(device);
    let cache = nvrtc_cache(&fake, &nvrtc);
    let lease = cache
        .find_or_build_source(ctx(context), SAXPY_CUDA, &[], &[])
        .unwrap();
    assert!(!lease.function("saxpy").unwrap().is_null());
    drop(lease);
    (fake, nvrtc, context, cache)
}

/// PTX from an NVRTC newer than the driver names a PTX ISA the driver's JIT does not know
/// (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`). For a device NVRTC knows, kcache has NVRTC make the
/// cubin itself (`-arch=sm_XY`, `nvrtcGetCUBIN`): no driver JIT, so CUDA 13's NVRTC works on a
/// 12.4 driver. JIT options need the driver's JIT, and fail with the code the driver would give.
#[test]
fn an_nvrtc_newer_than_the_driver_compiles_straight_to_a_cubin() {
    let (fake, nvrtc, c0, cache) = saxpy_from_source(0, |nvrtc| nvrtc.set_version(13, 0));
    assert_eq!(nvrtc.last_arch(), "sm_80");
    assert_eq!((fake.counter("link_create"), cache.stats().links), (0, 0));

    let jit = [JitOption::MaxRegisters(32)];
    match cache.find_or_build_source(ctx(c0), SAXPY_CUDA, &[], &jit) {
        Err(Error::Build(e)) => assert_eq!(e.code, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "{e}"),
        other => panic!("expected the driver's PTX version error, got {other:?}"),
    }
    assert_eq!(nvrtc.compiles(), 1, "refused before compiling");
}

/// On a device newer than NVRTC knows (Blackwell with NVRTC 12.6, here device 1's 9.0 with an
/// NVRTC that stops at 8.6), the PTX targets the highest architecture NVRTC lists up to the
/// device's, and the driver JIT-compiles it for the device.
#[test]
fn a_device_beyond_nvrtc_gets_ptx_for_the_highest_architecture_nvrtc_knows() {
    let (_fake, nvrtc, _c1, cache) = saxpy_from_source(1, |nvrtc| nvrtc.set_max_arch(86));
    assert_eq!(nvrtc.last_arch(), "compute_86");
    assert_eq!(cache.stats().links, 1);
    assert_eq!(cache.nvrtc().unwrap().supported_archs().last(), Some(&86));
}

/// What NVIDIA documents as invalid for a link is refused before any driver call:
/// `CU_JIT_FALLBACK_STRATEGY` "cannot be used with cuLink* APIs", and `CU_JIT_THREADS_PER_BLOCK`
/// cannot be combined with `CU_JIT_TARGET`. (The stand-in refuses both too, as a build error.)
#[test]
fn jit_options_the_link_cannot_take_are_invalid_arguments() {
    let (fake, c0, cache) = on_device_0();
    for options in [
        vec![JitOption::FallbackStrategy(1)],
        vec![JitOption::ThreadsPerBlock(128), JitOption::Target(80)],
    ] {
        match cache.find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &options) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains("CU_JIT_"), "{message}")
            }
            other => panic!("{options:?}: expected an invalid argument, got {other:?}"),
        }
    }
    assert_eq!(fake.counter("link_create"), 0);
    // Each alone is fine.
    for option in [JitOption::ThreadsPerBlock(128), JitOption::Target(80)] {
        cache
            .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[option])
            .unwrap();
    }
    assert_eq!(fake.counter("link_create"), 2);
}

/// Held by each test that sets the process-wide log hook.
static LOG_HOOK: Mutex<()> = Mutex::new(());

/// Sets the log hook to collect kcache's messages at `info` and above, while the returned turn
/// is held: the hook is the process's, so the tests that set one take turns.
fn log_messages() -> (MutexGuard<'static, ()>, Arc<Mutex<Vec<String>>>) {
    let turn = LOG_HOOK.lock().unwrap_or_else(|e| e.into_inner());
    let messages = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&messages);
    kcache::log::set_level(kcache::log::Level::Info);
    kcache::log::set_hook(move |_, message| sink.lock().unwrap().push(message.to_owned()));
    (turn, messages)
}

/// `CU_JIT_LOG_VERBOSE` writes to the JIT's information log, which kcache passes and writes to
/// its own log at `info`.
#[test]
fn log_verbose_reaches_kcaches_log() {
    let (_turn, messages) = log_messages();
    let (_fake, c0, cache) = on_device_0();
    cache
        .find_or_build_ptx(
            ctx(c0),
            SAXPY_PTX.as_bytes(),
            &[JitOption::LogVerbose(true)],
        )
        .unwrap();
    kcache::log::reset_hook();
    let messages = messages.lock().unwrap();
    let info: Vec<_> = messages
        .iter()
        .filter(|m| m.contains("Compiling entry function 'saxpy' for 'sm_80'"))
        .collect();
    assert_eq!(info.len(), 1, "{messages:?}");
    assert!(info[0].contains("Used 8 registers"), "{}", info[0]);
}

/// `cuDriverGetVersion` is the CUDA release a driver supports (12040 for every 12.4 driver
/// build), but a driver update can change its PTX JIT: the disk key holds the driver build, the
/// real file name of the loaded `libcuda.so.1`, so cubins of another build are not reused.
#[test]
fn the_disk_key_holds_the_driver_build() {
    let dir = tempfile::tempdir().unwrap();
    let old = FakeDriver::with_build("550.54.15");
    assert_eq!(old.driver().build(), "libcuda.so.550.54.15");
    let c_old = old.create_context(0);
    let cold = cache(&old, &dir);
    cold.find_or_build_ptx(ctx(c_old), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    cold.flush();

    let same = FakeDriver::with_build("550.54.15");
    let c_same = same.create_context(0);
    let warm = cache(&same, &dir);
    warm.find_or_build_ptx(ctx(c_same), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!((warm.stats().cubin_loads, warm.stats().links), (1, 0));

    let new = FakeDriver::with_build("555.42.02");
    assert_eq!(new.driver().version(), old.driver().version());
    let c_new = new.create_context(0);
    let upgraded = cache(&new, &dir);
    upgraded
        .find_or_build_ptx(ctx(c_new), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(
        (upgraded.stats().cubin_loads, upgraded.stats().links),
        (0, 1)
    );
}

/// The driver's JIT refuses PTX whose `.target` is above the architecture it compiles for, as
/// ptxas does (`CUDA_ERROR_INVALID_PTX`). The repository's saxpy targets `sm_75`, the oldest
/// architecture CUDA 13 still compiles for: a link for `sm_70` is refused, one for the device
/// (8.0) is not.
#[test]
fn ptx_above_the_link_target_is_refused() {
    const CUDA_ERROR_INVALID_PTX: i32 = 218;
    assert!(SAXPY_PTX.contains("\n.target sm_75\n"));
    let (_fake, c0, cache) = on_device_0();
    match cache.find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[JitOption::Target(70)]) {
        Err(Error::Build(e)) => {
            assert_eq!(e.code, CUDA_ERROR_INVALID_PTX, "{e}");
            assert!(e.message.contains(".target"), "{e}");
        }
        other => panic!("expected the JIT's refusal, got {other:?}"),
    }
    cache
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[JitOption::Target(80)])
        .unwrap();
}

/// The last `cuDevicePrimaryCtxRelease` destroys the primary context, and the next retain makes
/// a new one at the same address, where the old modules are gone. The cache knows contexts by
/// address, so the caller evicts the device before the last release (and before a reset): the
/// modules are unloaded while their context lives, and the new context gets new ones.
#[test]
fn a_primary_context_is_evicted_before_its_last_release() {
    let fake = FakeDriver::new();
    let driver = fake.driver();
    let cache = nvrtc_cache(&fake, &FakeNvrtc::new());
    let lookup = |cache: &CudaCache| {
        let lease = cache.find_or_build_ptx(None, SAXPY_PTX.as_bytes(), &[])?;
        lease.function("saxpy").map(|_| lease.context())
    };

    // Evicted first: unloaded in the live context; the new context builds anew.
    let bound = PrimaryContext::bind(&driver, 0).unwrap();
    let first = lookup(&cache).unwrap();
    assert_eq!(cache.evict_device(0).unwrap(), 1);
    assert_eq!(fake.counter("module_unload"), 1);
    bound.release().unwrap();
    assert_eq!(fake.counter("primary_destroyed"), 1);
    let bound = PrimaryContext::bind(&driver, 0).unwrap();
    assert_eq!(lookup(&cache).unwrap(), first, "the same address");
    assert_eq!(fake.counter("link_create"), 2);

    // Not evicted: the memory tier hands out a module of the destroyed context.
    bound.release().unwrap();
    assert_eq!(fake.counter("primary_destroyed"), 2);
    let bound = PrimaryContext::bind(&driver, 0).unwrap();
    match lookup(&cache) {
        Err(Error::Backend(message)) => {
            assert!(message.contains("cuModuleGetFunction"), "{message}");
            assert!(message.contains("CUresult 709"), "{message}");
        }
        other => panic!("expected the stale module to fail, got {other:?}"),
    }
    assert_eq!(fake.counter("link_create"), 2, "a stale hit, not a build");
    // And its unload fails: CUDA_ERROR_CONTEXT_IS_DESTROYED (on a real driver, possibly
    // undefined behaviour), counted as a destroy error.
    match cache.evict_device(0) {
        Err(Error::Destroy(e)) => assert_eq!(e.code, CUDA_ERROR_CONTEXT_IS_DESTROYED, "{e}"),
        other => panic!("expected the stale unload to fail, got {other:?}"),
    }
    assert_eq!(cache.stats().memory.destroy_errors, 1);
    assert_eq!(fake.counter("unload_invalid"), 1);
    bound.release().unwrap();
}

/// `cuModuleGetFunction` needs a current context. A lease's kernel lookup from a thread with
/// none makes the module's context current for the call and leaves the thread as it was.
#[test]
fn a_kernel_is_found_from_a_thread_without_a_current_context() {
    let fake = FakeDriver::new();
    let c0 = ctx(fake.create_context(0));
    let cache = nvrtc_cache(&fake, &FakeNvrtc::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(fake.current().is_null());
            let lease = cache
                .find_or_build_ptx(c0, SAXPY_PTX.as_bytes(), &[])
                .unwrap();
            assert!(!lease.function("saxpy").unwrap().is_null());
            assert!(fake.current().is_null(), "the binding is restored");
        });
    });
    assert_eq!(fake.counter("get_function"), 1);
    // Every push popped; the one extra pop is the test's own, unbinding the new context.
    assert!(fake.counter("ctx_push") >= 1);
    assert_eq!(fake.counter("ctx_push") + 1, fake.counter("ctx_pop"));
}

/// `CU_JIT_TARGET` takes a `CUjit_target`: `CU_TARGET_COMPUTE_90A` is
/// `CU_COMPUTE_ACCELERATED_TARGET_BASE` (0x10000) + 90, code for a 9.0 device, not a capability
/// of its own; a value outside the enumeration is `CUDA_ERROR_INVALID_VALUE`.
#[test]
fn jit_target_values_are_cujit_targets() {
    const CU_TARGET_COMPUTE_90A: u32 = 0x10000 + 90;
    const CUDA_ERROR_INVALID_VALUE: i32 = 1;
    let fake = FakeDriver::new();
    let (c0, c1) = (fake.create_context(0), fake.create_context(1));
    let cache = nvrtc_cache(&fake, &FakeNvrtc::new());
    let target = [JitOption::Target(CU_TARGET_COMPUTE_90A)];
    let lease = cache
        .find_or_build_ptx(ctx(c1), SAXPY_PTX.as_bytes(), &target)
        .unwrap();
    assert!(!lease.function("saxpy").unwrap().is_null());
    // The same code on the 8.0 device: linked, then refused by the loader.
    match cache.find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &target) {
        Err(Error::Build(e)) => assert_eq!(e.code, CUDA_ERROR_NO_BINARY_FOR_GPU, "{e}"),
        other => panic!("expected the loader's refusal, got {other:?}"),
    }
    match cache.find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[JitOption::Target(81)]) {
        Err(Error::Build(e)) => assert_eq!(e.code, CUDA_ERROR_INVALID_VALUE, "{e}"),
        other => panic!("expected cuLinkCreate to refuse 81, got {other:?}"),
    }
}

/// The driver reads PTX as a C string whose NUL lies within the size given to `cuLinkAddData`,
/// and takes per-input options only where `cuda.h` lists them for the input type. kcache passes
/// the PTX with a NUL (whether or not the caller's text ends in one) and its options to
/// `cuLinkCreate` only: every option kcache accepts links.
#[test]
fn ptx_reaches_the_linker_nul_terminated_with_the_options_on_the_link() {
    let (fake, c0, cache) = on_device_0();
    let mut with_nul = SAXPY_PTX.as_bytes().to_vec();
    with_nul.push(0);
    let options = [
        JitOption::MaxRegisters(32),
        JitOption::OptimizationLevel(3),
        JitOption::Target(80),
        JitOption::GenerateDebugInfo(true),
        JitOption::LogVerbose(true),
        JitOption::GenerateLineInfo(true),
        JitOption::CacheMode(1),
    ];
    for ptx in [SAXPY_PTX.as_bytes(), &with_nul] {
        for options in [&[][..], &options[..]] {
            let lease = cache.find_or_build_ptx(ctx(c0), ptx, options).unwrap();
            assert!(!lease.function("saxpy").unwrap().is_null());
        }
    }
    assert_eq!(fake.counter("link_complete"), 4);
    assert_eq!(fake.counter("link_failed"), 0);
}

/// The driver writes the OUT value of an IN/OUT option (how much of a log buffer it filled)
/// back into the caller's option value array. kcache gives every link arrays of its own, so a
/// short log of one link never shrinks the buffer of the next: each verbose log arrives whole.
#[test]
fn option_values_written_back_by_one_link_do_not_reach_the_next() {
    let (_turn, messages) = log_messages();
    let (_fake, c0, cache) = on_device_0();
    let long_name = SAXPY_PTX.replace("saxpy", "saxpy_with_a_much_longer_kernel_name");
    for ptx in [SAXPY_PTX, &long_name] {
        cache
            .find_or_build_ptx(ctx(c0), ptx.as_bytes(), &[JitOption::LogVerbose(true)])
            .unwrap();
    }
    kcache::log::reset_hook();
    let messages = messages.lock().unwrap();
    for name in ["saxpy", "saxpy_with_a_much_longer_kernel_name"] {
        let whole = format!("Compiling entry function '{name}' for 'sm_80'");
        let logs: Vec<_> = messages
            .iter()
            .filter(|m| m.contains(&whole) && m.contains("Used 8 registers"))
            .collect();
        assert_eq!(logs.len(), 1, "{name}: {messages:?}");
    }
}

/// With lazy loading (the Linux default since CUDA 12.2) the driver loads a module's kernels
/// on first use, so a failure of the moment (out of memory) comes from `cuModuleGetFunction`,
/// not from the load. The lease reports it, and the next lookup of the kernel tries again: the
/// failure is neither cached nor a reason to rebuild.
#[test]
fn under_lazy_loading_a_load_failure_surfaces_at_the_kernel_lookup() {
    let (fake, _dir, c0, warm) = next_load_fails(CUDA_ERROR_OUT_OF_MEMORY);
    fake.lazy_loading(true);
    let lease = warm
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!((warm.stats().cubin_loads, warm.stats().links), (1, 0));
    match lease.function("saxpy") {
        Err(Error::Backend(message)) => assert!(message.contains("CUresult 2"), "{message}"),
        other => panic!("expected the deferred out-of-memory, got {other:?}"),
    }
    assert!(!lease.function("saxpy").unwrap().is_null());
    let again = warm
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(again.raw(), lease.raw());
    assert_eq!(fake.counter("link_create"), 1, "never relinked");
    assert_eq!(warm.stats().memory.hits, 1);
}
