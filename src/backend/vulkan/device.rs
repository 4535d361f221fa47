//! A caller's device as the cache registers it: its function table, identity and limits, and
//! the per-device state pipelines and pipeline-cache data hang off.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ash::vk;
use parking_lot::{Mutex, RwLock};

use super::header::CacheIdentity;
use super::loader::Vulkan;
use super::persistence::Stored;
use super::pipeline::Layout;
use crate::backend::registry::Registration;
use crate::disk::Descriptor;
use crate::key::Key;
use crate::{DeviceId, Error, Result};

/// Function table of one `VkDevice`, shared by everything that must outlive its registration.
pub(super) struct DeviceFns {
    pub(super) fns: ash::Device,
    pub(super) live_pipelines: AtomicU64,
    /// Dropped after the last object of the device is destroyed.
    _owner: Option<Arc<dyn DeviceOwner>>,
    /// Keeps the loader library (and so `fns`) loaded while leases outlive the cache.
    _loader: ash::Entry,
}

/// Something that owns a Vulkan device and destroys it when dropped. A device registered
/// through [`VulkanCache::register_owned_device`](super::VulkanCache::register_owned_device)
/// is kept alive by kcache until its last pipeline and layout are destroyed, so no lifetime
/// rule is left to the caller.
///
/// # Safety
/// The three handles must be live and related (`physical_device` enumerated from `instance`,
/// `device` created from `physical_device`), created through the [`Vulkan`] loader of the cache
/// they are registered with, and stay valid for as long as the value lives.
pub unsafe trait DeviceOwner: Send + Sync + 'static {
    fn instance(&self) -> vk::Instance;
    fn physical_device(&self) -> vk::PhysicalDevice;
    fn device(&self) -> vk::Device;
}

pub(super) struct Limits {
    pub(super) max_push_constants_size: u32,
    pub(super) max_bound_descriptor_sets: u32,
}

/// What the device says about requiring a subgroup size, asked the first time a pipeline
/// requires one: registration calls no Vulkan 1.1 function, which a program whose instance was
/// created for Vulkan 1.0 may not call.
pub(super) struct Subgroups {
    instance: ash::Instance,
    physical_device: vk::PhysicalDevice,
    api_version: u32,
    get_instance_proc_addr: vk::PFN_vkGetInstanceProcAddr,
    sizes: OnceLock<Option<(u32, u32)>>,
}

impl Subgroups {
    /// `[minSubgroupSize, maxSubgroupSize]` when the device can require a subgroup size for
    /// compute shaders; `None` when it cannot or does not say.
    ///
    /// # Safety
    /// The instance and physical device must still be alive: the device is registered.
    pub(super) unsafe fn compute_sizes(&self) -> Option<(u32, u32)> {
        // SAFETY: forwarded from the caller's contract.
        *self.sizes.get_or_init(|| unsafe { self.query() })
    }

    /// Subgroup size control (Vulkan 1.3, or `VK_EXT_subgroup_size_control` on 1.1 and 1.2)
    /// with the compute stage among `requiredSubgroupSizeStages`. Whether the device was
    /// created with the `subgroupSizeControl` feature is its creator's to ensure.
    ///
    /// # Safety
    /// As for [`Subgroups::compute_sizes`].
    unsafe fn query(&self) -> Option<(u32, u32)> {
        let (major, minor) = (
            vk::api_version_major(self.api_version),
            vk::api_version_minor(self.api_version),
        );
        if major == 1 && minor < 1 {
            return None;
        }
        let name = c"vkGetPhysicalDeviceProperties2";
        let get_instance_proc_addr = self.get_instance_proc_addr;
        // SAFETY: the instance is live and belongs to this loader (caller's contract).
        unsafe { get_instance_proc_addr(self.instance.handle(), name.as_ptr()) }?;
        let (instance, physical) = (&self.instance, self.physical_device);
        if major == 1 && minor < 3 {
            // SAFETY: `physical` belongs to `instance` (caller's contract).
            let listed = unsafe { instance.enumerate_device_extension_properties(physical) };
            let extension = vk::EXT_SUBGROUP_SIZE_CONTROL_NAME;
            if !listed
                .ok()?
                .iter()
                .any(|e| e.extension_name_as_c_str() == Ok(extension))
            {
                return None;
            }
        }
        let mut control = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut control);
        // SAFETY: the function exists (checked above) and the device supports the chained
        // struct (core or extension, checked above).
        unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
        control
            .required_subgroup_size_stages
            .contains(vk::ShaderStageFlags::COMPUTE)
            .then_some((control.min_subgroup_size, control.max_subgroup_size))
    }
}

/// What the cache keeps about a registered device.
pub(super) struct DeviceState {
    /// The [`VulkanCache`](super::VulkanCache) the device is registered with.
    pub(super) cache: u64,
    pub(super) fns: Arc<DeviceFns>,
    pub(super) identity: CacheIdentity,
    /// Where this device's pipeline-cache data lives on disk.
    pub(super) disk_key: Key,
    /// What that entry says it holds: the device's pipeline cache.
    pub(super) descriptor: Descriptor,
    pub(super) limits: Limits,
    pub(super) subgroups: Subgroups,
    /// Null once unregistered. Read-locked while a pipeline is created with it, so that
    /// teardown cannot destroy it under a build.
    pub(super) pipeline_cache: RwLock<vk::PipelineCache>,
    pub(super) layouts: Mutex<HashMap<[u8; 32], Arc<Layout>>>,
    /// Pipelines created (and remote data loaded) since the data was last written.
    pub(super) unsaved: AtomicU64,
    /// Time spent in `vkCreateComputePipelines` on this device: what the stored data saves a
    /// later process at best, recorded with it for the disk tier's eviction.
    pub(super) build_nanos: AtomicU64,
    /// Digests of the blobs last read from or written to disk and the remote tier;
    /// serialises write-backs.
    pub(super) stored: Mutex<Stored>,
}

/// A device registered with a [`VulkanCache`](super::VulkanCache). Cloning it is cheap.
#[derive(Clone)]
pub struct VulkanDevice(pub(super) Arc<Registration<u64, DeviceState>>);

impl VulkanDevice {
    /// The id under which the memory tier records this device's pipelines.
    pub fn id(&self) -> DeviceId {
        self.0.id()
    }

    pub fn identity(&self) -> &CacheIdentity {
        &self.0.info().identity
    }

    /// Whether the device was unregistered (or its cache dropped).
    pub fn is_retired(&self) -> bool {
        self.0.is_evicted()
    }

    /// The disk key of this device's pipeline-cache data.
    pub fn pipeline_cache_key(&self) -> Key {
        self.0.info().disk_key
    }

    /// Pipelines of this device not yet destroyed (cached or still leased).
    pub fn live_pipelines(&self) -> u64 {
        self.0.info().fns.live_pipelines.load(Ordering::Relaxed)
    }

    pub(super) fn state(&self) -> &DeviceState {
        self.0.info()
    }
}

/// The device functions kcache calls.
const DEVICE_FUNCTIONS: [&CStr; 12] = [
    c"vkCreateShaderModule",
    c"vkDestroyShaderModule",
    c"vkCreateComputePipelines",
    c"vkDestroyPipeline",
    c"vkCreateDescriptorSetLayout",
    c"vkDestroyDescriptorSetLayout",
    c"vkCreatePipelineLayout",
    c"vkDestroyPipelineLayout",
    c"vkCreatePipelineCache",
    c"vkDestroyPipelineCache",
    c"vkGetPipelineCacheData",
    c"vkMergePipelineCaches",
];

fn missing_function(name: &CStr) -> Error {
    Error::Unavailable(format!(
        "the Vulkan loader does not provide {}",
        name.to_string_lossy()
    ))
}

/// What [`open`] learns of a device.
pub(super) struct Opened {
    pub(super) fns: Arc<DeviceFns>,
    pub(super) props: vk::PhysicalDeviceProperties,
    pub(super) subgroups: Subgroups,
}

/// Loads the device's function table and reads its properties, after checking that the
/// loader provides every function kcache calls.
///
/// # Safety
/// The handles must be non-null, live and related (`physical_device` from `instance`, `device`
/// from `physical_device`) and created through `vulkan`.
pub(super) unsafe fn open(
    vulkan: &Vulkan,
    instance: vk::Instance,
    physical_device: vk::PhysicalDevice,
    device: vk::Device,
    owner: Option<Arc<dyn DeviceOwner>>,
) -> Result<Opened> {
    let get_instance_proc_addr = vulkan.entry.static_fn().get_instance_proc_addr;
    for name in [c"vkGetPhysicalDeviceProperties", c"vkGetDeviceProcAddr"] {
        // SAFETY: `instance` is live and belongs to this loader (caller's contract).
        if unsafe { get_instance_proc_addr(instance, name.as_ptr()) }.is_none() {
            return Err(missing_function(name));
        }
    }
    // SAFETY: the caller guarantees `instance` is live and belongs to this loader.
    let instance_fns = unsafe { ash::Instance::load(vulkan.entry.static_fn(), instance) };
    // ash turns a function the loader lacks into a stub that panics when called: make sure
    // every device function kcache calls exists, so that a partial loader is reported.
    let get_device_proc_addr = instance_fns.fp_v1_0().get_device_proc_addr;
    for name in DEVICE_FUNCTIONS {
        // SAFETY: `device` is live and belongs to `instance` (caller's contract).
        if unsafe { get_device_proc_addr(device, name.as_ptr()) }.is_none() {
            return Err(missing_function(name));
        }
    }
    // SAFETY: `physical_device` belongs to `instance` (caller's contract).
    let props = unsafe { instance_fns.get_physical_device_properties(physical_device) };
    // SAFETY: `device` was created from `physical_device` of `instance` (caller's contract).
    let fns = unsafe { ash::Device::load(instance_fns.fp_v1_0(), device) };
    let fns = Arc::new(DeviceFns {
        fns,
        live_pipelines: AtomicU64::new(0),
        _owner: owner,
        _loader: vulkan.entry.clone(),
    });
    let subgroups = Subgroups {
        instance: instance_fns,
        physical_device,
        api_version: props.api_version,
        get_instance_proc_addr,
        sizes: OnceLock::new(),
    };
    Ok(Opened {
        fns,
        props,
        subgroups,
    })
}

/// What the pipeline-cache header names of a device.
pub(super) fn identity(props: &vk::PhysicalDeviceProperties) -> CacheIdentity {
    CacheIdentity {
        vendor_id: props.vendor_id,
        device_id: props.device_id,
        driver_version: props.driver_version,
        pipeline_cache_uuid: props.pipeline_cache_uuid,
    }
}

/// Refuses null handles before any of them reaches the loader.
pub(super) fn check_handles(
    instance: vk::Instance,
    physical_device: vk::PhysicalDevice,
    device: vk::Device,
) -> Result<()> {
    if instance == vk::Instance::null()
        || physical_device == vk::PhysicalDevice::null()
        || device == vk::Device::null()
    {
        return Err(Error::InvalidArgument("null Vulkan handle".into()));
    }
    Ok(())
}
