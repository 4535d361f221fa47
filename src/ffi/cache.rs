//! `kc_cache`: the memory tier through the C ABI, a `MemoryCache` keyed by byte strings whose
//! values are the caller's opaque pointers. Its lookups hand out `kc_lease`s (`lease.rs`).

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::ptr;
use std::sync::Arc;

use super::args::{
    GrownInput, Handle, c_statistics, free_handle, handle_ref, lease_into_raw, new_from_input,
    write_sized,
};
use super::lease::kc_lease;
use super::status::{byte_slice, fail, guard, guard_value, kc_status, non_null};
use crate::memory::{MemoryCache, Options, Stats};
use crate::metrics::Backend;
use crate::{BuildError, DestroyError, DeviceId, Error, Result};

/// A value stored for C: an opaque pointer kcache never dereferences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawValue(pub *mut c_void);

// SAFETY: the C contract makes values opaque handles that the caller promises may be used and
// destroyed from any thread; kcache itself only copies the pointer.
unsafe impl Send for RawValue {}
// SAFETY: as for `Send`: shared access only ever copies the pointer.
unsafe impl Sync for RawValue {}

/// A caller's context pointer, handed back to its callbacks unchanged on whatever thread they
/// run.
#[derive(Clone, Copy)]
struct Context(*mut c_void);

// SAFETY: the header requires callback contexts to be usable from any thread (callbacks run on
// whichever thread releases the last lease); kcache only passes the pointer along.
unsafe impl Send for Context {}
// SAFETY: as for `Send`.
unsafe impl Sync for Context {}

pub(super) type RawCache = MemoryCache<Vec<u8>, RawValue>;

/// Use this as the `device_id` of values that belong to no device.
// The cast makes cbindgen emit a typed macro that also survives `x-KC_NO_DEVICE`.
#[allow(clippy::unnecessary_cast)]
pub const KC_NO_DEVICE: i64 = -1 as i64;

/// Builds the value for a key on a miss. Return 0 and store the value in `*out_value` (any
/// pointer, NULL included; kcache never dereferences it) and optionally its weight, e.g. its
/// size in bytes, in `*out_weight` (left alone, the weight is 0). Return any non-zero code on
/// failure: the caller gets `KC_ERR_BUILD_FAILED` and `kc_last_build_error()` gives the code.
///
/// `key` and `key_len` are the arguments the caller passed to `kc_cache_find_or_build`. The
/// callback runs on the calling thread, with no kcache lock held, possibly at the same time as
/// builds of other keys on other threads; callers of the same key wait for it. It may call into
/// any kcache cache, except to look up the key it is building in the same cache
/// (`KC_ERR_REENTRANT`). It must return normally: no longjmp and no C++ exception out of it.
pub type kc_build_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        key: *const u8,
        key_len: usize,
        out_value: *mut *mut c_void,
        out_weight: *mut u64,
    ) -> c_int,
>;

/// Releases a value that left the cache (removed, evicted, cleared, over a cap, discarded after an
/// eviction or clear during its build, or the cache freed) once no lease holds it. Called exactly
/// once per built value, on whichever thread let go of it last, never under a kcache lock: it may
/// call into the cache (except while `kc_cache_free` runs). Returns 0 on success; a non-zero code
/// is reported as `KC_ERR_DESTROY_FAILED` by the call that ran it, or to `on_destroy_error` when
/// that call has no status (`kc_lease_release`, `kc_cache_free`, capacity eviction, discarded
/// builds). Same rules as `kc_build_fn` for longjmp and exceptions.
pub type kc_destroy_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, value: *mut c_void) -> c_int>;

/// Hears about destroy failures that no call can return: `code` is what `destroy` returned.
/// Runs on the thread that ran the destroy, right after it, with no kcache lock held.
pub type kc_destroy_error_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, code: c_int)>;

/// A cache of opaque values keyed by byte strings. Thread-safe: every function taking a
/// `kc_cache *` may be called from any number of threads at once, except `kc_cache_free`, which
/// must be the last call on the cache.
pub struct kc_cache {
    _opaque: [u8; 0],
}

impl Handle for kc_cache {
    type Rust = RawCache;
}

/// How a cache behaves; fixed at creation. Start from `kc_cache_options_default()`. A
/// `struct_size` that ends before `destroy_ctx` is `KC_ERR_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_cache_options {
    pub struct_size: usize,
    /// Evict entries beyond this many; 0 = unlimited.
    pub max_entries: u64,
    /// Evict entries while their total weight exceeds this (a heavier entry stays, alone);
    /// 0 = unlimited.
    pub max_weight: u64,
    /// Set when values borrow resources that `kc_cache_clear` releases: a build in flight
    /// across a clear is then destroyed and reported as `KC_ERR_CACHE_CLEARED`.
    pub invalidated_by_clear: bool,
    /// Releases values; NULL: values are never destroyed.
    pub destroy: kc_destroy_fn,
    /// Passed to `destroy`.
    pub destroy_ctx: *mut c_void,
    /// Hears about destroy failures that no call returns; NULL: they are only counted.
    pub on_destroy_error: kc_destroy_error_fn,
    /// Passed to `on_destroy_error`.
    pub on_destroy_error_ctx: *mut c_void,
}

/// Counters of one cache since its creation or its last `kc_cache_reset_stats`. Each field is
/// read atomically, the whole is not a snapshot: fields may be a few operations apart.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kc_cache_stats {
    pub struct_size: usize,
    /// Lookups answered from a ready entry.
    pub hits: u64,
    /// Lookups that found neither a ready entry nor a build to wait for.
    pub misses: u64,
    /// Build callbacks that produced a value (installed or discarded); loads from disk are not
    /// builds (see a backend's `binary_loads`, `cubin_loads`; `kc_persistence_statistics`).
    pub builds: u64,
    /// Builds whose callback returned non-zero.
    pub build_failures: u64,
    /// Lookups that waited for another thread's build of the same key.
    pub waits: u64,
    /// Values built but destroyed instead of installed (device evicted, cache cleared).
    pub discarded: u64,
    /// Entries unlinked to respect `max_entries` / `max_weight`.
    pub capacity_evictions: u64,
    /// Entries unlinked by `kc_cache_evict_device`.
    pub device_evictions: u64,
    /// Calls to `kc_cache_clear`.
    pub clears: u64,
    /// Values released: destroy callbacks run (counted also without a destroy callback).
    pub destroys: u64,
    /// Destroy callbacks that returned non-zero.
    pub destroy_errors: u64,
    /// Entries in the cache now.
    pub entries: u64,
    /// Total weight of the entries in the cache now.
    pub weight: u64,
    /// Leases not yet released.
    pub leases: u64,
}

/// `kc_cache_statistics` in ABI 3.0, its first layout in this major and the least
/// `kc_cache_stats` accepts. Each backend's statistics hold one as `memory`, so it can never
/// grow: its fields would move theirs.
const STATISTICS_3_0: usize = 120;
const _: () = assert!(size_of::<kc_cache_stats>() == STATISTICS_3_0);

c_statistics!(Stats => kc_cache_stats {
    hits, misses, builds, build_failures, waits, discarded, capacity_evictions, device_evictions,
    clears, destroys, destroy_errors, entries, weight, leases,
});

// SAFETY: every field but the bool is an integer, a raw pointer or an optional function
// pointer (zero is `None`).
unsafe impl GrownInput for kc_cache_options {
    const C_NAME: &str = "kc_cache_options";
    /// The first published layout ends at `destroy_ctx`: callers compiled against it stay
    /// valid.
    const MIN_SIZE: usize = offset_of!(kc_cache_options, destroy_ctx) + size_of::<*mut c_void>();
    const BOOLS: &[usize] = &[offset_of!(kc_cache_options, invalidated_by_clear)];
    const DEFAULT: kc_cache_options = kc_cache_options {
        struct_size: size_of::<kc_cache_options>(),
        max_entries: 0,
        max_weight: 0,
        invalidated_by_clear: false,
        destroy: None,
        destroy_ctx: ptr::null_mut(),
        on_destroy_error: None,
        on_destroy_error_ctx: ptr::null_mut(),
    };
}

/// The default options, with `struct_size` set: unbounded, owning (not invalidated by clear),
/// no destroy callback.
#[unsafe(no_mangle)]
pub extern "C" fn kc_cache_options_default() -> kc_cache_options {
    kc_cache_options::DEFAULT
}

pub(super) fn device_of(device_id: i64) -> Result<Option<DeviceId>> {
    match device_id {
        KC_NO_DEVICE => Ok(None),
        id if id >= 0 => Ok(Some(id)),
        id => Err(Error::InvalidArgument(format!(
            "device_id {id} is negative and not KC_NO_DEVICE"
        ))),
    }
}

/// Runs a C callback that makes a value (`kc_build_fn`, `kc_load_fn`) from `len` bytes at
/// `bytes`; `what` names it in the failure's message.
///
/// # Safety
/// `make` must be callable with `ctx` and the bytes as its contract describes.
pub(super) unsafe fn make_value(
    make: unsafe extern "C" fn(*mut c_void, *const u8, usize, *mut *mut c_void, *mut u64) -> c_int,
    ctx: *mut c_void,
    bytes: *const u8,
    len: usize,
    what: &str,
) -> std::result::Result<(RawValue, u64), BuildError> {
    let mut value = ptr::null_mut();
    let mut weight = 0u64;
    // SAFETY: callable by the caller's contract; the out-pointers are live locals.
    match unsafe { make(ctx, bytes, len, &mut value, &mut weight) } {
        0 => Ok((RawValue(value), weight)),
        code => Err(BuildError::new(
            code,
            format!("the {what} callback returned {code}"),
        )),
    }
}

/// Creates a cache. Free it with `kc_cache_free`. The callbacks and contexts in `opts` must stay
/// valid until the last value is destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_new(
    opts: *const kc_cache_options,
    out_cache: *mut *mut kc_cache,
) -> kc_status {
    let make = |opts: kc_cache_options| {
        let destroy = opts.destroy;
        let destroy_ctx = Context(opts.destroy_ctx);
        let on_destroy_error = opts.on_destroy_error.map(|hook| {
            let ctx = Context(opts.on_destroy_error_ctx);
            Arc::new(move |e: &DestroyError| {
                // Name the whole wrapper: a closure would capture only its non-Send field.
                let ctx = ctx;
                // SAFETY: the caller promised a callable hook and a context valid from any
                // thread for the cache's lifetime.
                unsafe { hook(ctx.0, e.code) }
            }) as Arc<dyn Fn(&DestroyError) + Send + Sync>
        });
        let options = Options {
            max_entries: (opts.max_entries != 0).then_some(opts.max_entries),
            max_weight: (opts.max_weight != 0).then_some(opts.max_weight),
            invalidated_by_clear: opts.invalidated_by_clear,
            on_destroy_error,
            ..Options::default()
        };
        Ok(RawCache::for_backend(
            Backend::C,
            options,
            move |value: RawValue| {
                let ctx = destroy_ctx;
                let Some(destroy) = destroy else {
                    return Ok(());
                };
                // SAFETY: the caller promised a callable destroy and a context valid from any
                // thread until the last value is destroyed.
                match unsafe { destroy(ctx.0, value.0) } {
                    0 => Ok(()),
                    code => Err(DestroyError::new(
                        code,
                        format!("the destroy callback returned {code}"),
                    )),
                }
            },
        ))
    };
    // A handle pointer is the boxed value, as `new_handle` makes it.
    let out_cache = out_cache.cast::<*mut RawCache>();
    // SAFETY: forwarded from the caller's contract.
    unsafe { new_from_input(opts, "opts", out_cache, "out_cache", make) }
}

/// Frees a cache: destroys every value no lease holds now; leased values are destroyed when their
/// last lease is released (the leases stay valid). No other call on `cache` may run during or after
/// this one, including from the destroy callbacks it runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_free(cache: *mut kc_cache) {
    // SAFETY: the caller hands over the cache it got from `kc_cache_new`, or NULL.
    guard_value((), || unsafe { free_handle(cache) });
}

/// Returns a lease on the value for `key`, running `build` on a miss (see `kc_build_fn`).
/// Concurrent callers of one key share one build: the same value, or the same build failure
/// (status and `kc_last_build_error()` code). Each is judged on its own call: only its own
/// device's eviction (`KC_ERR_DEVICE_DESTROYED`) or a clear (`KC_ERR_CACHE_CLEARED`) during it
/// fails it; where the shared build was doomed for another reason it builds again. `device_id`:
/// an id >= 0 for `kc_cache_evict_device`, or `KC_NO_DEVICE`; the entry is recorded against the
/// device of every caller it is returned to. Keys are byte strings compared by content; the
/// empty key (`key_len` 0, `key` may then be NULL) is a valid key.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_find_or_build(
    cache: *mut kc_cache,
    key: *const u8,
    key_len: usize,
    device_id: i64,
    build: kc_build_fn,
    build_ctx: *mut c_void,
    out_lease: *mut *mut kc_lease,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        let cache = unsafe { handle_ref(cache, "cache") }?;
        // SAFETY: checked non-NULL as the caller promised a readable key.
        let key_bytes = unsafe { byte_slice(key, key_len, "key") }?;
        let device = device_of(device_id)?;
        let build = build.ok_or_else(|| Error::InvalidArgument("build is NULL".into()))?;
        non_null(out_lease, "out_lease")?;
        // The build captures its arguments by value: captured by reference, they would be
        // stored on the stack on every call, hits included.
        let lease = cache.find_or_build(key_bytes, device, move || {
            // SAFETY: the caller promised `build` is callable with `build_ctx`; the key is
            // the caller's own.
            unsafe { make_value(build, build_ctx, key, key_len, "build") }
        })?;
        // SAFETY: `out_lease` is non-NULL and writable by contract.
        unsafe { out_lease.write(lease_into_raw(lease)) };
        Ok(())
    })
}

/// Returns a lease on the value for `key` if the cache holds one: `KC_ERR_NOT_FOUND` if not,
/// including while the key is still being built (this call never builds or waits). As for
/// `kc_cache_find_or_build`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_get(
    cache: *mut kc_cache,
    key: *const u8,
    key_len: usize,
    out_lease: *mut *mut kc_lease,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        let cache = unsafe { handle_ref(cache, "cache") }?;
        // SAFETY: checked non-NULL as the caller promised a readable key.
        let key_bytes = unsafe { byte_slice(key, key_len, "key") }?;
        non_null(out_lease, "out_lease")?;
        let lease = cache.get(key_bytes).ok_or(Error::NotFound)?;
        // SAFETY: `out_lease` is non-NULL and writable by contract.
        unsafe { out_lease.write(lease_into_raw(lease)) };
        Ok(())
    })
}

/// Removes the entry for `key`: its value is destroyed now if no lease holds it, else on the
/// last release. `KC_ERR_NOT_FOUND` if there is none (a key still being built is not
/// affected); `KC_ERR_DESTROY_FAILED` if the destroy callback failed (the entry is gone).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_remove(
    cache: *mut kc_cache,
    key: *const u8,
    key_len: usize,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        let cache = unsafe { handle_ref(cache, "cache") }?;
        // SAFETY: checked non-NULL as the caller promised a readable key.
        let key_bytes = unsafe { byte_slice(key, key_len, "key") }?;
        if cache.remove(key_bytes)? {
            Ok(())
        } else {
            Err(Error::NotFound)
        }
    })
}

/// Evicts every entry built for `device_id` (>= 0) and makes builds for it that are in flight
/// fail with `KC_ERR_DEVICE_DESTROYED` (their values are destroyed), even if it has no
/// entries; a lookup that starts after this returns builds anew. Values are destroyed now
/// unless leased. Every value is attempted; a failing destroy gives `KC_ERR_DESTROY_FAILED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_evict_device(cache: *mut kc_cache, device_id: i64) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        let cache = unsafe { handle_ref(cache, "cache") }?;
        let Some(device) = device_of(device_id)? else {
            return Err(Error::InvalidArgument(
                "device_id is KC_NO_DEVICE, which names no device".into(),
            ));
        };
        cache.evict_device(device)?;
        Ok(())
    })
}

/// Removes every entry; values are destroyed now unless leased. On a cache created with
/// `invalidated_by_clear`, builds in flight fail with `KC_ERR_CACHE_CLEARED`, and a lookup that
/// starts after this returns builds anew. Every value is attempted; a failing destroy gives
/// `KC_ERR_DESTROY_FAILED` after all were attempted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_clear(cache: *mut kc_cache) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        unsafe { handle_ref(cache, "cache") }?.clear()?;
        Ok(())
    })
}

/// The number of entries in the cache now; 0 if `cache` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_len(cache: *const kc_cache) -> usize {
    guard_value(0, || {
        // SAFETY: NULL or a live cache by contract.
        unsafe { handle_ref(cache, "cache") }.map_or_else(
            |e| {
                fail(&e);
                0
            },
            RawCache::len,
        )
    })
}

/// Fills `*out`, whose `struct_size` the caller set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_stats(
    cache: *const kc_cache,
    out: *mut kc_cache_stats,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        let stats: kc_cache_stats = unsafe { handle_ref(cache, "cache") }?.stats().into();
        let min = STATISTICS_3_0;
        // SAFETY: `out` has `out->struct_size` writable bytes by contract; the struct has no
        // padding.
        unsafe { write_sized(out, stats, "out", "kc_cache_statistics", min) }
    })
}

/// Zeroes the cache's event counters; `entries`, `weight` and `leases` stay. A count made
/// meanwhile is not lost: it is reset or shows in the next `kc_cache_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_cache_reset_stats(cache: *mut kc_cache) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        unsafe { handle_ref(cache, "cache") }?.reset_stats();
        Ok(())
    })
}

/// `hits / (hits + misses)`, or 0.0 when both are 0, for any statistics struct's pair, e.g.
/// `kc_hit_rate(s.hits, s.misses)`.
#[unsafe(no_mangle)]
pub extern "C" fn kc_hit_rate(hits: u64, misses: u64) -> f64 {
    crate::stats::hit_rate(hits, misses).unwrap_or(0.0)
}
