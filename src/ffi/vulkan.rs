//! The Vulkan backend through the C ABI. The header needs no `vulkan.h`: dispatchable handles
//! (`VkInstance`, `VkPhysicalDevice`, `VkDevice`) travel as `void *`, non-dispatchable ones
//! (`VkPipeline`, `VkPipelineLayout`, `VkShaderModule`, `VkDescriptorSetLayout`) as `uint64_t`,
//! and descriptor types as their `VkDescriptorType` values.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};
use std::mem::size_of;
use std::ptr::NonNull;

use ash::vk::{self, Handle};

use super::args::{
    c_statistics, free_boxed, lease_handle, lease_into_raw, live, read_lease, release_lease,
    write_boxed, write_optional,
};
use super::backend_common::{
    backend_handles, clear, new_cache, reset_stats, with_cache, write_stats,
};
use super::cache::kc_cache_stats;
use super::persistence::kc_persistence;
use super::status::{guard, guard_value, kc_status, non_null};
use super::vulkan_device::UnregisteredDevices;
pub use super::vulkan_device::kc_vulkan_device;
use super::vulkan_spec::kc_vulkan_spec;
use crate::backend::vulkan::{Pipeline, Vulkan, VulkanCache, VulkanOptions, VulkanStats};
use crate::error::Error;

/// A cache of compute pipelines. Create with `kc_vulkan_cache_new`, free with
/// `kc_vulkan_cache_free`.
pub struct kc_vulkan_cache {
    inner: VulkanCache,
    /// Handles of the devices unregistered while the cache lives, freed with it.
    unregistered: UnregisteredDevices,
}

/// A lease on a cached pipeline: the pipeline, its shader module and its layouts stay valid
/// until `kc_vulkan_lease_release`, even if the pipeline is evicted meanwhile.
pub struct kc_vulkan_lease {
    _opaque: [u8; 0],
}

lease_handle!(kc_vulkan_lease, Pipeline);

/// `PFN_vkVoidFunction` without `vulkan.h`.
pub type kc_vulkan_void_fn = Option<unsafe extern "C" fn()>;

/// `vkGetInstanceProcAddr` with handle types that need no `vulkan.h`; cast the real one to it.
pub type kc_vulkan_get_instance_proc_addr_fn =
    Option<unsafe extern "C" fn(instance: *mut c_void, name: *const c_char) -> kc_vulkan_void_fn>;

/// How a Vulkan cache behaves. Start from `kc_vulkan_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_vulkan_options {
    pub struct_size: usize,
    /// Pipelines kept in memory at most; 0 = unlimited.
    pub max_entries: u64,
    /// Total SPIR-V bytes of the pipelines kept in memory at most; 0 = unlimited.
    pub max_weight: u64,
    /// The application's `vkGetInstanceProcAddr`; NULL: kcache loads `libvulkan.so.1`. The
    /// caller's handles must come from the same loader.
    pub get_instance_proc_addr: kc_vulkan_get_instance_proc_addr_fn,
}

backend_handles!(
    kc_vulkan_options,
    kc_vulkan_options_default,
    kc_vulkan_cache,
    VulkanCache,
    kc_vulkan_cache_statistics,
    abi_3_0: { options: 32, statistics: 200 },
);

/// Counters of a Vulkan cache. Set `struct_size` to `sizeof(kc_vulkan_cache_statistics)` first.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kc_vulkan_cache_statistics {
    pub struct_size: usize,
    /// The memory tier's counters; its `struct_size` is set too.
    pub memory: kc_cache_stats,
    /// Successful `vkCreateComputePipelines` calls.
    pub pipelines_created: u64,
    /// `vkDestroyPipeline` calls (each with its shader module).
    pub pipelines_destroyed: u64,
    /// Pipeline layouts created (one per device and layout description).
    pub layouts_created: u64,
    /// Pipeline-cache blobs read from disk (or the remote tier), validated and given to the driver.
    pub cache_data_loaded: u64,
    /// Device registrations that found no pipeline-cache data on disk.
    pub cache_data_missing: u64,
    /// Blobs refused before the driver (header of another device, driver or format) or by it.
    pub cache_data_rejected: u64,
    /// Pipeline-cache blobs written to disk.
    pub cache_data_written: u64,
    /// Blobs another process (or node) stored meanwhile, merged in before a write.
    pub cache_data_merged: u64,
    /// Disk reads or writes that failed (a failed write is also returned by the flushing call).
    pub disk_errors: u64,
}

c_statistics!(VulkanStats => kc_vulkan_cache_statistics {
    pipelines_created, pipelines_destroyed, layouts_created, cache_data_loaded,
    cache_data_missing, cache_data_rejected, cache_data_written, cache_data_merged,
    disk_errors,
} into { memory });

/// Unbounded memory caps, the system's Vulkan loader.
#[unsafe(no_mangle)]
pub extern "C" fn kc_vulkan_options_default() -> kc_vulkan_options {
    kc_vulkan_options {
        struct_size: size_of::<kc_vulkan_options>(),
        max_entries: 0,
        max_weight: 0,
        get_instance_proc_addr: None,
    }
}

/// Creates a Vulkan pipeline cache. Without a Vulkan loader, or with a `get_instance_proc_addr`
/// that does not resolve `vkCreateInstance` for a NULL instance: `KC_ERR_UNAVAILABLE`. The cache
/// keeps pipeline-cache data in `persistence` (see `kc_persistence`) and holds its own reference.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_new(
    opts: *const kc_vulkan_options,
    persistence: *mut kc_persistence,
    out_cache: *mut *mut kc_vulkan_cache,
) -> kc_status {
    let make = |opts: &kc_vulkan_options, memory, disk| {
        let vulkan = match opts.get_instance_proc_addr {
            None => None,
            Some(f) => {
                // SAFETY: on every platform Vulkan supports here, `VKAPI_CALL` is the C calling
                // convention, dispatchable handles are pointers and `PFN_vkVoidFunction` is an
                // optional function pointer, so the two types have one ABI.
                let f: vk::PFN_vkGetInstanceProcAddr = unsafe { std::mem::transmute(f) };
                // SAFETY: the caller vouches for the function by contract.
                Some(unsafe { Vulkan::from_get_instance_proc_addr(f) }?)
            }
        };
        let inner = VulkanCache::new(VulkanOptions {
            memory,
            persistence: disk,
            vulkan,
        })?;
        Ok(kc_vulkan_cache {
            inner,
            unregistered: UnregisteredDevices::default(),
        })
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { new_cache(opts, persistence, out_cache, make) }
}

/// Frees the cache. Every device still registered has its pipeline-cache data written back (when
/// pipelines were created since the last write) and its `VkPipelineCache` destroyed, so free the
/// cache before destroying those devices; pipelines no lease holds are destroyed now, the others at
/// their last release. No other call on `cache` may run during or after this one. The handles
/// of devices unregistered before are freed with the cache; those of devices still registered
/// may only be passed to `kc_vulkan_cache_unregister_device` afterwards, which just frees them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_free(cache: *mut kc_vulkan_cache) {
    // SAFETY: the caller hands over the cache it got from `kc_vulkan_cache_new`, or NULL.
    guard_value((), || unsafe { free_boxed(cache) })
}

/// Registers the caller's device with the cache: kcache reads its properties, creates its
/// `VkPipelineCache` (seeded from disk data whose header names this device), and records pipelines
/// under it. The caller keeps owning the three related handles, made through the cache's loader:
/// they must outlive the registration and every lease of the device's pipelines.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_register_device(
    cache: *mut kc_vulkan_cache,
    instance: *mut c_void,
    physical_device: *mut c_void,
    device: *mut c_void,
    out_device: *mut *mut kc_vulkan_device,
) -> kc_status {
    let register = |cache: &VulkanCache| {
        let instance = dispatchable(instance, "instance")?;
        let physical_device = dispatchable(physical_device, "physical_device")?;
        let device = dispatchable(device, "device")?;
        non_null(out_device, "out_device")?;
        // SAFETY: the handles' validity is the caller's contract, forwarded.
        let registered = unsafe { cache.register_device(instance, physical_device, device) }?;
        // SAFETY: `out_device` is non-NULL and writable by contract.
        unsafe { write_boxed(out_device, kc_vulkan_device::new(registered)) };
        Ok(())
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_cache(cache, register) }
}

/// A dispatchable handle argument (`void *` in C) as its `ash` type; NULL is an invalid
/// argument.
pub(super) fn dispatchable<H: Handle>(raw: *mut c_void, name: &str) -> Result<H, Error> {
    non_null(raw, name)?;
    Ok(H::from_raw(raw as u64))
}

/// Device teardown, before `vkDestroyDevice`: writes the device's pipeline-cache data back,
/// destroys its `VkPipelineCache`, and evicts its pipelines (destroyed now, or at their last
/// lease release). `*out_still_leased` (if not NULL) receives how many pipelines leases still
/// hold: release them before destroying the device. The teardown happens whatever the status (a
/// failed write-back is reported). NULL `device` is a no-op.
///
/// No other call may pass `device` while this one runs. The handle stays allocated until the
/// cache is freed: a later call with it (a lookup, a flush, unregistering it again) is
/// `KC_ERR_DEVICE_DESTROYED`. Once the cache is freed, `cache` may be anything: a
/// handle still registered then is just freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_unregister_device(
    cache: *mut kc_vulkan_cache,
    device: *mut kc_vulkan_device,
    out_still_leased: *mut u64,
) -> kc_status {
    guard(|| {
        let Some(device) = NonNull::new(device) else {
            return Ok(());
        };
        // SAFETY: a handle from `kc_vulkan_cache_register_device`, which no other call uses
        // during this one (the contract); its cache is checked before it is touched.
        if unsafe { device.as_ref() }.outlived_its_cache() {
            // SAFETY: as above; the cache that would have freed it is gone.
            unsafe { free_boxed(device.as_ptr()) };
            return Ok(());
        }
        // SAFETY: NULL or a live cache by contract; only shared access is needed.
        let cache = unsafe { live(cache, "cache") }?;
        // SAFETY: as above; from now on the cache frees the handle.
        let registered = unsafe { cache.unregistered.retire(device) }?;
        let still_leased = cache.inner.unregister_device(&registered)?;
        // SAFETY: NULL or writable by contract.
        unsafe { write_optional(out_still_leased, still_leased) };
        Ok(())
    })
}

/// Unlinks every pipeline of every device; each is destroyed now, or when its last lease is
/// released. Devices stay registered and their pipeline caches (and the data on disk) keep
/// what the driver stored, so rebuilding is cheaper than the first build.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_clear(cache: *mut kc_vulkan_cache) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { clear(cache) }
}

/// Writes the device's pipeline-cache data to disk now if pipelines were created (or data
/// loaded from the remote tier) since the last write, merging what other processes stored
/// meanwhile; with a remote tier that takes writes (`remote_url` or `KCACHE_REMOTE_URL`),
/// merges the remote's data too and writes the result there in the background (freeing the
/// cache waits for it). `*out_written` (if not NULL) says whether it wrote to disk. Without a
/// disk tier it writes nothing and succeeds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_flush(
    cache: *mut kc_vulkan_cache,
    device: *const kc_vulkan_device,
    out_written: *mut bool,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or live objects by contract; only shared access is needed.
        let (cache, device) = unsafe { (live(cache, "cache")?, live(device, "device")?) };
        let written = cache.inner.flush(device.registered()?)?;
        // SAFETY: NULL or writable by contract.
        unsafe { write_optional(out_written, written) };
        Ok(())
    })
}

/// The compute pipeline for `spec` on `device`: from memory, else created (concurrent callers of
/// one description share one `vkCreateComputePipelines`). The pipeline belongs to the cache: do not
/// destroy it; release the lease. A driver failure is `KC_ERR_BUILD_FAILED` with the `VkResult` in
/// `kc_last_build_error()`; a device already unregistered is `KC_ERR_DEVICE_DESTROYED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_find_or_build(
    cache: *mut kc_vulkan_cache,
    device: *const kc_vulkan_device,
    spec: *const kc_vulkan_spec,
    out_lease: *mut *mut kc_vulkan_lease,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or live objects by contract; only shared access is needed.
        let (cache, device, spec) = unsafe {
            (
                live(cache, "cache")?,
                live(device, "device")?,
                live(spec, "spec")?,
            )
        };
        non_null(out_lease, "out_lease")?;
        let lease = cache
            .inner
            .find_or_build(device.registered()?, &spec.inner)?;
        // SAFETY: `out_lease` is non-NULL and writable by contract.
        unsafe { out_lease.write(lease_into_raw(lease)) };
        Ok(())
    })
}

/// The leased `VkPipeline`; 0 if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_lease_pipeline(lease: *const kc_vulkan_lease) -> u64 {
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, 0, |e| e.value().pipeline().as_raw()) }
}

/// The leased pipeline's `VkPipelineLayout` (created by kcache); 0 if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_lease_layout(lease: *const kc_vulkan_lease) -> u64 {
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, 0, |e| e.value().layout().as_raw()) }
}

/// The `VkDescriptorSetLayout` of descriptor set `set`; 0 if `lease` is NULL or the layout
/// has no such set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_lease_set_layout(
    lease: *const kc_vulkan_lease,
    set: u32,
) -> u64 {
    let layout = |p: &Pipeline| p.set_layouts().get(set as usize).map_or(0, |l| l.as_raw());
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, 0, |e| layout(e.value())) }
}

/// The leased pipeline's `VkShaderModule`; 0 if `lease` is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_lease_shader_module(lease: *const kc_vulkan_lease) -> u64 {
    // SAFETY: NULL or a live lease by contract.
    unsafe { read_lease(lease, 0, |e| e.value().shader_module().as_raw()) }
}

/// Releases a lease; the last release of an evicted pipeline destroys it, which must then no
/// longer be executing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_lease_release(lease: *mut kc_vulkan_lease) {
    // SAFETY: the caller hands back a lease it owns, or NULL.
    guard_value((), || unsafe { release_lease(lease) })
}

/// Fills `*out`, whose `struct_size` the caller set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_stats(
    cache: *const kc_vulkan_cache,
    out: *mut kc_vulkan_cache_statistics,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { write_stats(cache, out) }
}

/// Zeroes the event counters of the cache, of its memory tier and of its `kc_persistence`
/// (for every cache sharing it); gauges stay (`docs/c-api.md`, "Statistics reset by a baseline").
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_reset_stats(cache: *mut kc_vulkan_cache) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    unsafe { reset_stats(cache) }
}

/// Whether the system's Vulkan loader can be opened here: `KC_OK`, or `KC_ERR_UNAVAILABLE`
/// with the reason in `kc_last_error_message()`.
#[unsafe(no_mangle)]
pub extern "C" fn kc_vulkan_available() -> kc_status {
    guard(|| Vulkan::load().map(drop))
}
