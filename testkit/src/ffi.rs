//! A `kc_cache` driven through its exported functions as a C caller drives it, for the C ABI
//! benchmark and tests.

use std::ffi::CStr;
use std::ptr;

use kcache::ffi::vulkan_spec::{
    kc_vulkan_binding, kc_vulkan_pipeline_desc, kc_vulkan_spec_constant,
};
use kcache::ffi::{
    KC_NO_DEVICE, RawValue, kc_cache, kc_cache_find_or_build, kc_cache_free, kc_cache_new,
    kc_cache_options_default, kc_last_error_message, kc_lease_release, kc_lease_value, kc_status,
};

/// The message of the last failed kcache call on this thread.
pub fn last_error() -> String {
    // SAFETY: never NULL, valid until the next kcache call on this thread.
    unsafe { CStr::from_ptr(kc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// A pipeline description of the SPIR-V `code` with `constants` and `bindings`, the rest zero
/// (the default entry point, no push constants, no flags): what a C caller fills in.
pub fn pipeline_desc(
    code: &[u32],
    constants: &[kc_vulkan_spec_constant],
    bindings: &[kc_vulkan_binding],
) -> kc_vulkan_pipeline_desc {
    kc_vulkan_pipeline_desc {
        struct_size: size_of::<kc_vulkan_pipeline_desc>(),
        code: code.as_ptr(),
        code_size: size_of_val(code),
        entry_point: ptr::null(),
        constants: constants.as_ptr(),
        constant_count: constants.len(),
        bindings: bindings.as_ptr(),
        binding_count: bindings.len(),
        push_constant_offset: 0,
        push_constant_size: 0,
        specialization: ptr::null(),
        flags: 0,
        required_subgroup_size: 0,
    }
}

/// Reads the C statistics struct `$ty` of the live object `$object` through `$read` as a C
/// caller does: the struct's size set, the rest zero, the call asserted to succeed.
#[macro_export]
macro_rules! c_stats {
    ($read:expr, $object:expr, $ty:ty) => {{
        let mut out = <$ty as ::std::default::Default>::default();
        out.struct_size = ::std::mem::size_of::<$ty>();
        // SAFETY: the caller names a live object; `out` is a writable struct of its size.
        let status = unsafe { $read($object, &mut out) };
        assert_eq!(
            status,
            ::kcache::ffi::kc_status::KC_OK,
            "{}",
            $crate::ffi::last_error()
        );
        out
    }};
}

/// Defines `unsafe extern "C" fn $name`, a `kc_build_fn` that stores the value `$value`, an
/// expression of its context `$ctx`, and reports success; the key and the weight go unused.
#[macro_export]
macro_rules! build_fn {
    ($(#[$attr:meta])* $name:ident, |$ctx:ident| $value:expr) => {
        $(#[$attr])*
        unsafe extern "C" fn $name(
            $ctx: *mut ::std::ffi::c_void,
            _key: *const u8,
            _key_len: usize,
            out_value: *mut *mut ::std::ffi::c_void,
            _out_weight: *mut u64,
        ) -> ::std::ffi::c_int {
            let value = $value;
            // SAFETY: kcache passes a writable out-pointer.
            unsafe { out_value.write(value) };
            0
        }
    };
}

build_fn!(
    /// Builds the value `ctx`.
    build,
    |ctx| ctx
);

/// A cache with the default options, freed on drop.
pub struct CCache(*mut kc_cache);

impl CCache {
    pub fn new() -> Result<CCache, kc_status> {
        let mut cache = ptr::null_mut();
        // SAFETY: a whole options struct and a writable out-pointer.
        match unsafe { kc_cache_new(&kc_cache_options_default(), &mut cache) } {
            kc_status::KC_OK => Ok(CCache(cache)),
            status => Err(status),
        }
    }

    /// `kc_cache_find_or_build` (building `value` on a miss), `kc_lease_value` and
    /// `kc_lease_release`: the value stored for `key`, NULL on failure. Inlined, so the calls
    /// into the library are made from the caller's crate, as a C caller makes them.
    #[inline]
    pub fn find_or_build(&self, key: &[u8], value: RawValue) -> RawValue {
        let mut lease = ptr::null_mut();
        // SAFETY: a live cache, a key slice, a writable out-pointer; values are opaque, never
        // dereferenced; the lease (NULL on failure, which both calls accept) is released once.
        unsafe {
            let status = kc_cache_find_or_build(
                self.0,
                key.as_ptr(),
                key.len(),
                KC_NO_DEVICE,
                Some(build),
                value.0,
                &mut lease,
            );
            debug_assert_eq!(status, kc_status::KC_OK);
            let value = RawValue(kc_lease_value(lease));
            kc_lease_release(lease);
            value
        }
    }
}

impl Drop for CCache {
    fn drop(&mut self) {
        // SAFETY: the cache is live and this is its last use.
        unsafe { kc_cache_free(self.0) };
    }
}
