//! What the backends' C APIs (`kc_opencl_*`, `kc_cuda_*`, `kc_vulkan_*`) do alike, written
//! once: a cache made from options read at the caller's size, and the calls that reach the
//! inner cache of a live handle (clear, evict, statistics).

use std::ffi::c_void;
use std::sync::Arc;

use super::args::{
    BackendDisk, backend_tiers, live, read_grown, write_boxed, write_optional, write_sized,
};
use super::status::{guard, kc_status, non_null};
use crate::disk::DiskCache;
use crate::error::Result;
use crate::memory;

/// A backend's `kc_<backend>_options`: a versioned struct whose first layout ended before
/// `disk_key`, with the memory caps and disk settings every backend has.
pub trait BackendOptions: Copy {
    /// The C name, for messages about its size.
    const C_NAME: &'static str;
    /// Where the first layout ended: callers compiled against it stay valid.
    const MIN_SIZE: usize;
    /// Offsets of the `bool` fields, each made 0 or 1 as it is read.
    const BOOLS: &'static [usize];
    fn defaults() -> Self;
    /// `max_entries`, `max_weight` and the disk settings.
    fn tiers(&self) -> (u64, u64, BackendDisk);
}

/// A backend's opaque cache handle around its Rust cache.
pub trait CacheHandle {
    type Inner;
    fn inner(&self) -> &Self::Inner;
}

/// [`BackendOptions`] for a backend's options struct (and the function that gives its
/// defaults) and [`CacheHandle`] for its cache handle: every backend names the fields alike.
/// The first layout of every backend's options ended before `disk_key`: callers compiled
/// against it stay valid, and get no key and no key requirement (the environment's still
/// apply). With `remote`, the options end with the remote tier's fields (`remote_url` …, see
/// `remote_args`); without, the disk tier takes its remote from the environment alone.
macro_rules! backend_handles {
    ($options:ident, $defaults:ident, $cache:ident, $inner:ty) => {
        $crate::ffi::backend_common::backend_handles!(
            @impl $options, $defaults, $cache, $inner, [], |_: &$options| None
        );
    };
    ($options:ident, $defaults:ident, $cache:ident, $inner:ty, remote) => {
        $crate::ffi::backend_common::backend_handles!(
            @impl $options, $defaults, $cache, $inner,
            [
                std::mem::offset_of!($options, remote_read_only),
                std::mem::offset_of!($options, remote_allow_unkeyed),
            ],
            |o: &$options| Some($crate::ffi::remote_args::remote_args!(o))
        );
    };
    (@impl $options:ident, $defaults:ident, $cache:ident, $inner:ty,
     [$($bool:expr),* $(,)?], $remote:expr) => {
        impl $crate::ffi::backend_common::BackendOptions for $options {
            const C_NAME: &'static str = stringify!($options);
            const MIN_SIZE: usize = std::mem::offset_of!($options, disk_key);
            const BOOLS: &'static [usize] = &[
                std::mem::offset_of!($options, use_disk),
                std::mem::offset_of!($options, disk_require_key),
                $($bool,)*
            ];

            fn defaults() -> Self {
                $defaults()
            }

            fn tiers(&self) -> (u64, u64, $crate::ffi::args::BackendDisk) {
                let disk = $crate::ffi::args::BackendDisk {
                    use_disk: self.use_disk,
                    dir: self.disk_dir,
                    key: self.disk_key,
                    key_len: self.disk_key_len,
                    require_key: self.disk_require_key,
                    lock_timeout_ms: self.disk_lock_timeout_ms,
                    remote: ($remote)(self),
                };
                (self.max_entries, self.max_weight, disk)
            }
        }

        impl $crate::ffi::backend_common::CacheHandle for $cache {
            type Inner = $inner;
            fn inner(&self) -> &$inner {
                &self.inner
            }
        }
    };
}
pub(super) use backend_handles;

/// The body of `kc_<backend>_cache_new`: reads `opts` at the caller's size, makes the tiers it
/// describes, and writes the cache `make` builds with them to `*out_cache`.
///
/// # Safety
/// `opts` must be NULL or readable for its `struct_size`, with NULL or a C string in its
/// `disk_dir` and its `remote_*` strings, and a key of `disk_key_len` bytes or NULL in
/// `disk_key`; `out_cache` must be NULL or writable.
pub unsafe fn new_cache<O: BackendOptions, C>(
    opts: *const O,
    out_cache: *mut *mut C,
    make: impl FnOnce(&O, memory::Options, Option<Arc<DiskCache>>) -> Result<C>,
) -> kc_status {
    guard(|| {
        non_null(opts, "opts")?;
        non_null(out_cache, "out_cache")?;
        // SAFETY: `opts` is readable for its `struct_size` by contract; every field but the
        // listed bools is an integer, a raw pointer or an optional function pointer.
        let opts = unsafe {
            read_grown(
                opts,
                "opts",
                O::C_NAME,
                O::MIN_SIZE,
                O::defaults(),
                O::BOOLS,
            )
        }?;
        let (max_entries, max_weight, disk) = opts.tiers();
        // SAFETY: the disk settings hold NULL or a C string and a readable key, by contract.
        let (memory, disk) = unsafe { backend_tiers(max_entries, max_weight, disk) }?;
        let cache = make(&opts, memory, disk)?;
        // SAFETY: `out_cache` is non-NULL and writable by contract.
        unsafe { write_boxed(out_cache, cache) };
        Ok(())
    })
}

/// Runs `call` on the inner cache of `cache` (NULL: `KC_ERR_INVALID_ARGUMENT`).
///
/// # Safety
/// `cache` must be NULL or a live handle.
pub unsafe fn with_cache<C: CacheHandle>(
    cache: *const C,
    call: impl FnOnce(&C::Inner) -> Result<()>,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract; only shared access is needed.
        call(unsafe { live(cache, "cache") }?.inner())
    })
}

/// The body of an eviction by a caller's handle (`name`), which must not be NULL: NULL is
/// never registered, so evicting it would silently evict nothing. `*out_count` (if not NULL)
/// receives how many entries `evict` unlinked.
///
/// # Safety
/// `cache` must be NULL or a live handle; `out_count` NULL or writable.
pub unsafe fn evict_by<C: CacheHandle>(
    cache: *const C,
    handle: *mut c_void,
    name: &str,
    out_count: *mut usize,
    evict: impl FnOnce(&C::Inner, *mut c_void) -> Result<usize>,
) -> kc_status {
    let call = |inner: &C::Inner| {
        non_null(handle, name)?;
        let count = evict(inner, handle)?;
        // SAFETY: NULL or writable by contract.
        unsafe { write_optional(out_count, count) };
        Ok(())
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_cache(cache, call) }
}

/// The body of `kc_<backend>_cache_stats`: writes what `stats` makes of the inner cache of
/// `cache` into the caller's `*out` (a `c_name` of at least `min_size` bytes: where its layout
/// ended before `disk` was appended, so that older callers get the fields they know).
///
/// # Safety
/// `cache` must be NULL or a live handle; `out` NULL or a writable struct of at least its
/// `struct_size` bytes.
pub unsafe fn write_stats<C: CacheHandle, S: Copy>(
    cache: *const C,
    out: *mut S,
    c_name: &str,
    min_size: usize,
    stats: impl FnOnce(&C::Inner) -> S,
) -> kc_status {
    let fill = |inner: &C::Inner| {
        let stats = stats(inner);
        non_null(out, "out")?;
        // SAFETY: `out` points to a writable struct of at least its `struct_size` by contract.
        unsafe { write_sized(out, stats, "out", c_name, min_size) }
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_cache(cache, fill) }
}
