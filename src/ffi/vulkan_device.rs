//! The handle of a registered device, and a device whose destruction the caller hands to
//! kcache.
//!
//! A handle outlives its registration: the cache keeps the handles of unregistered devices until
//! it is freed, so a call that still passes one (a lookup, a flush, a second unregistration) is
//! `KC_ERR_DEVICE_DESTROYED`, never a read of freed memory. Each costs a few dozen bytes until
//! then.
//!
//! A program that destroys its `VkDevice` before unregistering it, or that releases a lease
//! after destroying it, makes kcache call into a dead device; with the device handed over (as
//! `register_owned_device` does in Rust), kcache destroys it itself once nothing of it is left,
//! whatever order the program unregisters, frees and releases in.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ash::vk::{self, Handle};
use parking_lot::Mutex;

use super::args::write_boxed;
use super::backend_common::with_cache;
use super::status::{kc_status, non_null};
use super::vulkan::{dispatchable, kc_vulkan_cache};
use crate::backend::vulkan::{DeviceOwner, VulkanCache, VulkanDevice};
use crate::error::{DeviceId, Error, Result};

/// A `VkDevice` registered with a cache, from `kc_vulkan_cache_register_device` (or
/// `kc_vulkan_cache_register_owned_device`) until `kc_vulkan_cache_unregister_device`; the
/// handle itself lives until the cache is freed.
pub struct kc_vulkan_device {
    id: DeviceId,
    /// `None` once unregistered.
    inner: Option<VulkanDevice>,
}

impl kc_vulkan_device {
    pub(super) fn new(registered: VulkanDevice) -> Self {
        kc_vulkan_device {
            id: registered.id(),
            inner: Some(registered),
        }
    }

    /// The registration; `DeviceDestroyed` once the device is unregistered.
    pub(super) fn registered(&self) -> Result<&VulkanDevice> {
        self.inner.as_ref().ok_or(Error::DeviceDestroyed(self.id))
    }

    /// Whether the device was still registered when its cache was freed (which retired it):
    /// nothing is left of it but this handle, which its unregistration frees.
    pub(super) fn outlived_its_cache(&self) -> bool {
        self.inner.as_ref().is_some_and(VulkanDevice::is_retired)
    }
}

/// The handles of the devices unregistered while their cache lives, freed with the cache.
#[derive(Default)]
pub(super) struct UnregisteredDevices(Mutex<Vec<OwnedHandle>>);

/// A handle the list frees.
struct OwnedHandle(NonNull<kc_vulkan_device>);

// SAFETY: the handle's registration is gone; what is left (an id) may be freed on any thread.
unsafe impl Send for OwnedHandle {}

impl Drop for OwnedHandle {
    fn drop(&mut self) {
        // SAFETY: a box from `write_boxed`, which only this list frees since its device was
        // unregistered.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

impl UnregisteredDevices {
    /// Takes the registration out of `device` and keeps the handle until the cache is freed;
    /// `DeviceDestroyed` if it was unregistered before.
    ///
    /// # Safety
    /// `device` must be a live handle registered with this list's cache, which no other call
    /// uses meanwhile.
    pub(super) unsafe fn retire(&self, device: NonNull<kc_vulkan_device>) -> Result<VulkanDevice> {
        // SAFETY: live and used by no other call: the caller's contract.
        let handle = unsafe { &mut *device.as_ptr() };
        let registered = handle
            .inner
            .take()
            .ok_or(Error::DeviceDestroyed(handle.id))?;
        self.0.lock().push(OwnedHandle(device));
        Ok(registered)
    }
}

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
/// `destroy(device, user_data)` once the device is unregistered
/// (`kc_vulkan_cache_unregister_device`) and the last lease of its pipelines is released, after
/// destroying every object it made of it. The program must not destroy the device itself; it may unregister
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
                unsafe { write_boxed(out_device, kc_vulkan_device::new(registered)) };
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
