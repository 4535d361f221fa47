//! `kc_tiered_find_or_build`: the memory → disk → build lookup for any runtime, through three
//! C callbacks.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_void};
use std::ptr;

use super::args::{handle_ref, invalid, lease_into_raw, read_sized};
use super::cache::{RawValue, device_of, kc_build_fn, kc_cache, make_value};
use super::key_builder::key_arg;
use super::lease::kc_lease;
use super::persistence::{kc_persistence, persistence_arg};
use super::persistence_entries::{descriptor_arg, kc_entry_descriptor};
use super::status::{byte_slice, guard, kc_status, non_null};
use crate::BuildError;
use crate::disk::DiskBytes;
use crate::tiered::Tiers;

/// Turns a serialized payload back into a live value. As `kc_build_fn`, but non-zero removes
/// the entry and builds the value (except `KC_LOAD_TRANSIENT`).
pub type kc_load_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        bytes: *const u8,
        len: usize,
        out_value: *mut *mut c_void,
        out_weight: *mut u64,
    ) -> c_int,
>;

/// What a `kc_load_fn` returns when its failure says nothing about the entry (out of memory, a
/// device lost for the moment): the entry stays on disk and the lookup fails with
/// `KC_ERR_BUILD_FAILED`, `kc_last_build_error()` returning this value. Any other non-zero
/// return removes the entry as refused.
pub const KC_LOAD_TRANSIENT: c_int = 1_000_000;

/// Serializes a live value for the disk, in two calls like `vkGetPipelineCacheData`: with
/// `buf` NULL store the size in `*len`; then fill a buffer of `*len` bytes and store the bytes
/// written in `*len`. Return 0 on success; non-zero (or a size too large) skips the write-back.
pub type kc_serialize_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        value: *mut c_void,
        buf: *mut u8,
        len: *mut usize,
    ) -> c_int,
>;

/// The callbacks of a tiered lookup; all receive `ctx`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_tiered_callbacks {
    pub struct_size: usize,
    /// Builds from scratch (required).
    pub build: kc_build_fn,
    /// Loads a disk payload; NULL: the disk is not read.
    pub load: kc_load_fn,
    /// Serializes a built value; NULL: nothing is written back.
    pub serialize: kc_serialize_fn,
    /// Passed to every callback.
    pub ctx: *mut c_void,
}

/// `kc_tiered_callbacks` in ABI 3.0, its only layout so far. It is read whole (`read_sized`): a
/// field appended needs a read at the caller's size (`read_grown`), with this as its minimum.
const SIZE_3_0: usize = 40;
const _: () = assert!(size_of::<kc_tiered_callbacks>() == SIZE_3_0);

/// Serializes a just-built value with the caller's two-call `serialize`; without one, or when
/// it fails, nothing is written back. The size the first call announces is checked with
/// `fits` (the disk's entry size limit) before anything is allocated, and allocated fallibly.
///
/// # Safety
/// `serialize` must be NULL or callable with `ctx` and `value`.
unsafe fn serialize_value(
    serialize: kc_serialize_fn,
    ctx: *mut c_void,
    value: *mut c_void,
    fits: impl FnOnce(usize) -> crate::Result<()>,
) -> std::result::Result<Vec<u8>, BuildError> {
    let serialize = serialize.ok_or_else(|| BuildError::new(0, "no serialize callback"))?;
    let failed = |code| BuildError::new(code, format!("the serialize callback returned {code}"));
    let mut len = 0usize;
    // SAFETY: the caller's contract; `len` is a live local.
    match unsafe { serialize(ctx, value, ptr::null_mut(), &mut len) } {
        0 => {}
        code => return Err(failed(code)),
    }
    fits(len).map_err(|e| {
        BuildError::new(
            0,
            format!("the serialize callback announced {len} bytes: {e}"),
        )
    })?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len)
        .map_err(|_| BuildError::new(0, format!("cannot allocate {len} bytes to serialize")))?;
    buf.resize(len, 0);
    let mut written = len;
    // SAFETY: `buf` has `len` writable bytes, as the callback was told.
    match unsafe { serialize(ctx, value, buf.as_mut_ptr(), &mut written) } {
        0 if written <= len => {}
        0 => {
            return Err(BuildError::new(
                0,
                "the serialize callback overran its buffer",
            ));
        }
        code => return Err(failed(code)),
    }
    buf.truncate(written);
    Ok(buf)
}

/// Returns a lease on the value for `l1_key` from `cache`; on a miss, loads it from the disk entry
/// for `l2_key` (`KC_KEY_LEN` bytes) with `callbacks->load`, else builds it with `callbacks->build`
/// and writes `callbacks->serialize`'s bytes back (backend `custom`) through `persistence` (see
/// `kc_persistence`). Concurrent callers of one key read or build once, and a disk miss first waits
/// for another process building the same `l2_key`. An entry `load` refuses is removed.
/// `serialize` runs before the lookup returns; the write happens in the background (see
/// `kc_persistence_flush`), and a failed one is counted, not returned. Statuses as for
/// `kc_cache_find_or_build`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_tiered_find_or_build(
    cache: *mut kc_cache,
    l1_key: *const u8,
    l1_key_len: usize,
    device_id: i64,
    persistence: *mut kc_persistence,
    l2_key: *const u8,
    callbacks: *const kc_tiered_callbacks,
    out_lease: *mut *mut kc_lease,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract; a NULL descriptor is the default one.
    unsafe {
        kc_tiered_find_or_build_described(
            cache,
            l1_key,
            l1_key_len,
            device_id,
            persistence,
            l2_key,
            callbacks,
            ptr::null(),
            out_lease,
        )
    }
}

/// `kc_tiered_find_or_build`, writing back an entry that says what it holds (`descriptor`,
/// as `kc_persistence_put_described` takes it; NULL: backend `custom`).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kc_tiered_find_or_build_described(
    cache: *mut kc_cache,
    l1_key: *const u8,
    l1_key_len: usize,
    device_id: i64,
    persistence: *mut kc_persistence,
    l2_key: *const u8,
    callbacks: *const kc_tiered_callbacks,
    descriptor: *const kc_entry_descriptor,
    out_lease: *mut *mut kc_lease,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        let memory = unsafe { handle_ref(cache, "cache") }?;
        non_null(callbacks, "callbacks")?;
        non_null(out_lease, "out_lease")?;
        // SAFETY: non-NULL and readable for its `struct_size` by contract; every field is
        // valid for any bits (sizes, optional function pointers, a raw pointer).
        let cb = unsafe { read_sized(callbacks, "callbacks", "kc_tiered_callbacks") }?;
        let build = cb
            .build
            .ok_or_else(|| invalid("callbacks->build is NULL"))?;
        // SAFETY: NULL or readable, with NULL or C strings, by contract.
        let descriptor = unsafe { descriptor_arg(descriptor) }?;
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let l2_key = unsafe { key_arg(l2_key) }?;
        // SAFETY: NULL, the marker or live by contract.
        let disk = unsafe { persistence_arg(persistence) }?.map(|shared| &**shared);
        // SAFETY: the caller promises `l1_key_len` readable bytes.
        let key = unsafe { byte_slice(l1_key, l1_key_len, "key") }?;
        let device = device_of(device_id)?;
        let ctx = cb.ctx;
        let load = cb.load.map(|load| {
            move |bytes: &[u8]| {
                // SAFETY: the caller promised a callable `load` for `ctx`; the payload is
                // live for the call.
                unsafe { make_value(load, ctx, bytes.as_ptr(), bytes.len(), "load") }.map_err(|e| {
                    match e.code {
                        KC_LOAD_TRANSIENT => BuildError::transient(
                            e.code,
                            "the load callback failed for the moment (KC_LOAD_TRANSIENT): \
                             the entry stays",
                        ),
                        _ => e,
                    }
                })
            }
        });
        let tiers = Tiers {
            memory,
            disk,
            // The C API reports what the tiers did through their own counters.
            counters: &Default::default(),
        };
        let lease = tiers.find_or_build(
            key,
            device,
            || Ok(l2_key),
            load,
            // SAFETY: the caller promised a callable `build` for `ctx`; the key is its own.
            || unsafe { make_value(build, ctx, l1_key, l1_key_len, "build") },
            |value: &RawValue| {
                // Only called with a disk to write to: its limit bounds the size.
                let fits = |len| disk.map_or(Ok(()), |d| d.check_payload_len(len, &descriptor));
                // SAFETY: the caller promised a callable `serialize` (or NULL) for `ctx`.
                unsafe { serialize_value(cb.serialize, ctx, value.0, fits) }
                    .map(|bytes| (DiskBytes::from(bytes), descriptor))
            },
        )?;
        // SAFETY: non-NULL and writable by contract.
        unsafe { out_lease.write(lease_into_raw(lease)) };
        Ok(())
    })
}
