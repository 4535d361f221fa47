//! The CUDA module cache for C: `kc_cuda_*`.
//!
//! CUDA handles cross this boundary as `void *` so that `kcache.h` does not need `cuda.h`:
//! pass a `CUcontext` as it is, and cast the `void *` results back to `CUmodule` and
//! `CUfunction`. The driver is loaded at run time; without one, `kc_cuda_cache_new` returns
//! `KC_ERR_UNAVAILABLE`.
//!
//! ```c
//! #include <cuda.h>
//! #include <kcache.h>
//!
//! kc_cuda_options opts = kc_cuda_options_default();
//! kc_cuda_cache *cache;                           // NULL: the environment's persistent tiers
//! if (kc_cuda_cache_new(&opts, NULL, &cache) != KC_OK) {
//!     puts(kc_last_error_message());
//!     return 1;
//! }
//!
//! kc_cuda_jit_option jit[] = { { 0 /* CU_JIT_MAX_REGISTERS */, 32 } };
//! kc_cuda_lease *lease;
//! kc_status s = kc_cuda_cache_find_or_build_ptx(cache, ctx, ptx_text, 0, jit, 1, &lease);
//! if (s != KC_OK) { puts(kc_last_error_message()); return 1; }   // the JIT log on BUILD_FAILED
//! CUfunction saxpy;
//! kc_cuda_lease_function(lease, "saxpy", (void **)&saxpy);
//! cuLaunchKernel(saxpy, ...);                     // valid until the lease is released
//! kc_cuda_lease_release(lease);
//!
//! kc_cuda_cache_evict_context(cache, ctx, NULL);        // before cuCtxDestroy(ctx)
//! kc_cuda_cache_free(cache);
//! ```

#![allow(non_camel_case_types)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;
use std::sync::Arc;

use super::args::{
    c_statistics, c_str, elements, free_boxed, lease_handle, lease_into_raw, live_lease,
    optional_path, read_lease, release_lease, write_optional,
};
use super::backend_common::{
    backend_handles, clear, evict_by, new_cache, reset_stats, with_cache, write_stats,
};
use super::cache::kc_cache_stats;
use super::persistence::kc_persistence;
use super::status::{byte_slice, guard, guard_value, kc_status, non_null, null_argument};
use crate::backend::cuda::{
    Context, CudaCache, CudaOptions, CudaStats, Driver, JitOption, Module, ModuleLease, Nvrtc,
};
use crate::error::Error;

/// A CUDA module cache. Create with `kc_cuda_cache_new`, free with `kc_cuda_cache_free`.
pub struct kc_cuda_cache {
    inner: CudaCache,
}

/// A lease on a cached module: the module stays loaded until `kc_cuda_lease_release`, even if
/// it is evicted meanwhile.
pub struct kc_cuda_lease {
    _opaque: [u8; 0],
}

lease_handle!(kc_cuda_lease, Module);

/// How a CUDA cache behaves. Start from `kc_cuda_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_cuda_options {
    pub struct_size: usize,
    /// Modules kept in memory at most; 0 = unlimited.
    pub max_entries: u64,
    /// Total bytes of cubins kept in memory at most; 0 = unlimited.
    pub max_weight: u64,
    /// The driver library to load; NULL: `KCACHE_CUDA_LIBRARY`, else `libcuda.so.1`.
    pub driver_library: *const c_char,
    /// The NVRTC library for `kc_cuda_cache_find_or_build_source`; NULL: `KCACHE_NVRTC_LIBRARY`,
    /// else the driver's own release and then the others (`docs/cuda.md`), on first use.
    pub nvrtc_library: *const c_char,
}

backend_handles!(
    kc_cuda_options,
    kc_cuda_options_default,
    kc_cuda_cache,
    CudaCache,
    kc_cuda_cache_statistics,
    abi_3_0: { options: 40, statistics: 200 until passed_through },
);

/// One JIT option for the PTX link: a `CUjit_option` number and its integer value. Accepted:
/// MAX_REGISTERS (0), THREADS_PER_BLOCK (1, not with TARGET), OPTIMIZATION_LEVEL (7), TARGET
/// (9), GENERATE_DEBUG_INFO (11), LOG_VERBOSE (12: the JIT log goes to kcache's log at `info`),
/// GENERATE_LINE_INFO (13), CACHE_MODE (14); any other is `KC_ERR_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kc_cuda_jit_option {
    pub option: u32,
    pub value: u32,
}

/// Counters of a CUDA cache. Set `struct_size` to `sizeof(kc_cuda_cache_statistics)` first.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kc_cuda_cache_statistics {
    pub struct_size: usize,
    /// The memory tier's counters; its `struct_size` is set too.
    pub memory: kc_cache_stats,
    /// PTX linked into a cubin.
    pub links: u64,
    /// Links that failed (the caller got `KC_ERR_BUILD_FAILED`).
    pub link_failures: u64,
    /// Modules loaded from a disk cubin without any PTX JIT.
    pub cubin_loads: u64,
    /// Disk cubins the driver refused; each was deleted and the PTX linked again.
    pub cubins_rejected: u64,
    /// Disk lookups that found a cubin.
    pub disk_hits: u64,
    /// Disk lookups that found none.
    pub disk_misses: u64,
    /// Disk reads or writes that failed (the lookup went on without the disk).
    pub disk_errors: u64,
    /// CUDA C++ sources compiled to PTX by NVRTC.
    pub nvrtc_compiles: u64,
    /// NVRTC compiles that failed (the caller got `KC_ERR_BUILD_FAILED`).
    pub nvrtc_failures: u64,
    /// Added in 3.1. CUDA C++ builds kcache could not key (a computed `#include`, an option
    /// that reads a file), compiled and cached nowhere; counted in `nvrtc_compiles` too.
    pub passed_through: u64,
}

c_statistics!(CudaStats => kc_cuda_cache_statistics {
    links, link_failures, cubin_loads, cubins_rejected, disk_hits, disk_misses,
    disk_errors, nvrtc_compiles, nvrtc_failures, passed_through,
} into { memory });

/// Unbounded memory caps, the default driver and NVRTC.
#[unsafe(no_mangle)]
pub extern "C" fn kc_cuda_options_default() -> kc_cuda_options {
    kc_cuda_options {
        struct_size: size_of::<kc_cuda_options>(),
        max_entries: 0,
        max_weight: 0,
        driver_library: ptr::null(),
        nvrtc_library: ptr::null(),
    }
}

/// Creates a CUDA cache and loads the driver (see `driver_library`). No driver, or one whose
/// `cuInit` fails (no GPU): `KC_ERR_UNAVAILABLE`. The cache keeps its cubins in `persistence`
/// (see `kc_persistence`) and holds its own reference to it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_new(
    opts: *const kc_cuda_options,
    persistence: *mut kc_persistence,
    out_cache: *mut *mut kc_cuda_cache,
) -> kc_status {
    let make = |opts: &kc_cuda_options, memory, disk| {
        // SAFETY: C strings or NULL by contract.
        let library = unsafe { optional_path(opts.driver_library, "driver_library") }?;
        let driver = match library {
            Some(path) => Driver::load_from(&path)?,
            None => Driver::load()?,
        };
        // SAFETY: C string or NULL by contract.
        let nvrtc = match unsafe { optional_path(opts.nvrtc_library, "nvrtc_library") }? {
            // Loaded now rather than on first use: the caller named it, so a wrong path is an
            // error of this call.
            Some(path) => Some(Arc::new(Nvrtc::load_from(&path)?)),
            None => None,
        };
        let inner = CudaCache::new(CudaOptions {
            memory,
            persistence: disk,
            driver: Some(Arc::new(driver)),
            nvrtc,
        })?;
        Ok(kc_cuda_cache { inner })
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { new_cache(opts, persistence, out_cache, make) }
}

/// Frees the cache: modules no lease holds are unloaded now (each with its context current, which
/// must still be live), the others at their last lease release. Last call on `cache`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_free(cache: *mut kc_cuda_cache) {
    // SAFETY: the caller hands over the cache it got from `kc_cuda_cache_new`, or NULL.
    guard_value((), || unsafe { free_boxed(cache) })
}

/// The module for `ptx` linked with `options` in `context` (NULL: the calling thread's current
/// context): from memory, else from a cubin on disk, else linked from the PTX (concurrent
/// callers share one link). The module belongs to the cache: do not unload it; release the
/// lease instead.
///
/// `ptx_len` is the PTX length in bytes, or 0 when `ptx` is NUL-terminated. `options` holds
/// `option_count` entries (NULL when 0); giving one option twice is an invalid argument. A PTX or
/// link error is `KC_ERR_BUILD_FAILED`, with the `CUresult` in `kc_last_build_error()` and the JIT
/// error log in `kc_last_error_message()`. `context` must be NULL or a context of the cache's
/// driver, kept alive until evicted with `kc_cuda_cache_evict_context`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_find_or_build_ptx(
    cache: *mut kc_cuda_cache,
    context: *mut c_void,
    ptx: *const c_char,
    ptx_len: usize,
    options: *const kc_cuda_jit_option,
    option_count: usize,
    out_lease: *mut *mut kc_cuda_lease,
) -> kc_status {
    let build = |cache: &CudaCache, context, ptx: &[u8]| {
        // SAFETY: `option_count` entries by contract.
        let options = unsafe { jit_options(options, option_count) }?;
        cache.find_or_build_ptx(context, ptx, &options)
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { find_or_build(cache, context, (ptx, ptx_len, "ptx"), out_lease, build) }
}

/// The body of both lookups: checks the handles, reads the text (`len` bytes, or up to its NUL
/// when `len` is 0), and hands the caller a lease on the module `build` returns for it.
///
/// # Safety
/// As `kc_cuda_cache_find_or_build_ptx`, for the text named `name`.
unsafe fn find_or_build(
    cache: *mut kc_cuda_cache,
    context: *mut c_void,
    (text, len, name): (*const c_char, usize, &str),
    out_lease: *mut *mut kc_cuda_lease,
    build: impl FnOnce(&CudaCache, Option<Context>, &[u8]) -> Result<ModuleLease, Error>,
) -> kc_status {
    let find = |cache: &CudaCache| {
        non_null(text, name)?;
        non_null(out_lease, "out_lease")?;
        // SAFETY: `len` readable bytes, or NUL-terminated when 0, by contract.
        let text = unsafe { text_bytes(text, len, name) }?;
        // SAFETY: NULL or a live context kept until evicted, by contract.
        let lease = build(cache, unsafe { Context::from_raw(context) }, text)?;
        // SAFETY: `out_lease` is non-NULL and writable by contract.
        unsafe { out_lease.write(lease_into_raw(lease)) };
        Ok(())
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_cache(cache, find) }
}

/// The bytes of `text`: `len` of them, or up to its NUL when `len` is 0.
///
/// # Safety
/// `text` must be non-NULL, and readable for `len` bytes or NUL-terminated when `len` is 0.
unsafe fn text_bytes<'a>(text: *const c_char, len: usize, name: &str) -> Result<&'a [u8], Error> {
    if len == 0 {
        // SAFETY: NUL-terminated by contract when no length is given.
        Ok(unsafe { CStr::from_ptr(text) }.to_bytes())
    } else {
        // SAFETY: `len` readable bytes by contract.
        unsafe { byte_slice(text.cast(), len, name) }
    }
}

/// The C array of JIT options as Rust values.
///
/// # Safety
/// `options` must hold `count` entries when `count > 0`.
unsafe fn jit_options(
    options: *const kc_cuda_jit_option,
    count: usize,
) -> Result<Vec<JitOption>, Error> {
    // SAFETY: `count` entries by contract.
    let raw = unsafe { elements(options, count, "options") }?;
    raw.iter()
        .map(|o| JitOption::from_raw(o.option, o.value))
        .collect()
}

/// The module for CUDA C++ `source`, compiled by NVRTC with `nvrtc_options`: unless they name an
/// architecture, to a cubin for the context's device when NVRTC supports it and no JIT options are
/// given, else to PTX for the highest architecture NVRTC supports up to the device's, linked as by
/// `kc_cuda_cache_find_or_build_ptx`. Kernels are found by symbol name: declare them `extern "C"`.
/// JIT options with NVRTC options naming a real architecture (`sm_XY`, whose cubin is loaded
/// without a link, so JIT options would not apply) are `KC_ERR_INVALID_ARGUMENT`. PTX needed from
/// an NVRTC newer than the driver is `KC_ERR_BUILD_FAILED` with
/// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` (222) before any compile.
///
/// `source_len` is the source length in bytes, or 0 when `source` is NUL-terminated.
/// `nvrtc_options` holds `nvrtc_option_count` C strings (NULL when 0). No NVRTC library:
/// `KC_ERR_UNAVAILABLE`. A compile error is `KC_ERR_BUILD_FAILED`, with the `nvrtcResult` in
/// `kc_last_build_error()` and the compiler log in `kc_last_error_message()`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // One C call; a struct would only move the same fields.
pub unsafe extern "C" fn kc_cuda_cache_find_or_build_source(
    cache: *mut kc_cuda_cache,
    context: *mut c_void,
    source: *const c_char,
    source_len: usize,
    nvrtc_options: *const *const c_char,
    nvrtc_option_count: usize,
    jit_options: *const kc_cuda_jit_option,
    jit_option_count: usize,
    out_lease: *mut *mut kc_cuda_lease,
) -> kc_status {
    let build = |cache: &CudaCache, context, source: &[u8]| {
        let source = std::str::from_utf8(source)
            .map_err(|_| Error::InvalidArgument("source is not valid UTF-8".into()))?;
        // SAFETY: `nvrtc_option_count` pointers by contract.
        let pointers = unsafe { elements(nvrtc_options, nvrtc_option_count, "nvrtc_options") }?;
        let mut options = Vec::with_capacity(pointers.len());
        for &pointer in pointers {
            non_null(pointer, "nvrtc_options[i]")?;
            // SAFETY: each entry is a C string by contract.
            options.push(unsafe { c_str(pointer, "nvrtc_options[i]") }?);
        }
        // SAFETY: `jit_option_count` entries by contract.
        let jit = unsafe { self::jit_options(jit_options, jit_option_count) }?;
        cache.find_or_build_source(context, source, &options, &jit)
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        find_or_build(
            cache,
            context,
            (source, source_len, "source"),
            out_lease,
            build,
        )
    }
}

/// The leased `CUmodule`, as `void *`; NULL if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_lease_module(lease: *const kc_cuda_lease) -> *mut c_void {
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, ptr::null_mut(), |e| e.value().raw()) }
}

/// The `CUcontext` the leased module was loaded in, as `void *`: launch its kernels with it
/// current. NULL if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_lease_context(lease: *const kc_cuda_lease) -> *mut c_void {
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, ptr::null_mut(), |e| e.value().context()) }
}

/// `*out_function` receives the kernel `name` of the leased module as a `CUfunction` (`void *`),
/// valid until the lease is released. No such kernel: `KC_ERR_NOT_FOUND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_lease_function(
    lease: *const kc_cuda_lease,
    name: *const c_char,
    out_function: *mut *mut c_void,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live lease by contract.
        let module = unsafe { live_lease(lease) }?.value();
        non_null(name, "name")?;
        non_null(out_function, "out_function")?;
        // SAFETY: a C string by contract.
        let name = unsafe { c_str(name, "name") }?;
        let function = module.function(name)?;
        // SAFETY: `out_function` is non-NULL and writable by contract.
        unsafe { out_function.write(function) };
        Ok(())
    })
}

/// Releases a lease; the last release of an evicted module unloads it (with its context current).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_lease_release(lease: *mut kc_cuda_lease) {
    // SAFETY: the caller hands back a lease it owns, or NULL.
    guard_value((), || unsafe { release_lease(lease) })
}

/// Unlinks every module of `context`; call it before `cuCtxDestroy`. Each module is unloaded now
/// (with `context` current), or when its last lease is released. `*out_count` (if not NULL)
/// receives how many were unlinked. A NULL `context` is `KC_ERR_INVALID_ARGUMENT`: modules looked
/// up with a NULL context are recorded under the context that was current (`cuCtxGetCurrent`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_evict_context(
    cache: *mut kc_cuda_cache,
    context: *mut c_void,
    out_count: *mut usize,
) -> kc_status {
    let evict = |cache: &CudaCache, context| cache.evict_context(context);
    // SAFETY: forwarded from the caller's contract.
    unsafe { evict_by(cache, context, "context", out_count, evict) }
}

/// Unlinks every module of every context on `device` (a `CUdevice` ordinal). Required before
/// the last `cuDevicePrimaryCtxRelease` of the device's primary context and before
/// `cuDevicePrimaryCtxReset` / `cudaDeviceReset`: they destroy the context, and a primary
/// context retained again has the same address, which the cache would take for the old one.
/// `out_count` as for `kc_cuda_cache_evict_context`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_evict_device(
    cache: *mut kc_cuda_cache,
    device: c_int,
    out_count: *mut usize,
) -> kc_status {
    let evict = |cache: &CudaCache| {
        let count = cache.evict_device(device)?;
        // SAFETY: NULL or writable by contract.
        unsafe { write_optional(out_count, count) };
        Ok(())
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_cache(cache, evict) }
}

/// Unlinks every module (the disk keeps its cubins).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_clear(cache: *mut kc_cuda_cache) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { clear(cache) }
}

/// Waits until every cubin built so far is written to the disk tier (or failed to be: see
/// `failed_writes`). Cubins are written on a background thread after the lookup returns;
/// `kc_cuda_cache_free` waits for them too.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_flush(cache: *mut kc_cuda_cache) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        with_cache(cache, |cache| {
            cache.flush();
            Ok(())
        })
    }
}

/// `cuDriverGetVersion` of the cache's driver (e.g. 12040), or 0 if `cache` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_driver_version(cache: *const kc_cuda_cache) -> c_int {
    guard_value(0, || {
        if cache.is_null() {
            null_argument("cache");
            return 0;
        }
        // SAFETY: a live cache by contract.
        unsafe { &(*cache).inner }.driver().version()
    })
}

/// Fills `*out`, whose `struct_size` the caller set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_stats(
    cache: *const kc_cuda_cache,
    out: *mut kc_cuda_cache_statistics,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { write_stats(cache, out) }
}

/// Zeroes the event counters of the cache, of its memory tier and of its `kc_persistence`
/// (for every cache sharing it); gauges stay (`docs/c-api.md`, "Statistics reset by a baseline").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cuda_cache_reset_stats(cache: *mut kc_cuda_cache) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { reset_stats(cache) }
}

/// Whether a CUDA driver can be loaded and initialised here (`KCACHE_CUDA_LIBRARY`, else
/// `libcuda.so.1`): `KC_OK`, or `KC_ERR_UNAVAILABLE` with the reason in
/// `kc_last_error_message()`. A cache may name another driver in `kc_cuda_options`.
#[unsafe(no_mangle)]
pub extern "C" fn kc_cuda_available() -> kc_status {
    guard(|| crate::backend::cuda::Driver::load().map(drop))
}
