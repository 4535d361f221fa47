//! The object store and the chain's settings configured through C (`kc_store_options` and
//! `kc_persistence_open_with_stores`, new in 3.1), called as C would call them: the tier is in
//! the chain and counted in `kc_persistence_statistics`; a store order that names no store is
//! refused; the defaults are written at the caller's `struct_size`, so a caller compiled
//! against a shorter layout gets only its own fields. No server is needed: a store connects on
//! first use, never at open.

use std::ffi::CString;
use std::mem::size_of;
use std::ptr;

use kcache::ffi::kc_status;
use kcache::ffi::persistence::*;
use kcache::ffi::persistence_stats::*;
use kcache::ffi::store_options::*;
use kcache_testkit::ffi::last_error;

const KEY: [u8; 32] = [3; 32];

/// The default store options.
fn defaults() -> kc_store_options {
    // SAFETY: zeroed is a valid value of the struct (NULLs, zeros, false).
    let mut stores: kc_store_options = unsafe { std::mem::zeroed() };
    stores.struct_size = size_of::<kc_store_options>();
    // SAFETY: a writable struct of its `struct_size`.
    assert_eq!(
        unsafe { kc_store_options_default(&mut stores) },
        kc_status::KC_OK
    );
    stores
}

/// Opens persistent tiers (a directory and key set here, no environment) with `stores`; the
/// status and the statistics of what opened (freed again).
fn open(stores: &kc_store_options) -> (kc_status, Option<kc_persistence_statistics>, String) {
    let mut opts = kc_persistence_options_default();
    let dir = tempfile::tempdir().unwrap();
    let dir_c = CString::new(dir.path().to_str().unwrap()).unwrap();
    opts.dir = dir_c.as_ptr();
    opts.key = KEY.as_ptr();
    opts.key_len = KEY.len();
    opts.ignore_env = true;
    let mut out = ptr::null_mut();
    // SAFETY: valid options (their strings live for the call) and out-pointer.
    let status = unsafe { kc_persistence_open_with_stores(&opts, stores, &mut out) };
    if status != kc_status::KC_OK {
        return (status, None, last_error());
    }
    let stats = kcache_testkit::c_stats!(kc_persistence_stats, out, kc_persistence_statistics);
    // SAFETY: from kc_persistence_open, freed once.
    unsafe { kc_persistence_free(out) };
    (status, Some(stats), String::new())
}

#[test]
fn the_object_store_comes_from_the_options_and_is_counted() {
    let url = c"http://127.0.0.1:1/kernels/team/";
    let mut stores = defaults();
    stores.s3_url = url.as_ptr();
    stores.s3_timeout_ms = 200;
    let (status, stats, why) = open(&stores);
    assert_eq!(status, kc_status::KC_OK, "{why}");
    let stats = stats.unwrap();
    assert!(stats.s3 && !stats.remote);
    assert_eq!((stats.s3_hits, stats.s3_puts, stats.s3_errors), (0, 0, 0));

    // Without a URL (and no environment read): no object store.
    let (status, stats, why) = open(&defaults());
    assert_eq!(status, kc_status::KC_OK, "{why}");
    assert!(!stats.unwrap().s3);
}

#[test]
fn a_store_order_naming_no_store_is_refused() {
    let order = c"s3,gcs";
    let mut stores = defaults();
    stores.store_order = order.as_ptr();
    let (status, _, why) = open(&stores);
    assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
    assert!(
        why.contains("stores->store_order") && why.contains("\"gcs\" is no store"),
        "{why}"
    );

    let order = c"s3";
    let mut stores = defaults();
    stores.store_order = order.as_ptr();
    stores.no_backfill = true;
    let (status, _, why) = open(&stores);
    assert_eq!(status, kc_status::KC_OK, "{why}");
}

#[test]
fn the_defaults_need_the_size_of_the_release_that_made_the_struct() {
    // A struct one byte shorter than C API 3.1's, which introduced it, is refused untouched:
    // the same size kc_persistence_open_with_stores would refuse.
    let mut stores = defaults();
    stores.s3_timeout_ms = 7;
    stores.struct_size = size_of::<kc_store_options>() - 1;
    // SAFETY: writable for its `struct_size` (the whole struct, in fact).
    let status = unsafe { kc_store_options_default(&mut stores) };
    assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
    assert_eq!(stores.s3_timeout_ms, 7, "a refused struct is not written");
    // At 3.1's size: every field defaulted.
    stores.struct_size = size_of::<kc_store_options>();
    // SAFETY: as above.
    assert_eq!(
        unsafe { kc_store_options_default(&mut stores) },
        kc_status::KC_OK
    );
    assert_eq!(stores.s3_timeout_ms, 0);
}
