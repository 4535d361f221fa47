//! `kc_buffer`: bytes kcache hands to C (a verified payload read from disk, a build log). It
//! borrows kcache's copy of them until `kc_buffer_free`.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::c_void;
use std::ptr;

use super::status::guard_value;
use crate::disk::Entry;

/// Bytes kcache hands over: a verified payload read from disk (`kc_persistence_get`) or a build log
/// (`kc_opencl_cache_find_or_build_program`). `data` stays valid until `kc_buffer_free`.
#[repr(C)]
#[derive(Debug)]
pub struct kc_buffer {
    /// The payload bytes.
    pub data: *const u8,
    /// Their length.
    pub len: usize,
    /// How long the value took to build, as recorded by its writer; 0 for a build log.
    pub build_time_ns: u64,
    /// Owned by kcache.
    pub owner: *mut c_void,
}

/// What a buffer's `owner` points to: the bytes `data` borrows.
enum Owner {
    Entry(Entry),
    Text(String),
}

impl kc_buffer {
    /// Hands a verified entry to C: the buffer points into the boxed entry and owns it.
    pub(super) fn from_entry(entry: Entry) -> kc_buffer {
        let build_time_ns = u64::try_from(entry.build_time().as_nanos()).unwrap_or(u64::MAX);
        kc_buffer::owning(Owner::Entry(entry), build_time_ns)
    }

    /// Hands a text to C (not NUL-terminated: `len` bytes).
    pub(super) fn from_text(text: String) -> kc_buffer {
        kc_buffer::owning(Owner::Text(text), 0)
    }

    /// A buffer over the bytes of the boxed `owner`, which it owns until `kc_buffer_free`.
    fn owning(owner: Owner, build_time_ns: u64) -> kc_buffer {
        let owner = Box::new(owner);
        let bytes = match &*owner {
            Owner::Entry(entry) => entry.payload(),
            Owner::Text(text) => text.as_bytes(),
        };
        kc_buffer {
            data: bytes.as_ptr(),
            len: bytes.len(),
            build_time_ns,
            owner: Box::into_raw(owner).cast(),
        }
    }

    /// The zeroed buffer: nothing to free.
    pub(super) const EMPTY: kc_buffer = kc_buffer {
        data: ptr::null(),
        len: 0,
        build_time_ns: 0,
        owner: ptr::null_mut(),
    };
}

/// Releases a buffer from `kc_persistence_get` or `kc_opencl_cache_find_or_build_program` and
/// zeroes it. NULL, or a zeroed buffer, is a no-op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_buffer_free(buffer: *mut kc_buffer) {
    guard_value((), || {
        if buffer.is_null() {
            return;
        }
        // SAFETY: a buffer kcache filled: `owner` is NULL or its boxed `Owner`.
        unsafe {
            let owner = (*buffer).owner;
            if !owner.is_null() {
                drop(Box::from_raw(owner.cast::<Owner>()));
            }
            buffer.write(kc_buffer::EMPTY);
        }
    });
}
