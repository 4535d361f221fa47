//! The `kc_cuda_*` C API, called as C would call it.
//!
//! No GPU is available in CI: the test-kit's `FakeDriver` is a private copy of its build of
//! `c-tests/cuda/fake_cuda.c`, a test library that stands in for the real driver
//! (`libcuda.so.1`); the cache is pointed at it through `kc_cuda_options.driver_library`.
//! The remote tier test starts a `redis-server` of its own on loopback.

use std::ffi::{CStr, CString, c_void};
use std::ptr;

use kcache::ffi::cuda::*;
use kcache::ffi::persistence::*;
use kcache::ffi::persistence_stats::*;
use kcache::ffi::{kc_last_build_error, kc_status};
use kcache_testkit::cuda::SAXPY_PTX;
use kcache_testkit::cuda::{FakeDriver, FakeNvrtc};
use kcache_testkit::ffi::last_error;

/// A cache and the persistent tiers it was given (`kc_persistence_none()` for none).
struct Cache(*mut kc_cuda_cache, *mut kc_persistence);

impl Drop for Cache {
    fn drop(&mut self) {
        // SAFETY: a cache from kc_cuda_cache_new and the caller's reference to its tiers (or
        // the marker), each freed once.
        unsafe {
            kc_cuda_cache_free(self.0);
            kc_persistence_free(self.1);
        }
    }
}

impl Cache {
    /// `kc_cuda_cache_find_or_build_ptx` on a live context, asserted to succeed: the lease.
    fn ptx_lease(
        &self,
        context: *mut c_void,
        ptx: &CStr,
        ptx_len: usize,
        jit: &[kc_cuda_jit_option],
    ) -> *mut kc_cuda_lease {
        let mut lease = ptr::null_mut();
        // SAFETY: a live cache and context, NUL-terminated PTX of at least `ptx_len` bytes,
        // `jit.len()` options and a writable out-pointer.
        let status = unsafe {
            kc_cuda_cache_find_or_build_ptx(
                self.0,
                context,
                ptx.as_ptr(),
                ptx_len,
                jit.as_ptr(),
                jit.len(),
                &mut lease,
            )
        };
        assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        lease
    }

    /// `kc_cuda_cache_find_or_build_source` of NUL-terminated `source` with NVRTC `options` and
    /// no JIT options: the status and the lease (NULL unless KC_OK).
    fn source_lease(
        &self,
        context: *mut c_void,
        source: &CStr,
        options: &[*const std::ffi::c_char],
    ) -> (kc_status, *mut kc_cuda_lease) {
        let mut lease = ptr::null_mut();
        // SAFETY: a live cache and context, a NUL-terminated source, `options.len()` option
        // strings and a writable out-pointer.
        let status = unsafe {
            kc_cuda_cache_find_or_build_source(
                self.0,
                context,
                source.as_ptr(),
                0,
                options.as_ptr(),
                options.len(),
                ptr::null(),
                0,
                &mut lease,
            )
        };
        (status, lease)
    }

    fn tiers_stats(&self) -> kc_persistence_statistics {
        kcache_testkit::c_stats!(kc_persistence_stats, self.1, kc_persistence_statistics)
    }
}

fn new_cache(fake: &FakeDriver, disk: Option<&std::path::Path>) -> Cache {
    new_cache_with(fake, disk, |_| ())
}

/// As [`new_cache`], with more options of the persistent tiers set by `more` (its strings must
/// outlive the call).
fn new_cache_with(
    fake: &FakeDriver,
    disk: Option<&std::path::Path>,
    more: impl FnOnce(&mut kc_persistence_options),
) -> Cache {
    let library = CString::new(fake.path().to_str().unwrap()).unwrap();
    let tiers = match disk {
        None => kc_persistence_none(),
        Some(dir) => {
            let dir = CString::new(dir.to_str().unwrap()).unwrap();
            let mut opts = kc_persistence_options_default();
            opts.dir = dir.as_ptr();
            more(&mut opts);
            let mut tiers = ptr::null_mut();
            // SAFETY: valid options (strings live for the call) and out-pointer.
            let status = unsafe { kc_persistence_open(&opts, &mut tiers) };
            assert_eq!(status, kc_status::KC_OK, "{}", last_error());
            tiers
        }
    };
    let mut opts = kc_cuda_options_default();
    opts.driver_library = library.as_ptr();
    let mut cache = ptr::null_mut();
    // SAFETY: valid options, persistent tiers (or none) and out-pointer.
    let status = unsafe { kc_cuda_cache_new(&opts, tiers, &mut cache) };
    assert_eq!(status, kc_status::KC_OK, "{}", last_error());
    Cache(cache, tiers)
}

fn stats(cache: &Cache) -> kc_cuda_cache_statistics {
    kcache_testkit::c_stats!(kc_cuda_cache_stats, cache.0, kc_cuda_cache_statistics)
}

#[test]
fn module_function_evict_release_through_the_c_api() {
    let fake = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let cache = new_cache(&fake, Some(&dir.path().join("l2")));
    let ctx = fake.create_context(0);
    let ptx = CString::new(SAXPY_PTX).unwrap();
    let jit = [kc_cuda_jit_option {
        option: 0, // CU_JIT_MAX_REGISTERS
        value: 40,
    }];
    // NUL-terminated PTX (length 0), one option.
    let lease = cache.ptx_lease(ctx, &ptx, 0, &jit);
    assert_eq!(fake.counter("last_max_registers"), 40);

    // SAFETY: a live lease for every call below until it is released.
    unsafe {
        assert!(!kc_cuda_lease_module(lease).is_null());
        assert_eq!(kc_cuda_lease_context(lease), ctx);
        let mut function: *mut c_void = ptr::null_mut();
        let status = kc_cuda_lease_function(lease, c"saxpy".as_ptr(), &mut function);
        assert_eq!(status, kc_status::KC_OK);
        assert!(!function.is_null());
        let mut untouched: *mut c_void = ptr::null_mut();
        let status = kc_cuda_lease_function(lease, c"nope".as_ptr(), &mut untouched);
        assert_eq!(status, kc_status::KC_ERR_NOT_FOUND);
        assert!(
            untouched.is_null(),
            "out-parameters are written on success only"
        );
    }

    // The same PTX given with its length is the same module.
    let again = cache.ptx_lease(ctx, &ptx, SAXPY_PTX.len(), &jit);
    // SAFETY: live leases.
    unsafe { assert_eq!(kc_cuda_lease_module(again), kc_cuda_lease_module(lease)) };
    // SAFETY: released once.
    unsafe { kc_cuda_lease_release(again) };

    let s = stats(&cache);
    assert_eq!(
        (s.links, s.disk_misses, s.memory.hits, s.memory.misses),
        (1, 1, 1, 1)
    );
    // SAFETY: live cache.
    assert_eq!(unsafe { kc_cuda_driver_version(cache.0) }, 12040);

    let mut count = 0usize;
    // SAFETY: live cache, writable count.
    let status = unsafe { kc_cuda_cache_evict_context(cache.0, ctx, &mut count) };
    assert_eq!((status, count), (kc_status::KC_OK, 1));
    assert_eq!(fake.counter("module_unload"), 0, "still leased");
    // SAFETY: released once.
    unsafe { kc_cuda_lease_release(lease) };
    assert_eq!(fake.counter("module_unload"), 1);
    assert_eq!(fake.counter("unload_wrong_context"), 0);
    // SAFETY: live cache; NULL count is allowed.
    assert_eq!(
        unsafe { kc_cuda_cache_evict_device(cache.0, 0, ptr::null_mut()) },
        kc_status::KC_OK
    );
}

/// The remote tier from `kc_persistence_options` given to a CUDA cache: a cache links and
/// writes its cubin to the store; a second one, with another disk directory, loads it without
/// linking.
#[test]
fn the_remote_tier_from_the_cuda_options() {
    let fake = FakeDriver::new();
    let Some(server) = kcache_testkit::redis::RedisServer::start() else {
        return;
    };
    let url = CString::new(server.url()).unwrap();
    const KEY: [u8; 32] = [4; 32];
    let remote = |opts: &mut kc_persistence_options| {
        opts.key = KEY.as_ptr();
        opts.key_len = KEY.len();
        opts.remote_url = url.as_ptr();
        opts.remote_timeout_ms = 2000;
    };
    let ptx = CString::new(SAXPY_PTX).unwrap();
    let ctx = fake.create_context(0);
    let lookup = |cache: &Cache| {
        let lease = cache.ptx_lease(ctx, &ptx, 0, &[]);
        // SAFETY: released once; the cache is live.
        unsafe {
            kc_cuda_lease_release(lease);
            assert_eq!(kc_cuda_cache_flush(cache.0), kc_status::KC_OK);
        }
        (stats(cache), cache.tiers_stats())
    };
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, tiers) = lookup(&new_cache_with(&fake, Some(a_dir.path()), remote));
    assert_eq!((a.links, a.cubin_loads), (1, 0));
    assert_eq!((tiers.remote, tiers.remote_puts), (true, 1));
    assert_eq!(server.keys().len(), 1);
    let (b, tiers) = lookup(&new_cache_with(&fake, Some(b_dir.path()), remote));
    assert_eq!((b.links, b.cubin_loads, tiers.remote_hits), (0, 1, 1));
}

#[test]
fn failures_map_to_statuses() {
    let fake = FakeDriver::new();
    let cache = new_cache(&fake, None);
    let ctx = fake.create_context(0);
    let mut lease = ptr::null_mut();

    // SAFETY: every call passes a live cache/context or deliberately NULL arguments.
    unsafe {
        let status = kc_cuda_cache_find_or_build_ptx(
            cache.0,
            ctx,
            c"not ptx".as_ptr(),
            0,
            ptr::null(),
            0,
            &mut lease,
        );
        assert_eq!(status, kc_status::KC_ERR_BUILD_FAILED);
        assert_eq!(kc_last_build_error(), 218);
        assert!(last_error().contains("ptxas fatal"), "{}", last_error());
        assert!(lease.is_null());

        let bad = [kc_cuda_jit_option {
            option: 5, // CU_JIT_ERROR_LOG_BUFFER: kcache's own
            value: 0,
        }];
        let ptx = CString::new(SAXPY_PTX).unwrap();
        let status = kc_cuda_cache_find_or_build_ptx(
            cache.0,
            ctx,
            ptx.as_ptr(),
            0,
            bad.as_ptr(),
            1,
            &mut lease,
        );
        assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
        let status = kc_cuda_cache_find_or_build_ptx(
            cache.0,
            ctx,
            ptx.as_ptr(),
            0,
            ptr::null(),
            1,
            &mut lease,
        );
        assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
        let status = kc_cuda_cache_find_or_build_ptx(
            cache.0,
            ctx,
            ptr::null(),
            0,
            ptr::null(),
            0,
            &mut lease,
        );
        assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("ptx is NULL"), "{}", last_error());
        // No context given and none current.
        let status = kc_cuda_cache_find_or_build_ptx(
            cache.0,
            ptr::null_mut(),
            ptx.as_ptr(),
            0,
            ptr::null(),
            0,
            &mut lease,
        );
        assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
        assert!(lease.is_null());

        assert_eq!(
            kc_cuda_cache_evict_context(ptr::null_mut(), ctx, ptr::null_mut()),
            kc_status::KC_ERR_INVALID_ARGUMENT
        );
        assert!(kc_cuda_lease_module(ptr::null()).is_null());
        assert_eq!(kc_cuda_driver_version(ptr::null()), 0);
        kc_cuda_lease_release(ptr::null_mut());
        kc_cuda_cache_free(ptr::null_mut());

        let mut small = kc_cuda_cache_statistics {
            struct_size: 8,
            ..kc_cuda_cache_statistics::default()
        };
        assert_eq!(
            kc_cuda_cache_stats(cache.0, &mut small),
            kc_status::KC_ERR_INVALID_ARGUMENT
        );
    }
    assert_eq!(stats(&cache).link_failures, 1);
}

#[test]
fn no_driver_is_unavailable() {
    let mut opts = kc_cuda_options_default();
    opts.driver_library = c"/nonexistent/libcuda.so.1".as_ptr();
    let mut cache = ptr::null_mut();
    // SAFETY: valid options and out-pointer.
    let status = unsafe { kc_cuda_cache_new(&opts, kc_persistence_none(), &mut cache) };
    assert_eq!(status, kc_status::KC_ERR_UNAVAILABLE);
    assert!(cache.is_null());
    assert!(last_error().contains("no CUDA driver"), "{}", last_error());
}

/// A cache on the driver and the NVRTC library at these paths, with no persistent tier.
fn nvrtc_cache(driver: &std::path::Path, nvrtc: &std::path::Path) -> Cache {
    let library = CString::new(driver.to_str().unwrap()).unwrap();
    let nvrtc_library = CString::new(nvrtc.to_str().unwrap()).unwrap();
    let mut opts = kc_cuda_options_default();
    opts.driver_library = library.as_ptr();
    opts.nvrtc_library = nvrtc_library.as_ptr();
    let mut raw = ptr::null_mut();
    // SAFETY: valid options and out-pointer.
    assert_eq!(
        unsafe { kc_cuda_cache_new(&opts, kc_persistence_none(), &mut raw) },
        kc_status::KC_OK
    );
    Cache(raw, kc_persistence_none())
}

#[test]
fn cuda_source_through_nvrtc() {
    // `fake_nvrtc.c` stands in for NVRTC: no CUDA toolkit is installed in CI.
    let (fake, nvrtc) = (FakeDriver::new(), FakeNvrtc::new());
    let cache = nvrtc_cache(fake.path(), nvrtc.path());
    let ctx = fake.create_context(1);
    let source = c"extern \"C\" __global__ void scale(float *x) { x[0] *= 2.0f; }";
    let options = [c"-DSCALE=2".as_ptr(), c"-lineinfo".as_ptr()];
    let mut lease = ptr::null_mut();
    // SAFETY: live cache and context; NUL-terminated source; two option strings.
    unsafe {
        let status = kc_cuda_cache_find_or_build_source(
            cache.0,
            ctx,
            source.as_ptr(),
            0,
            options.as_ptr(),
            2,
            ptr::null(),
            0,
            &mut lease,
        );
        assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        let mut function: *mut c_void = ptr::null_mut();
        let status = kc_cuda_lease_function(lease, c"scale".as_ptr(), &mut function);
        assert_eq!(status, kc_status::KC_OK);
        kc_cuda_lease_release(lease);

        let status = kc_cuda_cache_find_or_build_source(
            cache.0,
            ctx,
            c"#error broken".as_ptr(),
            0,
            ptr::null(),
            0,
            ptr::null(),
            0,
            &mut lease,
        );
        assert_eq!(status, kc_status::KC_ERR_BUILD_FAILED);
        assert_eq!(kc_last_build_error(), 6, "NVRTC_ERROR_COMPILATION");
        assert!(
            last_error().contains("#error directive"),
            "{}",
            last_error()
        );

        // JIT options only apply to PTX: with NVRTC's own cubin (a real architecture) they
        // would be dropped, so the combination is refused before compiling.
        let real = [c"-arch".as_ptr(), c"sm_90".as_ptr()];
        let jit = [kc_cuda_jit_option {
            option: 0, // CU_JIT_MAX_REGISTERS
            value: 32,
        }];
        let status = kc_cuda_cache_find_or_build_source(
            cache.0,
            ctx,
            source.as_ptr(),
            0,
            real.as_ptr(),
            2,
            jit.as_ptr(),
            1,
            &mut lease,
        );
        assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("sm_90"), "{}", last_error());
    }
    assert_eq!(nvrtc.compiles(), 2);
    assert_eq!(
        nvrtc.last_arch(),
        "sm_90",
        "a cubin for device 1's architecture"
    );
    let s = stats(&cache);
    // NVRTC's cubin is loaded as it is: no link.
    assert_eq!((s.nvrtc_compiles, s.nvrtc_failures, s.links), (2, 1, 0));

    let library = CString::new(fake.path().to_str().unwrap()).unwrap();
    let mut opts = kc_cuda_options_default();
    opts.driver_library = library.as_ptr();
    opts.nvrtc_library = c"/nonexistent/libnvrtc.so".as_ptr();
    let mut none = ptr::null_mut();
    // SAFETY: valid options and out-pointer.
    let status = unsafe { kc_cuda_cache_new(&opts, kc_persistence_none(), &mut none) };
    assert_eq!(status, kc_status::KC_ERR_UNAVAILABLE);
    assert!(none.is_null());
}

/// NVIDIA's NVRTC through the C API (`tests/cuda_real_nvrtc.rs` says how it is installed; the
/// stand-in driver loads its cubins): a kernel compiles for the 9.0 device; a failing compile
/// is KC_ERR_BUILD_FAILED with NVRTC_ERROR_COMPILATION and NVRTC's own log.
#[test]
fn nvidias_nvrtc_through_the_c_api() {
    use kcache_testkit::nvrtc::{NVRTC12, NVRTC13, real_nvrtc};
    let Some(nvrtcs) = [NVRTC13, NVRTC12]
        .into_iter()
        .map(real_nvrtc)
        .collect::<Option<Vec<_>>>()
    else {
        return;
    };
    for nvrtc in nvrtcs {
        let fake = FakeDriver::new();
        fake.set_version(13020);
        let cache = nvrtc_cache(fake.path(), nvrtc.path());
        let ctx = fake.create_context(1);
        let arch = [c"-arch=sm_90".as_ptr()];
        let kernel = c"extern \"C\" __global__ void twice(float *x) { x[0] *= 2.0f; }";
        let (status, lease) = cache.source_lease(ctx, kernel, &arch);
        assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        let mut function: *mut c_void = ptr::null_mut();
        // SAFETY: a live lease, a NUL-terminated name and a writable out-pointer; the lease is
        // released once.
        unsafe {
            assert_eq!(
                kc_cuda_lease_function(lease, c"twice".as_ptr(), &mut function),
                kc_status::KC_OK
            );
            kc_cuda_lease_release(lease);
        }
        let broken = c"extern \"C\" __global__ void k(float *x) { x[0] = missing_name; }";
        let (status, _) = cache.source_lease(ctx, broken, &arch);
        assert_eq!(status, kc_status::KC_ERR_BUILD_FAILED);
        assert_eq!(kc_last_build_error(), 6, "NVRTC_ERROR_COMPILATION");
        let message = last_error();
        assert!(message.contains("missing_name"), "{message}");
        assert!(message.contains("is undefined"), "{message}");
        assert_eq!(fake.counter("module_load_elf"), 1);
        let s = stats(&cache);
        assert_eq!((s.nvrtc_compiles, s.nvrtc_failures, s.links), (2, 1, 0));
    }
}
