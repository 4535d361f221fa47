//! A device whose destruction the caller hands to kcache, as `register_owned_device` does in
//! Rust. A program that destroys its `VkDevice` before unregistering it, or that releases a
//! lease after destroying it, makes kcache call into a dead device; with the device handed
//! over, kcache destroys it itself once nothing of it is left, whatever order the program
//! unregisters, frees and releases in.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ash::vk::{self, Handle};

use super::args::write_boxed;
use super::backend_common::with_cache;
use super::status::{kc_status, non_null};
use super::vulkan::{dispatchable, kc_vulkan_cache, kc_vulkan_device};
use crate::backend::vulkan::{DeviceOwner, VulkanCache};
use crate::error::Error;

/// Destroys a device handed to kcache: `device` is the `VkDevice` registered, `user_data` what
/// the registration was given. Typically calls `vkDestroyDevice(device, NULL)`, and may destroy
/// the instance too once the program needs it no longer.
pub type kc_vulkan_destroy_device_fn =
    Option<unsafe extern "C" fn(device: *mut c_void, user_data: *mut c_void)>;

/// The caller's device and how to destroy it; dropped when the registration, the cache's
/// per-device state and the last pipeline and layout of the device are all gone.
struct CallerDevice {
    instance: vk::Instance,
    physical_device: vk::PhysicalDevice,
    device: vk::Device,
    destroy: unsafe extern "C" fn(device: *mut c_void, user_data: *mut c_void),
    user_data: *mut c_void,
    /// Cleared when the registration fails: the device then stays the caller's.
    armed: AtomicBool,
}

// SAFETY: the handles are plain values; `destroy` may be called from any thread with
// `user_data` (the contract of `kc_vulkan_cache_register_owned_device`), and it is called once.
unsafe impl Send for CallerDevice {}
// SAFETY: as for `Send`: nothing is reached through a shared reference but the handles' values.
unsafe impl Sync for CallerDevice {}

// SAFETY: the registration's contract: live, related handles from the cache's loader, which
// the caller leaves alive until `destroy` is called, which happens only when this is dropped.
unsafe impl DeviceOwner for CallerDevice {
    fn instance(&self) -> vk::Instance {
        self.instance
    }
    fn physical_device(&self) -> vk::PhysicalDevice {
        self.physical_device
    }
    fn device(&self) -> vk::Device {
        self.device
    }
}

impl Drop for CallerDevice {
    fn drop(&mut self) {
        if *self.armed.get_mut() {
            // SAFETY: the caller's function, given its own device and data, called once: kcache
            // holds no object of the device any more.
            unsafe { (self.destroy)(self.device.as_raw() as *mut c_void, self.user_data) };
        }
    }
}

/// As `kc_vulkan_cache_register_device`, but kcache takes the device: it calls
/// `destroy(device, user_data)` once the device is unregistered (`kc_vulkan_cache_unregister_device`,
/// which frees `*out_device`) and the last lease of its pipelines is released, after destroying
/// every object it made of it. The program must not destroy the device itself; it may unregister
/// it, free the cache and release leases in any order. `destroy` runs on the thread of the call
/// that lets go of the device last (an unregistration, a lease release, `kc_vulkan_cache_free`).
/// The instance must outlive the device: destroy it in `destroy`, or after it has run. NULL
/// `destroy` is `KC_ERR_INVALID_ARGUMENT`. On failure the device stays the caller's and `destroy`
/// is not called.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_cache_register_owned_device(
    cache: *mut kc_vulkan_cache,
    instance: *mut c_void,
    physical_device: *mut c_void,
    device: *mut c_void,
    destroy: kc_vulkan_destroy_device_fn,
    user_data: *mut c_void,
    out_device: *mut *mut kc_vulkan_device,
) -> kc_status {
    let register = |cache: &VulkanCache| {
        // Every argument is checked before the owner exists: dropping it destroys the device.
        let destroy = destroy.ok_or_else(|| Error::InvalidArgument("destroy is NULL".into()))?;
        non_null(out_device, "out_device")?;
        let owner = Arc::new(CallerDevice {
            instance: dispatchable(instance, "instance")?,
            physical_device: dispatchable(physical_device, "physical_device")?,
            device: dispatchable(device, "device")?,
            destroy,
            user_data,
            armed: AtomicBool::new(true),
        });
        match cache.register_owned_device(owner.clone()) {
            Ok(registered) => {
                // SAFETY: `out_device` is non-NULL and writable by contract.
                unsafe { write_boxed(out_device, kc_vulkan_device { inner: registered }) };
                Ok(())
            }
            Err(e) => {
                owner.armed.store(false, Ordering::Relaxed);
                Err(e)
            }
        }
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_cache(cache, register) }
}
