//! What the backends' C APIs (`kc_opencl_*`, `kc_cuda_*`, `kc_vulkan_*`) do alike, written
//! once: a cache made from options read at the caller's size, and the calls that reach the
//! inner cache of a live handle (clear, evict, statistics).

use std::ffi::c_void;
use std::sync::Arc;

use super::args::{live, read_grown, write_boxed, write_optional, write_sized};
use super::persistence::{kc_persistence, persistence_arg};
use super::status::{guard, kc_status, non_null};
use crate::Persistence;
use crate::error::Result;
use crate::memory;

/// A backend's `kc_<backend>_options`: a versioned struct starting with `struct_size` and the
/// memory caps every backend has, `max_entries` and `max_weight` (0 = unlimited). The
/// persistent tiers are not among the options: `kc_<backend>_cache_new` takes them as a
/// `kc_persistence *`.
pub trait BackendOptions: Copy {
    /// The C name, for messages about its size.
    const C_NAME: &'static str;
    /// Its size in ABI 3.0, its first layout in this major: a smaller `struct_size` is refused.
    const MIN_SIZE: usize;
    fn defaults() -> Self;
    /// `max_entries` and `max_weight`.
    fn memory_caps(&self) -> (u64, u64);
}

/// A backend's opaque cache handle around its Rust cache, with the calls every backend's C API
/// makes alike.
pub trait CacheHandle {
    type Inner;
    /// `kc_<backend>_cache_statistics`.
    type Statistics: Copy;
    /// Its C name, for messages about its size.
    const STATISTICS: &'static str;
    /// Its size in ABI 3.0, its first layout in this major: the least `_stats` accepts, so
    /// that a program built against any 3.x header gets its counters.
    const STATISTICS_MIN_SIZE: usize;
    fn inner(&self) -> &Self::Inner;
    fn statistics(&self) -> Self::Statistics;
    fn reset_stats(&self);
    fn clear(&self) -> Result<()>;
}

/// [`BackendOptions`] for a backend's options struct (and the function that gives its
/// defaults) and [`CacheHandle`] for its cache handle: every backend names the fields alike.
/// `abi_3_0` gives both structs' sizes in ABI 3.0, checked at compile time: the options, which
/// `_default()` returns by value, can never grow (a 3.0 program holds them in 3.0's size); the
/// statistics may, and `until` names their first field added since, where 3.0's layout ends.
macro_rules! backend_handles {
    ($options:ident, $defaults:ident, $cache:ident, $inner:ty, $statistics:ident,
     abi_3_0: { options: $options_size:literal, statistics: $statistics_size:literal
                $(until $first_added:ident)? } $(,)?) => {
        const _: () = assert!(
            std::mem::size_of::<$options>() == $options_size,
            concat!(stringify!($options), " is returned by value: it cannot change size")
        );
        const _: () = assert!(
            $crate::ffi::backend_common::backend_handles!(@end_3_0 $statistics $(, $first_added)?)
                == $statistics_size,
            concat!(stringify!($statistics), "'s ABI 3.0 fields moved")
        );

        impl $crate::ffi::backend_common::BackendOptions for $options {
            const C_NAME: &'static str = stringify!($options);
            const MIN_SIZE: usize = $options_size;

            fn defaults() -> Self {
                $defaults()
            }

            fn memory_caps(&self) -> (u64, u64) {
                (self.max_entries, self.max_weight)
            }
        }

        impl $crate::ffi::backend_common::CacheHandle for $cache {
            type Inner = $inner;
            type Statistics = $statistics;
            const STATISTICS: &'static str = stringify!($statistics);
            const STATISTICS_MIN_SIZE: usize = $statistics_size;

            fn inner(&self) -> &$inner {
                &self.inner
            }

            fn statistics(&self) -> $statistics {
                self.inner.stats().into()
            }

            fn reset_stats(&self) {
                self.inner.reset_stats();
            }

            fn clear(&self) -> $crate::error::Result<()> {
                self.inner.clear().map(drop)
            }
        }
    };
    // Where ABI 3.0's layout of a statistics struct ends: at its first field added since, or
    // at its end when none was.
    (@end_3_0 $statistics:ident, $first_added:ident) => {
        std::mem::offset_of!($statistics, $first_added)
    };
    (@end_3_0 $statistics:ident) => {
        std::mem::size_of::<$statistics>()
    };
}
pub(super) use backend_handles;

/// The body of `kc_<backend>_cache_new`: reads `opts` at the caller's size, takes a reference
/// to the persistent tiers `persistence` stands for (NULL: the process's default;
/// `kc_persistence_none()`: none), and writes the cache `make` builds with them to
/// `*out_cache`. A `struct_size` below the options' ABI 3.0 size is refused.
///
/// # Safety
/// `opts` must be NULL or readable for its `struct_size`, with NULL or C strings in its string
/// fields; `persistence` NULL, `kc_persistence_none()` or live; `out_cache` NULL or writable.
pub unsafe fn new_cache<O: BackendOptions, C>(
    opts: *const O,
    persistence: *const kc_persistence,
    out_cache: *mut *mut C,
    make: impl FnOnce(&O, memory::Options, Option<Arc<Persistence>>) -> Result<C>,
) -> kc_status {
    guard(|| {
        non_null(opts, "opts")?;
        non_null(out_cache, "out_cache")?;
        // SAFETY: `opts` is readable for its `struct_size` by contract; every field is an
        // integer, a raw pointer or an optional function pointer.
        let opts = unsafe { read_grown(opts, "opts", O::C_NAME, O::MIN_SIZE, O::defaults(), &[]) }?;
        let (max_entries, max_weight) = opts.memory_caps();
        let memory = memory::Options {
            max_entries: (max_entries != 0).then_some(max_entries),
            max_weight: (max_weight != 0).then_some(max_weight),
            ..memory::Options::default()
        };
        // SAFETY: NULL, the marker or live by contract.
        let disk = unsafe { persistence_arg(persistence) }?.cloned();
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

/// The body of `kc_<backend>_cache_stats`: writes the counters of `cache` into the caller's
/// `*out` (of at least its ABI 3.0 size), as many fields as both sides know.
///
/// # Safety
/// `cache` must be NULL or a live handle; `out` NULL or a writable struct of at least its
/// `struct_size` bytes.
pub unsafe fn write_stats<C: CacheHandle>(cache: *const C, out: *mut C::Statistics) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract; only shared access is needed.
        let stats = unsafe { live(cache, "cache") }?.statistics();
        let min = C::STATISTICS_MIN_SIZE;
        // SAFETY: `out` is NULL (refused) or a writable struct of its `struct_size` by contract.
        unsafe { write_sized(out, stats, "out", C::STATISTICS, min) }
    })
}

/// The body of `kc_<backend>_cache_reset_stats`.
///
/// # Safety
/// `cache` must be NULL or a live handle.
pub unsafe fn reset_stats<C: CacheHandle>(cache: *const C) -> kc_status {
    // SAFETY: NULL or a live cache by contract; only shared access is needed.
    guard(|| unsafe { live(cache, "cache") }.map(C::reset_stats))
}

/// The body of `kc_<backend>_cache_clear`.
///
/// # Safety
/// `cache` must be NULL or a live handle.
pub unsafe fn clear<C: CacheHandle>(cache: *const C) -> kc_status {
    // SAFETY: NULL or a live cache by contract; only shared access is needed.
    guard(|| unsafe { live(cache, "cache") }?.clear())
}
