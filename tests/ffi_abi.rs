//! The C ABI from Rust: struct layouts the header promises, a hit through `kc_*` that allocates
//! nothing, C's loose `bool`, and the status names. The behaviour scenarios run in C
//! (`c-tests/`).

use std::ffi::{CStr, c_int};
use std::mem::{offset_of, size_of};
use std::ptr;

use kcache::ffi::{
    KC_NO_DEVICE, RawValue, kc_cache_clear, kc_cache_find_or_build, kc_cache_free, kc_cache_new,
    kc_cache_options, kc_cache_options_default, kc_cache_stats, kc_status, kc_status_name,
};
use kcache_testkit::build_fn;
use kcache_testkit::ffi::CCache;
use kcache_testkit::ffi::{last_error, pipeline_desc};

build_fn!(
    /// Clears the cache it is building for (`ctx`), then builds a dummy value.
    build_then_clear,
    |ctx| {
        // SAFETY: `ctx` is the live cache the test passed.
        assert_eq!(unsafe { kc_cache_clear(ctx.cast()) }, kc_status::KC_OK);
        ptr::dangling_mut()
    }
);

#[test]
fn struct_layouts_match_the_header() {
    // The header's structs on LP64: these offsets are ABI, changing one needs a new major.
    assert_eq!(offset_of!(kc_cache_options, struct_size), 0);
    assert_eq!(offset_of!(kc_cache_options, max_entries), 8);
    assert_eq!(offset_of!(kc_cache_options, max_weight), 16);
    assert_eq!(offset_of!(kc_cache_options, invalidated_by_clear), 24);
    assert_eq!(offset_of!(kc_cache_options, destroy), 32);
    assert_eq!(offset_of!(kc_cache_options, destroy_ctx), 40);
    assert_eq!(offset_of!(kc_cache_options, on_destroy_error), 48);
    assert_eq!(offset_of!(kc_cache_options, on_destroy_error_ctx), 56);
    assert_eq!(size_of::<kc_cache_options>(), 64);
    assert_eq!(kc_cache_options_default().struct_size, 64);

    assert_eq!(offset_of!(kc_cache_stats, hits), 8);
    assert_eq!(offset_of!(kc_cache_stats, leases), 8 + 13 * 8);
    assert_eq!(size_of::<kc_cache_stats>(), 8 + 14 * 8);
    assert_eq!(size_of::<kc_status>(), size_of::<c_int>());
}

#[test]
fn a_hit_through_the_c_abi_allocates_nothing() {
    let cache = CCache::new().expect("kc_cache_new");
    let keys: Vec<Vec<u8>> = (0..64u32).map(|i| i.to_le_bytes().repeat(8)).collect();
    // Each key's value is its own address: opaque to kcache, and checkable on a hit.
    let value_of = |key: &Vec<u8>| RawValue(key.as_ptr().cast_mut().cast());
    for key in &keys {
        assert_eq!(cache.find_or_build(key, value_of(key)).0, value_of(key).0);
    }

    let mut found = 0;
    let hits = allocation_counter::measure(|| {
        for _ in 0..10 {
            for key in &keys {
                // Every key is cached, so the NULL value the build would store is never built.
                if cache.find_or_build(key, RawValue(ptr::null_mut())).0 == value_of(key).0 {
                    found += 1;
                }
            }
        }
    });
    assert_eq!(found, 640);
    assert_eq!(
        hits.count_total, 0,
        "hits allocated {} times",
        hits.count_total
    );
}

#[test]
fn any_nonzero_bool_byte_from_c_means_true() {
    // C may store any non-zero byte in a `bool`; read through raw bytes as C would write them.
    let mut bytes = [0u8; size_of::<kc_cache_options>()];
    bytes[..8].copy_from_slice(&size_of::<kc_cache_options>().to_ne_bytes());
    bytes[offset_of!(kc_cache_options, invalidated_by_clear)] = 2;
    let mut cache = ptr::null_mut();
    // SAFETY: the buffer holds a whole, suitably sized options image; it is read byte-wise.
    assert_eq!(
        unsafe { kc_cache_new(bytes.as_ptr().cast(), &mut cache) },
        kc_status::KC_OK
    );

    // A borrowing cache discards a build that a clear overtook.
    let mut lease = ptr::null_mut();
    // SAFETY: live cache; the callback gets the cache as its context.
    let status = unsafe {
        kc_cache_find_or_build(
            cache,
            b"k".as_ptr(),
            1,
            KC_NO_DEVICE,
            Some(build_then_clear),
            cache.cast(),
            &mut lease,
        )
    };
    assert_eq!(status, kc_status::KC_ERR_CACHE_CLEARED);
    assert!(lease.is_null());
    // SAFETY: the cache is live and no other call runs on it.
    unsafe { kc_cache_free(cache) };
}

#[test]
fn every_int_has_a_status_name() {
    let name = |code: c_int| {
        // SAFETY: kc_status_name returns a static C string for any int.
        unsafe { CStr::from_ptr(kc_status_name(code)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(name(0), "KC_OK");
    assert_eq!(name(kc_status::KC_ERR_BACKEND as c_int), "KC_ERR_BACKEND");
    assert_eq!(name(14), "KC_ERR_BUFFER_TOO_SMALL");
    for code in [-1, 15, 255, c_int::MIN, c_int::MAX] {
        assert_eq!(name(code), "KC_UNKNOWN_STATUS");
    }
}

#[test]
fn a_struct_size_larger_than_any_struct_is_refused_unread() {
    // `SIZE_MAX` made a slice of that length (undefined behaviour, an abort in a debug build);
    // 4097 over a 64-byte struct read past it.
    for size in [usize::MAX, isize::MAX as usize + 1, 4097] {
        let mut opts = kc_cache_options_default();
        opts.struct_size = size;
        let mut cache = ptr::null_mut();
        // SAFETY: `opts` is readable for its real size, which is all the library may read.
        let status = unsafe { kc_cache_new(&opts, &mut cache) };
        assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT, "{size}");
        assert!(
            last_error().contains("larger than any struct"),
            "{}",
            last_error()
        );
        assert!(cache.is_null());
    }
}

#[test]
fn a_pipeline_description_s_sizes_are_checked_before_use() {
    use kcache::ffi::vulkan_spec::{
        kc_vulkan_binding, kc_vulkan_pipeline_desc, kc_vulkan_spec_constant, kc_vulkan_spec_new,
    };
    let code = [0x0723_0203u32];
    let value = 7u32;
    let describe = |constants: &[kc_vulkan_spec_constant], bindings: &[kc_vulkan_binding]| {
        pipeline_desc(&code, constants, bindings)
    };
    let spec_new = |desc: &kc_vulkan_pipeline_desc| {
        let mut spec = ptr::null_mut();
        // SAFETY: every pointer of `desc` is valid for 4 bytes, which is all the library may
        // read once it has checked the sizes.
        let status = unsafe { kc_vulkan_spec_new(desc, &mut spec) };
        assert!(spec.is_null());
        (status, last_error())
    };
    // A constant of 4 GiB - 1 bytes over a 4-byte value: read (and copied) whole before its
    // size was checked.
    let huge = kc_vulkan_spec_constant {
        id: 0,
        size: u32::MAX,
        data: (&raw const value).cast(),
    };
    let (status, message) = spec_new(&describe(&[huge], &[]));
    assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
    assert!(message.contains("has 4294967295 bytes"), "{message}");
    // A set number makes `set + 1` sets: `u32::MAX` allocated 4 Gi of them.
    for set in [64, u32::MAX] {
        let binding = kc_vulkan_binding {
            set,
            binding: 0,
            descriptor_type: 7,
            count: 1,
        };
        let (status, message) = spec_new(&describe(&[], &[binding]));
        assert_eq!(status, kc_status::KC_ERR_INVALID_ARGUMENT);
        assert!(
            message.contains(&format!("descriptor set {set}")),
            "{message}"
        );
    }
}
