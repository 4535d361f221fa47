//! The object store and the chain's settings configured through the C options of the
//! persistent tiers (the `s3_*`, `store_order` and `no_backfill` fields of
//! `kc_persistence_options`, new in 3.1), called as C would call them: the tier is in the
//! chain and counted in `kc_persistence_statistics`; a store order that names no store is
//! refused; a caller compiled against 3.0 (a shorter `struct_size`) still opens, without the
//! object store. No server is needed: a store connects on first use, never at open.

use std::ffi::CString;
use std::mem::offset_of;
use std::ptr;

use kcache::ffi::kc_status;
use kcache::ffi::persistence::*;
use kcache::ffi::persistence_stats::*;
use kcache_testkit::ffi::last_error;

const KEY: [u8; 32] = [3; 32];

/// Opens persistent tiers with `opts` (dir and key set here); the status and the statistics of
/// what opened (freed again).
fn open(
    mut opts: kc_persistence_options,
) -> (kc_status, Option<kc_persistence_statistics>, String) {
    let dir = tempfile::tempdir().unwrap();
    let dir_c = CString::new(dir.path().to_str().unwrap()).unwrap();
    opts.dir = dir_c.as_ptr();
    opts.key = KEY.as_ptr();
    opts.key_len = KEY.len();
    opts.ignore_env = true;
    let mut out = ptr::null_mut();
    // SAFETY: valid options (their strings live for the call) and out-pointer.
    let status = unsafe { kc_persistence_open(&opts, &mut out) };
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
    let mut opts = kc_persistence_options_default();
    opts.s3_url = url.as_ptr();
    opts.s3_timeout_ms = 200;
    let (status, stats, why) = open(opts);
    assert_eq!(status, kc_status::KC_OK, "{why}");
    let stats = stats.unwrap();
    assert!(stats.s3 && !stats.remote);
    assert_eq!((stats.s3_hits, stats.s3_puts, stats.s3_errors), (0, 0, 0));

    // Without the options' URL (and no environment read): no object store.
    let (status, stats, why) = open(kc_persistence_options_default());
    assert_eq!(status, kc_status::KC_OK, "{why}");
    assert!(!stats.unwrap().s3);
}

#[test]
fn a_store_order_naming_no_store_is_refused() {
    let order = c"s3,gcs";
    let mut opts = kc_persistence_options_default();
    opts.store_order = order.as_ptr();
    let (status, _, why) = open(opts);
    assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
    assert!(
        why.contains("store_order") && why.contains("\"gcs\" is no store"),
        "{why}"
    );

    let order = c"s3";
    let mut opts = kc_persistence_options_default();
    opts.store_order = order.as_ptr();
    opts.no_backfill = true;
    let (status, _, why) = open(opts);
    assert_eq!(status, kc_status::KC_OK, "{why}");
}

#[test]
fn a_caller_of_the_3_0_layout_still_opens() {
    let url = c"http://127.0.0.1:1/kernels/";
    let mut opts = kc_persistence_options_default();
    // What a 3.0 caller's struct holds: nothing past `remote_key_file`. Set past it, the URL
    // must not be read.
    opts.s3_url = url.as_ptr();
    opts.struct_size = offset_of!(kc_persistence_options, s3_url);
    let (status, stats, why) = open(opts);
    assert_eq!(status, kc_status::KC_OK, "{why}");
    assert!(!stats.unwrap().s3);
    // One byte shorter than 3.0's layout is refused.
    opts.struct_size -= 1;
    let (status, _, why) = open(opts);
    assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT, "{why}");
}
