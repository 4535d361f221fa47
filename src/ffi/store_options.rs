//! `kc_store_options`: the settings of the stores behind the disk tier that C API 3.0's
//! `kc_persistence_options` cannot hold (new in 3.1), and `kc_persistence_open_with_stores`.
//! A struct of its own because `kc_persistence_options_default()` returns its struct by value,
//! which a caller compiled against an older header holds in fewer bytes: it can never grow.
//! This one is filled through a pointer, at the caller's `struct_size`, so it can.

use std::ffi::c_char;
use std::mem::{offset_of, size_of};
use std::ptr;
use std::time::Duration;

use super::args::{GrownInput, invalid, optional_path, read_input, write_sized};
use super::persistence::{
    config_of, kc_persistence, kc_persistence_options, open_into, optional_text,
};
use super::status::{guard, kc_status, non_null};
use crate::PersistenceConfig;
use crate::error::Result;
use crate::object_store::ObjectStoreConfig;
use crate::store::StoreKind;

/// Added in 3.1. The object store and the chain's order and backfill (`docs/object-store.md`):
/// set `struct_size`, then `kc_store_options_default`. NULL or 0: `KCACHE_S3_*`,
/// `KCACHE_STORE_*` unless `ignore_env`. No secret here. `s3_allow_unkeyed` is **unsafe**.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_store_options {
    pub struct_size: usize,
    pub s3_url: *const c_char,
    pub s3_endpoint: *const c_char,
    pub s3_region: *const c_char,
    pub s3_credentials_file: *const c_char,
    pub s3_profile: *const c_char,
    pub s3_read_only: bool,
    pub s3_allow_unkeyed: bool,
    pub s3_timeout_ms: u64,
    pub s3_max_entry_size: u64,
    pub s3_lease_wait_ms: u64,
    pub store_order: *const c_char,
    pub no_backfill: bool,
}

/// The struct's size in C API 3.1, which introduced it: the least a caller may hand in. Fields
/// added later go at the end, and a 3.1 caller's struct stays valid without them.
const SIZE_3_1: usize = 96;
const _: () = assert!(size_of::<kc_store_options>() == SIZE_3_1);

// SAFETY: every field but the bools is an integer or a raw pointer.
unsafe impl GrownInput for kc_store_options {
    const C_NAME: &str = "kc_store_options";
    const MIN_SIZE: usize = SIZE_3_1;
    const BOOLS: &[usize] = &[
        offset_of!(kc_store_options, s3_read_only),
        offset_of!(kc_store_options, s3_allow_unkeyed),
        offset_of!(kc_store_options, no_backfill),
    ];
    const DEFAULT: kc_store_options = kc_store_options {
        struct_size: size_of::<kc_store_options>(),
        s3_url: ptr::null(),
        s3_endpoint: ptr::null(),
        s3_region: ptr::null(),
        s3_credentials_file: ptr::null(),
        s3_profile: ptr::null(),
        s3_read_only: false,
        s3_allow_unkeyed: false,
        s3_timeout_ms: 0,
        s3_max_entry_size: 0,
        s3_lease_wait_ms: 0,
        store_order: ptr::null(),
        no_backfill: false,
    };
}

/// Added in 3.1. Fills `*out` with the defaults, as many bytes of it as its `struct_size` says.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_store_options_default(out: *mut kc_store_options) -> kc_status {
    guard(|| {
        let defaults = kc_store_options::DEFAULT;
        // The size `kc_persistence_open_with_stores` accepts, at least.
        let min = kc_store_options::MIN_SIZE;
        // SAFETY: NULL (refused) or writable for its `struct_size` by contract.
        unsafe { write_sized(out, defaults, "out", "kc_store_options", min) }
    })
}

/// Added in 3.1. As `kc_persistence_open`, with the stores `stores` describes (NULL: env).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_open_with_stores(
    opts: *const kc_persistence_options,
    stores: *const kc_store_options,
    out: *mut *mut kc_persistence,
) -> kc_status {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: forwarded from the caller's contract.
        let mut config = unsafe { config_of(opts) }?;
        if !stores.is_null() {
            // SAFETY: non-NULL; its size and strings are the caller's promise.
            unsafe { apply(&mut config, stores) }?;
        }
        // SAFETY: non-NULL and writable by contract.
        unsafe { open_into(config, out) }
    })
}

/// `config` with the settings of `*stores`.
///
/// # Safety
/// `stores` must be non-NULL, point to `stores->struct_size` readable bytes, its strings NULL
/// or C strings.
unsafe fn apply(config: &mut PersistenceConfig, stores: *const kc_store_options) -> Result<()> {
    // SAFETY: readable for its size by the caller's contract.
    let s = unsafe { read_input(stores, "stores") }?;
    // SAFETY: NULL or C strings by the caller's contract.
    let text =
        |p: *const c_char, field: &str| unsafe { optional_text(p, &format!("stores->{field}")) };
    let nonzero = |n: u64| (n != 0).then_some(n);
    config.object_store = Some(ObjectStoreConfig {
        url: text(s.s3_url, "s3_url")?,
        endpoint: text(s.s3_endpoint, "s3_endpoint")?,
        region: text(s.s3_region, "s3_region")?,
        // SAFETY: NULL or a C string by the caller's contract.
        credentials_file: unsafe {
            optional_path(s.s3_credentials_file, "stores->s3_credentials_file")
        }?,
        profile: text(s.s3_profile, "s3_profile")?,
        read_only: s.s3_read_only.then_some(true),
        timeout: nonzero(s.s3_timeout_ms).map(Duration::from_millis),
        max_entry_size: nonzero(s.s3_max_entry_size),
        lease_wait: nonzero(s.s3_lease_wait_ms).map(Duration::from_millis),
        allow_unkeyed: s.s3_allow_unkeyed,
        read_env: config.read_env,
        ..ObjectStoreConfig::default()
    });
    if let Some(order) = text(s.store_order, "store_order")? {
        let kinds = StoreKind::parse_order(&order)
            .map_err(|why| invalid(format!("stores->store_order {order:?}: {why}")))?;
        config.store_order = Some(kinds);
    }
    if s.no_backfill {
        config.backfill = Some(false);
    }
    Ok(())
}
