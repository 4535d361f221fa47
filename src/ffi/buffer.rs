//! `kc_buffer`: a verified payload read from disk, handed to C. It borrows kcache's copy of the
//! entry until `kc_buffer_free`.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::c_void;
use std::ptr;

use super::status::guard_value;
use crate::disk::Entry;

/// A verified payload read from disk. `data` stays valid until `kc_buffer_free`.
#[repr(C)]
#[derive(Debug)]
pub struct kc_buffer {
    /// The payload bytes.
    pub data: *const u8,
    /// Their length.
    pub len: usize,
    /// How long the value took to build, as recorded by its writer.
    pub build_time_ns: u64,
    /// Owned by kcache.
    pub owner: *mut c_void,
}

impl kc_buffer {
    /// Hands a verified entry to C: the buffer points into the boxed entry and owns it.
    pub(super) fn from_entry(entry: Entry) -> kc_buffer {
        let entry = Box::new(entry);
        let payload = entry.payload();
        let (data, len) = (payload.as_ptr(), payload.len());
        let build_time_ns = u64::try_from(entry.build_time().as_nanos()).unwrap_or(u64::MAX);
        kc_buffer {
            data,
            len,
            build_time_ns,
            owner: Box::into_raw(entry).cast(),
        }
    }
}

/// Releases a buffer from `kc_disk_get` and zeroes it. NULL, or a zeroed buffer, is a no-op.
///
/// # Safety
/// `buffer` must be NULL or a buffer filled by `kc_disk_get` and not freed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_buffer_free(buffer: *mut kc_buffer) {
    guard_value((), || {
        if buffer.is_null() {
            return;
        }
        // SAFETY: a buffer from `kc_disk_get`: `owner` is NULL or its boxed entry.
        unsafe {
            let owner = (*buffer).owner;
            if !owner.is_null() {
                drop(Box::from_raw(owner.cast::<Entry>()));
            }
            buffer.write(kc_buffer {
                data: ptr::null(),
                len: 0,
                build_time_ns: 0,
                owner: ptr::null_mut(),
            });
        }
    });
}
