//! Argument and result conventions shared by every `kc_*` function: boxed handles, leases
//! carried as raw reference counts, `struct_size`-prefixed structs, optional out-parameters,
//! C strings and arrays, and the memory and disk tiers that every backend's options describe.

use std::ffi::{CStr, c_char};
use std::mem::size_of;
use std::path::PathBuf;
use std::ptr;
use std::sync::Arc;

use super::status::{non_null, null_argument};
use crate::disk::{DiskCache, DiskConfig};
use crate::memory::{self, Entry, Lease};
use crate::{Error, Result};

/// Boxes `value` and hands the box to the caller through `out`.
///
/// # Safety
/// `out` must be non-NULL and writable.
pub unsafe fn write_boxed<T>(out: *mut *mut T, value: T) {
    // SAFETY: non-NULL and writable by the caller's contract.
    unsafe { out.write(Box::into_raw(Box::new(value))) };
}

/// Frees a handle made by [`write_boxed`]; NULL is a no-op, as every `*_free` promises.
///
/// # Safety
/// `handle` must be NULL or a box from [`write_boxed`] not yet freed.
pub unsafe fn free_boxed<T>(handle: *mut T) {
    if !handle.is_null() {
        // SAFETY: the caller hands back the box it got.
        drop(unsafe { Box::from_raw(handle) });
    }
}

/// Borrows a handle argument that must not be NULL.
///
/// # Safety
/// `handle` must be NULL or point to a live `T` that outlives `'a`, only shared meanwhile.
pub unsafe fn live<'a, T>(handle: *const T, name: &str) -> Result<&'a T> {
    non_null(handle, name)?;
    // SAFETY: non-NULL, hence live by the caller's contract.
    Ok(unsafe { &*handle })
}

/// Writes an optional out-parameter: NULL means the caller does not want the value.
///
/// # Safety
/// `out` must be NULL or writable.
pub unsafe fn write_optional<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL, hence writable by the caller's contract.
        unsafe { out.write(value) };
    }
}

/// An opaque C lease type: a pointer to it is `Arc::into_raw` of a `Lease`'s entry, so a
/// lookup that hits allocates nothing and a release is one reference-count decrement.
pub trait LeaseHandle {
    type Key;
    type Value;
}

/// The lease as the opaque pointer handed to C.
pub fn lease_into_raw<H: LeaseHandle>(lease: Lease<H::Key, H::Value>) -> *mut H {
    Arc::into_raw(lease.into_arc()).cast_mut().cast()
}

/// Borrows the entry behind a lease pointer.
///
/// # Safety
/// `lease` must be a non-NULL lease from [`lease_into_raw`], not yet released.
pub unsafe fn lease_entry<'a, H: LeaseHandle>(lease: *const H) -> &'a Entry<H::Key, H::Value> {
    // SAFETY: a lease pointer is `Arc::into_raw` of its entry, alive until released.
    unsafe { &*lease.cast::<Entry<H::Key, H::Value>>() }
}

/// [`lease_entry`] for the accessors without a status: NULL records the invalid argument and
/// gives `None`, which they turn into their NULL or 0 answer.
///
/// # Safety
/// `lease` must be NULL or a lease from [`lease_into_raw`], not yet released.
pub unsafe fn lease_entry_or_null<'a, H: LeaseHandle>(
    lease: *const H,
) -> Option<&'a Entry<H::Key, H::Value>> {
    if lease.is_null() {
        null_argument("lease");
        return None;
    }
    // SAFETY: non-NULL, and live by the caller's contract.
    Some(unsafe { lease_entry(lease) })
}

/// Gives back the reference a lease pointer owns; NULL is a no-op, as every `*_release`
/// promises. Dropping the lease runs the value's destroy if it was the last one of an
/// unlinked entry.
///
/// # Safety
/// `lease` must be NULL or a lease from [`lease_into_raw`], not yet released; it must not be
/// used afterwards.
pub unsafe fn release_lease<H: LeaseHandle>(lease: *mut H) {
    if !lease.is_null() {
        // SAFETY: the caller hands back the reference it owns, made by `Arc::into_raw`.
        let entry = unsafe { Arc::from_raw(lease.cast_const().cast::<Entry<H::Key, H::Value>>()) };
        drop(Lease::from_arc(entry));
    }
}

/// Checks the `struct_size` a caller set in a struct of type `T` (called `c_name` in C)
/// against the smallest size this library accepts, and returns it.
///
/// # Safety
/// `p` must be non-NULL and point to a readable struct whose first field is a `size_t`.
pub unsafe fn struct_size<T>(p: *const T, name: &str, c_name: &str, min: usize) -> Result<usize> {
    // SAFETY: `struct_size` is the first field of every version of these structs.
    let given = unsafe { p.cast::<usize>().read_unaligned() };
    if given < min {
        return Err(Error::InvalidArgument(format!(
            "{name}->struct_size is {given}, {c_name} is at least {min} bytes"
        )));
    }
    Ok(given)
}

/// Reads a caller's struct that starts with its size, refusing older, shorter layouts; the
/// bytes of a newer, longer one past this version's fields are not read.
///
/// # Safety
/// `p` must be non-NULL and point to a readable struct that starts with a `size_t` holding
/// its size, every field of which is valid for the bits C stored in it.
pub unsafe fn read_sized<T: Copy>(p: *const T, name: &str, c_name: &str) -> Result<T> {
    // SAFETY: forwarded from the caller's contract.
    unsafe { struct_size(p, name, c_name, size_of::<T>()) }?;
    // SAFETY: `p` points to at least a whole struct of this version.
    Ok(unsafe { p.read_unaligned() })
}

/// Writes `value` (a `repr(C)` struct whose first field is its size) into the caller's struct
/// of `out->struct_size` bytes, at least `min`: as many bytes as both sides know, with
/// `struct_size` set to that count.
///
/// # Safety
/// `out` must be non-NULL and point to a writable struct of at least its `struct_size` bytes;
/// `T` must have no padding before the bytes written.
pub unsafe fn write_sized<T: Copy>(
    out: *mut T,
    value: T,
    name: &str,
    c_name: &str,
    min: usize,
) -> Result<()> {
    // SAFETY: forwarded from the caller's contract.
    let given = unsafe { struct_size(out.cast_const(), name, c_name, min) }?;
    let n = given.min(size_of::<T>());
    // SAFETY: `value` is a local of `size_of::<T>()` bytes and `out` has at least `given`
    // writable bytes; the regions are distinct.
    unsafe {
        ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), out.cast::<u8>(), n);
        out.cast::<usize>().write_unaligned(n);
    }
    Ok(())
}

/// Borrows a NUL-terminated UTF-8 argument.
///
/// # Safety
/// `text` must be non-NULL and a C string that outlives `'a`.
pub unsafe fn c_str<'a>(text: *const c_char, name: &str) -> Result<&'a str> {
    // SAFETY: a C string by the caller's contract.
    unsafe { CStr::from_ptr(text) }
        .to_str()
        .map_err(|_| Error::InvalidArgument(format!("{name} is not valid UTF-8")))
}

/// A C string argument as a path; NULL is `None`.
///
/// # Safety
/// `text` must be NULL or a C string.
pub unsafe fn optional_path(text: *const c_char, name: &str) -> Result<Option<PathBuf>> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, hence a C string by the caller's contract.
    Ok(Some(PathBuf::from(unsafe { c_str(text, name) }?)))
}

/// Borrows `count` elements at `ptr` (which may be NULL when `count` is 0).
///
/// # Safety
/// When `count > 0`, `ptr` must be NULL or point to `count` readable elements that outlive
/// `'a`.
pub unsafe fn elements<'a, T>(ptr: *const T, count: usize, name: &str) -> Result<&'a [T]> {
    if count == 0 {
        return Ok(&[]);
    }
    non_null(ptr, name)?;
    if count > isize::MAX as usize / size_of::<T>().max(1) {
        return Err(Error::InvalidArgument(format!(
            "{name}: count {count} is too large"
        )));
    }
    // SAFETY: non-NULL, `count` readable elements by contract, size checked above.
    Ok(unsafe { std::slice::from_raw_parts(ptr, count) })
}

/// The memory and disk tiers that the options of every backend cache describe with the same
/// four fields: the memory caps (0 = unlimited) and, when `use_disk` is set, the disk tier at
/// `disk_dir` (NULL: the default location) with the environment's size cap, operator key and
/// `KCACHE_DISABLE`. Disabled, no home directory, or an untrusted directory (warned about once
/// per process): no disk tier, the cache works from memory.
///
/// # Safety
/// `disk_dir` must be NULL or a C string.
pub unsafe fn backend_tiers(
    max_entries: u64,
    max_weight: u64,
    use_disk: bool,
    disk_dir: *const c_char,
) -> Result<(memory::Options, Option<Arc<DiskCache>>)> {
    let memory = memory::Options {
        max_entries: (max_entries != 0).then_some(max_entries),
        max_weight: (max_weight != 0).then_some(max_weight),
        ..memory::Options::default()
    };
    if !use_disk {
        return Ok((memory, None));
    }
    let config = DiskConfig {
        // SAFETY: NULL or a C string by the caller's contract.
        dir: unsafe { optional_path(disk_dir, "disk_dir") }?,
        ..DiskConfig::from_env()
    };
    match DiskCache::open(config) {
        Ok(disk) => Ok((memory, Some(Arc::new(disk)))),
        Err(Error::Unavailable(_) | Error::Untrusted(_)) => Ok((memory, None)),
        Err(e) => Err(e),
    }
}
