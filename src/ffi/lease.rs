//! `kc_lease`: a hold on one value of a `kc_cache`. A `kc_lease *` is the lease turned into its
//! entry's raw reference count, so a hit allocates nothing and a release is one decrement.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

use super::args::{lease_handle, lease_into_raw, read_lease, release_lease};
use super::cache::RawValue;
use super::status::{guard_value, null_argument};
use crate::memory::{Entry, Lease};

type RawEntry = Entry<Vec<u8>, RawValue>;
type RawLease = Lease<Vec<u8>, RawValue>;

/// A hold on one cached value: while it exists the value is not destroyed, even if the entry
/// is removed, evicted, cleared or the cache is freed. Release each lease exactly once with
/// `kc_lease_release`, from any thread. A lease may be read from several threads at once.
pub struct kc_lease {
    _opaque: [u8; 0],
}

lease_handle!(kc_lease, RawValue);

/// The value a lease holds, exactly as the build callback returned it. Valid until the lease
/// is released. NULL if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_lease_value(lease: *const kc_lease) -> *mut c_void {
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, ptr::null_mut(), |e| e.value().0) }
}

/// The weight the build callback reported for the value; 0 if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_lease_weight(lease: *const kc_lease) -> u64 {
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, 0, RawEntry::weight) }
}

/// Another lease on the same value, to be released separately. NULL if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_lease_clone(lease: *const kc_lease) -> *mut kc_lease {
    guard_value(ptr::null_mut(), || {
        if lease.is_null() {
            null_argument("lease");
            return ptr::null_mut();
        }
        // SAFETY: a live lease is `Arc::into_raw` of its entry; the borrowed lease is never
        // dropped, so the caller's reference stays as it was.
        let borrowed = ManuallyDrop::new(RawLease::from_arc(unsafe {
            Arc::from_raw(lease.cast::<RawEntry>())
        }));
        lease_into_raw(RawLease::clone(&borrowed))
    })
}

/// Releases a lease; its value is destroyed here if it has left the cache and this was its last
/// lease. Releasing a lease twice is undefined behaviour.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_lease_release(lease: *mut kc_lease) {
    // SAFETY: the caller hands back a lease it owns, or NULL.
    guard_value((), || unsafe { release_lease(lease) });
}
