//! The OpenCL program cache for C: `kc_opencl_*`.
//!
//! OpenCL handles cross this boundary as `void *` so that `kcache.h` does not need `CL/cl.h`:
//! pass a `cl_context` and a `cl_device_id` as they are, and cast the `void *` program back to
//! `cl_program`.
//!
//! ```c
//! #include <CL/cl.h>
//! #include <kcache.h>
//!
//! kc_opencl_options opts = kc_opencl_options_default();
//! kc_opencl_cache *cache;
//! // NULL: the process's persistent tiers, as the environment configures them
//! if (kc_opencl_cache_new(&opts, NULL, &cache) != KC_OK) { puts(kc_last_error_message()); return 1; }
//!
//! const char *sources[] = { "__kernel void twice(__global float *x)"
//!                           "{ x[get_global_id(0)] *= 2.0f; }" };
//! kc_opencl_lease *lease;
//! kc_status s =
//!     kc_opencl_cache_find_or_build(cache, context, device, sources, NULL, 1, "", &lease);
//! if (s != KC_OK) { puts(kc_last_error_message()); return 1; }   // a build log on BUILD_FAILED
//! cl_program program = (cl_program)kc_opencl_lease_program(lease);
//! cl_kernel kernel = clCreateKernel(program, "twice", &err);
//! // ... launch ...; the program stays valid until the lease is released
//! clReleaseKernel(kernel);
//! kc_opencl_lease_release(lease);
//!
//! kc_opencl_cache_evict_context(cache, context, NULL);  // before clReleaseContext(context)
//! kc_opencl_cache_free(cache);
//! ```
//!
//! `c-tests/opencl/example.c` is this example in full, compiled and run by the tests.
//!
//! Code that keeps its `cl_program`s and releases them itself uses
//! `kc_opencl_cache_find_or_build_program` instead: no lease, a reference of its own.

#![allow(non_camel_case_types)]

use std::ffi::{CStr, c_char, c_void};
use std::ptr;

use super::args::{
    c_statistics, c_str, elements, free_boxed, lease_handle, lease_into_raw, read_lease,
    release_lease,
};
use super::backend_common::{
    backend_handles, clear, evict_by, new_cache, reset_stats, with_cache, write_stats,
};
use super::buffer::kc_buffer;
use super::cache::kc_cache_stats;
use super::persistence::kc_persistence;
use super::status::{byte_slice, guard, guard_value, kc_status, non_null};
use crate::backend::opencl::{
    ContextRef, Device, OpenClCache, OpenClOptions, OpenClStats, Program, context_devices,
};
use crate::error::Error;

/// An OpenCL program cache. Create with `kc_opencl_cache_new`, free with `kc_opencl_cache_free`.
pub struct kc_opencl_cache {
    inner: OpenClCache,
}

/// A lease on a cached program: the program stays valid (and retained by the cache) until
/// `kc_opencl_lease_release`, even if it is evicted meanwhile.
pub struct kc_opencl_lease {
    _opaque: [u8; 0],
}

lease_handle!(kc_opencl_lease, Program);

/// How an OpenCL cache behaves. Start from `kc_opencl_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_opencl_options {
    pub struct_size: usize,
    /// Programs kept in memory at most; 0 = unlimited.
    pub max_entries: u64,
    /// Total weight of the programs kept in memory at most (a binary's size, or a source's
    /// length for a program built from source); 0 = unlimited.
    pub max_weight: u64,
}

backend_handles!(
    kc_opencl_options,
    kc_opencl_options_default,
    kc_opencl_cache,
    OpenClCache,
    kc_opencl_cache_statistics,
    abi_3_0: { options: 24, statistics: 176 until passed_through },
);

/// Counters of an OpenCL cache. Set `struct_size` to `sizeof(kc_opencl_cache_statistics)` first.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kc_opencl_cache_statistics {
    pub struct_size: usize,
    /// The memory tier's counters; its `struct_size` is set too.
    pub memory: kc_cache_stats,
    /// Programs compiled from source.
    pub source_builds: u64,
    /// Programs created from a binary found on disk.
    pub binary_loads: u64,
    /// Disk binaries the driver refused; each was deleted and the source compiled instead.
    pub binaries_rejected: u64,
    /// Disk lookups that found a binary.
    pub disk_hits: u64,
    /// Disk lookups that found none.
    pub disk_misses: u64,
    /// Disk reads or writes that failed (the lookup went on without the disk).
    pub disk_errors: u64,
    /// Added in 3.1. Builds kcache could not key (a computed `#include`, an option that reads
    /// a file), compiled and cached nowhere; counted in `source_builds` too.
    pub passed_through: u64,
}

c_statistics!(OpenClStats => kc_opencl_cache_statistics {
    source_builds, binary_loads, binaries_rejected, disk_hits, disk_misses, disk_errors,
    passed_through,
} into { memory });

/// Unbounded memory caps.
#[unsafe(no_mangle)]
pub extern "C" fn kc_opencl_options_default() -> kc_opencl_options {
    kc_opencl_options {
        struct_size: size_of::<kc_opencl_options>(),
        max_entries: 0,
        max_weight: 0,
    }
}

/// Creates an OpenCL cache; loads the OpenCL library on first use (`KCACHE_OPENCL_LIBRARY`, else
/// `libOpenCL.so.1`; none: `KC_ERR_UNAVAILABLE`). The cache keeps its binaries in `persistence`
/// (see `kc_persistence`) and holds its own reference to it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_new(
    opts: *const kc_opencl_options,
    persistence: *mut kc_persistence,
    out_cache: *mut *mut kc_opencl_cache,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        new_cache(opts, persistence, out_cache, |_, memory, disk| {
            let inner = OpenClCache::new(OpenClOptions {
                memory,
                persistence: disk,
            })?;
            Ok(kc_opencl_cache { inner })
        })
    }
}

/// Frees the cache: programs no lease holds are released now, the others at their last lease
/// release. It must be the last call on `cache`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_free(cache: *mut kc_opencl_cache) {
    // SAFETY: the caller hands over the cache it got from `kc_opencl_cache_new`, or NULL.
    guard_value((), || unsafe { free_boxed(cache) })
}

/// The built program for `sources` and `options` on `device` in `context`: from memory, else
/// from a binary on disk, else compiled (concurrent callers share one compile). The program
/// belongs to the cache: do not release it; release the lease instead.
///
/// `sources` holds `count` strings, concatenated in order as `clCreateProgramWithSource` does;
/// `lengths` gives their byte lengths, or is NULL when every string is NUL-terminated. `options` is
/// NULL or the `clBuildProgram` options string. Both must be UTF-8 (OpenCL C source is; anything
/// else is `KC_ERR_INVALID_ARGUMENT`). A compile error is `KC_ERR_BUILD_FAILED`, with the OpenCL
/// status in `kc_last_build_error()` and the compiler log in `kc_last_error_message()`. `device`
/// must be one of `context`'s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_find_or_build(
    cache: *mut kc_opencl_cache,
    context: *mut c_void,
    device: *mut c_void,
    sources: *const *const c_char,
    lengths: *const usize,
    count: usize,
    options: *const c_char,
    out_lease: *mut *mut kc_opencl_lease,
) -> kc_status {
    let find = |cache: &OpenClCache| {
        non_null(context, "context")?;
        non_null(device, "device")?;
        non_null(out_lease, "out_lease")?;
        // SAFETY: forwarded from the caller's contract.
        let (texts, options) = unsafe { program_text(sources, lengths, count, options) }?;
        // SAFETY: the caller passes a live context and one of its devices, which stay live
        // during the call; the cache keeps no borrow of the context beyond it (programs hold
        // their own reference to it).
        let (context, device) =
            unsafe { (ContextRef::from_raw(context), Device::from_raw(device)) };
        let lease = cache.find_or_build(context, device, &texts, options)?;
        // SAFETY: `out_lease` is non-NULL and writable by contract.
        unsafe { out_lease.write(lease_into_raw(lease)) };
        Ok(())
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_cache(cache, find) }
}

/// The source strings and the options of a lookup, checked: at least one string, each
/// UTF-8, and NULL options read as none.
///
/// # Safety
/// As `kc_opencl_cache_find_or_build` says of `sources`, `lengths`, `count` and `options`.
unsafe fn program_text<'a>(
    sources: *const *const c_char,
    lengths: *const usize,
    count: usize,
    options: *const c_char,
) -> Result<(Vec<&'a str>, &'a str), Error> {
    if count == 0 {
        return Err(Error::InvalidArgument("count is 0: no source".into()));
    }
    // SAFETY: `sources` holds `count` pointers by contract.
    let pointers = unsafe { elements(sources, count, "sources") }?;
    let lengths = if lengths.is_null() {
        None
    } else {
        // SAFETY: a non-NULL `lengths` holds `count` sizes by contract.
        Some(unsafe { elements(lengths, count, "lengths") }?)
    };
    let mut texts = Vec::with_capacity(count);
    for (i, &pointer) in pointers.iter().enumerate() {
        let bytes = match lengths {
            // SAFETY: `lengths[i]` readable bytes at `sources[i]` by contract.
            Some(lengths) => unsafe { byte_slice(pointer.cast(), lengths[i], "sources[i]") }?,
            None => {
                non_null(pointer, "sources[i]")?;
                // SAFETY: without lengths each string is NUL-terminated by contract.
                unsafe { CStr::from_ptr(pointer) }.to_bytes()
            }
        };
        texts.push(
            std::str::from_utf8(bytes)
                .map_err(|_| Error::InvalidArgument(format!("sources[{i}] is not valid UTF-8")))?,
        );
    }
    let options = if options.is_null() {
        ""
    } else {
        // SAFETY: a non-NULL `options` is a C string by contract.
        unsafe { c_str(options, "options") }?
    };
    Ok((texts, options))
}

/// What `clCreateProgramWithSource` + `clBuildProgram` make, from the cache: for each of
/// `num_devices` devices, `out_programs[i]` (a `cl_program *` as `void *`) receives a reference of
/// the caller's own to the program for `device_list[i]` (a `const cl_device_id *`), released with
/// `clReleaseProgram`; the cache keeps its own. `device_list` NULL means every device of `context`:
/// `num_devices` must then be its `CL_CONTEXT_NUM_DEVICES`. `sources`, `lengths`, `count` and
/// `options` as for `kc_opencl_cache_find_or_build`. `out_logs` is NULL or `num_devices` buffers:
/// on `KC_ERR_BUILD_FAILED`, `out_logs[i]` holds the build message of a device whose build failed
/// (not NUL-terminated), the others are zeroed; free each with `kc_buffer_free`. On failure no
/// program is handed out; status and errors are the first failing device's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_find_or_build_program(
    cache: *mut kc_opencl_cache,
    context: *mut c_void,
    num_devices: usize,
    device_list: *const c_void,
    sources: *const *const c_char,
    lengths: *const usize,
    count: usize,
    options: *const c_char,
    out_programs: *mut c_void,
    out_logs: *mut kc_buffer,
) -> kc_status {
    let find = |cache: &OpenClCache| {
        non_null(context, "context")?;
        non_null(out_programs, "out_programs")?;
        if num_devices == 0 {
            return Err(Error::InvalidArgument("num_devices is 0: no device".into()));
        }
        // SAFETY: forwarded from the caller's contract.
        let (texts, options) = unsafe { program_text(sources, lengths, count, options) }?;
        // SAFETY: the caller passes a live context, which stays live during the call.
        let context = unsafe { ContextRef::from_raw(context) };
        let devices = if device_list.is_null() {
            let devices = context_devices(context)?;
            if devices.len() != num_devices {
                return Err(Error::InvalidArgument(format!(
                    "device_list is NULL and num_devices is {num_devices}, but the context's \
                     device count is {}",
                    devices.len()
                )));
            }
            devices
        } else {
            // SAFETY: a non-NULL `device_list` holds `num_devices` handles by contract.
            let handles = unsafe {
                elements(
                    device_list.cast::<*mut c_void>(),
                    num_devices,
                    "device_list",
                )
            }?;
            let mut devices = Vec::with_capacity(num_devices);
            for (i, &handle) in handles.iter().enumerate() {
                non_null(handle, &format!("device_list[{i}]"))?;
                // SAFETY: the listed handles are live devices of the context by contract.
                devices.push(unsafe { Device::from_raw(handle) });
            }
            devices
        };
        let outcomes = cache.find_or_build_programs(context, Some(&devices), &texts, options)?;
        if !out_logs.is_null() {
            for (i, outcome) in outcomes.iter().enumerate() {
                let log = match outcome {
                    Err(Error::Build(build)) => kc_buffer::from_text(build.message.clone()),
                    _ => kc_buffer::EMPTY,
                };
                // SAFETY: a non-NULL `out_logs` holds `num_devices` writable buffers by
                // contract, and there is one outcome per device.
                unsafe { out_logs.add(i).write(log) };
            }
        }
        // On a failure the programs already found are dropped: each releases its reference.
        let programs = outcomes
            .into_iter()
            .collect::<Result<Vec<Program>, Error>>()?;
        let out_programs = out_programs.cast::<*mut c_void>();
        for (i, program) in programs.into_iter().enumerate() {
            // SAFETY: `out_programs` holds `num_devices` writable pointers by contract.
            unsafe { out_programs.add(i).write(program.into_raw()) };
        }
        Ok(())
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_cache(cache, find) }
}

/// The leased `cl_program`, as `void *`; NULL if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_lease_program(lease: *const kc_opencl_lease) -> *mut c_void {
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, ptr::null_mut(), |e| e.value().raw()) }
}

/// Releases a lease; the last release of an evicted program releases the program.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_lease_release(lease: *mut kc_opencl_lease) {
    // SAFETY: the caller hands back a lease it owns, or NULL.
    guard_value((), || unsafe { release_lease(lease) })
}

/// Unlinks every program built for `device`, in every context; each is released now, or when its
/// last lease is. `*out_count` (if not NULL) receives how many were unlinked. A NULL `device` is
/// `KC_ERR_INVALID_ARGUMENT`. `device` is only compared, never called: it may already be released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_evict_device(
    cache: *mut kc_opencl_cache,
    device: *mut c_void,
    out_count: *mut usize,
) -> kc_status {
    let evict = |cache: &OpenClCache, device| {
        // SAFETY: eviction only compares the handle with the ones lookups registered.
        cache.evict_device(unsafe { Device::from_raw(device) })
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { evict_by(cache, device, "device", out_count, evict) }
}

/// Unlinks every program of `context`; call it before `clReleaseContext`. As
/// `kc_opencl_cache_evict_device` otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_evict_context(
    cache: *mut kc_opencl_cache,
    context: *mut c_void,
    out_count: *mut usize,
) -> kc_status {
    let evict = |cache: &OpenClCache, context| cache.evict_context(context);
    // SAFETY: forwarded from the caller's contract.
    unsafe { evict_by(cache, context, "context", out_count, evict) }
}

/// Unlinks every program (the disk keeps its binaries).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_clear(cache: *mut kc_opencl_cache) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { clear(cache) }
}

/// Waits until the binary of every program built so far is written to the disk tier (or failed
/// to be), as `kc_opencl_cache_free` does. On PoCL binaries are held back until this call (or
/// another process waits for them) so that they carry the code launches compiled: call it after
/// your warm-up launches.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_flush(cache: *mut kc_opencl_cache) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        with_cache(cache, |cache| {
            cache.flush();
            Ok(())
        })
    }
}

/// Fills `*out`, whose `struct_size` the caller set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_stats(
    cache: *const kc_opencl_cache,
    out: *mut kc_opencl_cache_statistics,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { write_stats(cache, out) }
}

/// Zeroes the event counters of the cache, of its memory tier and of its `kc_persistence`
/// (for every cache sharing it); gauges stay (`docs/c-api.md`, "Statistics reset by a baseline").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_opencl_cache_reset_stats(cache: *mut kc_opencl_cache) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { reset_stats(cache) }
}

/// Whether an OpenCL runtime can be loaded here: `KC_OK`, or `KC_ERR_UNAVAILABLE` with the
/// reason in `kc_last_error_message()`.
#[unsafe(no_mangle)]
pub extern "C" fn kc_opencl_available() -> kc_status {
    guard(|| crate::backend::opencl::sys::Api::get().map(drop))
}
