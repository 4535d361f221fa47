//! The entries of a `kc_persistence`, read and written by key: `KC_KEY_LEN` bytes from a
//! `kc_key_builder`; payloads come back in a `kc_buffer`.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::ptr;
use std::time::Duration;

use super::args::{c_str, read_sized};
use super::buffer::kc_buffer;
use super::key_builder::key_arg;
use super::persistence::{kc_persistence, persistence_ref};
use super::status::{byte_slice, guard, kc_status, non_null};
use crate::disk::Descriptor;
use crate::{Error, Result};

/// Writes the entry for `key` atomically, of backend `custom`. `KC_ERR_IO` when the write fails
/// (nothing partial is left); `KC_ERR_INVALID_ARGUMENT` when the entry is larger than the smaller
/// of the size cap and 1 GiB. It waits for the directory scan (`kc_persistence_wait_scan`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_put(
    persistence: *mut kc_persistence,
    key: *const u8,
    data: *const u8,
    len: usize,
    build_time_ns: u64,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract; a NULL descriptor is the default one.
    unsafe { kc_persistence_put_described(persistence, key, data, len, build_time_ns, ptr::null()) }
}

/// What an entry holds, for `kc_persistence_put_described` and `kc_tiered_find_or_build_described`:
/// `kcache ls` shows it and `kcache evict` selects by it. Each string is NULL or UTF-8, and is
/// cut to its `KC_DESCRIPTOR_*_MAX` bytes on a character boundary.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_entry_descriptor {
    pub struct_size: usize,
    /// The backend's short name (`opencl`, `cuda`, your own); NULL or empty: `custom`.
    pub backend: *const c_char,
    /// The device's name; NULL: empty.
    pub device: *const c_char,
    /// What the entry holds (kernel or program names); NULL: empty.
    pub name: *const c_char,
}

/// `kc_entry_descriptor` in ABI 3.0, its only layout so far. It is read whole (`read_sized`): a
/// field appended needs a read at the caller's size (`read_grown`), with this as its minimum.
const SIZE_3_0: usize = 32;
const _: () = assert!(size_of::<kc_entry_descriptor>() == SIZE_3_0);

/// `kc_persistence_put`, with what the entry holds (`descriptor` NULL: backend `custom`, no device,
/// no name). A descriptor string that is not UTF-8 is `KC_ERR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_put_described(
    persistence: *mut kc_persistence,
    key: *const u8,
    data: *const u8,
    len: usize,
    build_time_ns: u64,
    descriptor: *const kc_entry_descriptor,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let (disk, key, descriptor) = unsafe {
            (
                persistence_ref(persistence)?,
                key_arg(key)?,
                descriptor_arg(descriptor)?,
            )
        };
        // The length against the entry size limit before a byte of `data` is touched: an
        // oversized payload is refused at once, whatever memory lies past the caller's buffer.
        disk.check_payload_len(len, &descriptor)?;
        // SAFETY: the caller promises `len` readable bytes at `data`; NULL is refused inside.
        let data = unsafe { byte_slice(data, len, "data") }?;
        disk.put_described(&key, data, Duration::from_nanos(build_time_ns), &descriptor)
    })
}

/// Longest backend name an entry keeps, in bytes.
pub const KC_DESCRIPTOR_BACKEND_MAX: usize = 32;
/// Longest device name an entry keeps, in bytes.
pub const KC_DESCRIPTOR_DEVICE_MAX: usize = 256;
/// Longest entry name an entry keeps, in bytes.
pub const KC_DESCRIPTOR_NAME_MAX: usize = 1024;

const _: () = {
    assert!(KC_DESCRIPTOR_BACKEND_MAX == crate::disk::MAX_BACKEND_LEN);
    assert!(KC_DESCRIPTOR_DEVICE_MAX == crate::disk::MAX_DEVICE_LEN);
    assert!(KC_DESCRIPTOR_NAME_MAX == crate::disk::MAX_NAME_LEN);
};

/// The caller's descriptor; NULL is the default one.
///
/// # Safety
/// `p` NULL or readable for its `struct_size`, its strings NULL or C strings.
pub(super) unsafe fn descriptor_arg(p: *const kc_entry_descriptor) -> Result<Descriptor> {
    if p.is_null() {
        return Ok(Descriptor::default());
    }
    // SAFETY: non-NULL and readable for its `struct_size` by contract; every field is valid
    // for any bits (a size, raw pointers).
    let d = unsafe { read_sized(p, "descriptor", "kc_entry_descriptor") }?;
    let text = |p: *const c_char, what| {
        if p.is_null() {
            Ok("")
        } else {
            // SAFETY: non-NULL, hence a C string by the caller's contract.
            unsafe { c_str(p, what) }
        }
    };
    Ok(Descriptor::new(
        text(d.backend, "descriptor->backend")?,
        text(d.device, "descriptor->device")?,
        text(d.name, "descriptor->name")?,
    ))
}

/// Reads and verifies the entry for `key` into `*out` (free it with `kc_buffer_free`). Misses:
/// `KC_ERR_NOT_FOUND`, `KC_ERR_INTEGRITY` (the entry was refused and removed), `KC_ERR_IO`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_get(
    persistence: *mut kc_persistence,
    key: *const u8,
    out: *mut kc_buffer,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let (disk, key) = unsafe { (persistence_ref(persistence)?, key_arg(key)?) };
        non_null(out, "out")?;
        let entry = disk.get(&key)?.ok_or(Error::NotFound)?;
        // SAFETY: non-NULL and writable by contract.
        unsafe { out.write(kc_buffer::from_entry(entry)) };
        Ok(())
    })
}

/// Removes the entry for `key`; `KC_ERR_NOT_FOUND` when there is none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_remove(
    persistence: *mut kc_persistence,
    key: *const u8,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let (disk, key) = unsafe { (persistence_ref(persistence)?, key_arg(key)?) };
        if disk.remove(&key)? {
            Ok(())
        } else {
            Err(Error::NotFound)
        }
    })
}
