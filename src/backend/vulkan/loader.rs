//! The Vulkan loader's entry points, through ash: `libvulkan.so.1` opened at run time, another
//! loader by path, or a `vkGetInstanceProcAddr` the caller already has. ash opens the library
//! itself (it resolves the whole API lazily, through the loader), so only its errors take the
//! shape of [`RuntimeLibrary`](crate::backend::library::RuntimeLibrary)'s: a loader that cannot
//! be had is [`Error::Unavailable`], as for every backend's runtime.

use std::path::Path;

use ash::vk;

use crate::backend::library::cannot_load;
use crate::{Error, Result};

/// The Vulkan loader's entry points.
#[derive(Clone)]
pub struct Vulkan {
    pub(super) entry: ash::Entry,
}

impl Vulkan {
    /// Opens the system's Vulkan loader (`libvulkan.so.1`).
    pub fn load() -> Result<Self> {
        // SAFETY: opening the loader runs its library initialisers, which the loader supports
        // being opened at any time; the entry keeps the library loaded while it lives.
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| cannot_load("Vulkan loader", Path::new("libvulkan.so.1"), e))?;
        Ok(Self { entry })
    }

    /// Opens a Vulkan loader at `path` (a file name searched like `dlopen` does, or a path).
    pub fn load_from(path: impl AsRef<std::ffi::OsStr>) -> Result<Self> {
        let path = path.as_ref();
        // SAFETY: as for `load`; the caller names a Vulkan loader.
        let entry = unsafe { ash::Entry::load_from(path) }
            .map_err(|e| cannot_load("Vulkan loader", Path::new(path), e))?;
        Ok(Self { entry })
    }

    /// Uses the caller's `vkGetInstanceProcAddr`, for runtimes that bring their own loader.
    /// A function that does not resolve `vkCreateInstance` (a global command every loader
    /// provides) is not a loader: [`Error::Unavailable`], here rather than at the first
    /// registration.
    ///
    /// # Safety
    /// `get_instance_proc_addr` must behave as `vkGetInstanceProcAddr` and stay callable, with
    /// everything it returns, for as long as this value and every cache made from it live.
    pub unsafe fn from_get_instance_proc_addr(
        get_instance_proc_addr: vk::PFN_vkGetInstanceProcAddr,
    ) -> Result<Self> {
        let probe = c"vkCreateInstance";
        // SAFETY: global commands are queried with a null instance (Vulkan spec,
        // vkGetInstanceProcAddr); the function behaves as vkGetInstanceProcAddr by contract.
        if unsafe { get_instance_proc_addr(vk::Instance::null(), probe.as_ptr()) }.is_none() {
            return Err(Error::Unavailable(
                "the given vkGetInstanceProcAddr does not resolve vkCreateInstance: \
                 not a Vulkan loader"
                    .into(),
            ));
        }
        // SAFETY: forwarded from the caller's contract.
        let entry = unsafe {
            ash::Entry::from_static_fn(ash::StaticFn {
                get_instance_proc_addr,
            })
        };
        Ok(Self { entry })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "system" fn resolves_nothing(
        _instance: vk::Instance,
        _name: *const std::ffi::c_char,
    ) -> vk::PFN_vkVoidFunction {
        None
    }

    #[test]
    fn a_get_instance_proc_addr_that_resolves_nothing_is_refused_at_once() {
        // SAFETY: the function is callable for the whole test and answers every query.
        let result = unsafe { Vulkan::from_get_instance_proc_addr(resolves_nothing) };
        match result {
            Err(Error::Unavailable(message)) => assert!(message.contains("vkCreateInstance")),
            Err(e) => panic!("expected Unavailable, got {e:?}"),
            Ok(_) => panic!("expected Unavailable, got a loader"),
        }
    }
}
