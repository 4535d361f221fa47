//! Vulkan: cached compute `VkPipeline`s, with the device's `VkPipelineCache` data on disk.
//!
//! - **Runtime.** [`Vulkan::load`] opens `libvulkan.so.1` at run time (no link dependency; a
//!   machine without a loader gets [`Error::Unavailable`]), or
//!   [`Vulkan::from_get_instance_proc_addr`] uses a loader the caller already has.
//! - **Devices.** The caller keeps owning its `VkInstance`, `VkPhysicalDevice` and `VkDevice`
//!   and registers the device with [`VulkanCache::register_device`]. kcache creates one
//!   `VkPipelineCache` per registered device, seeded from the disk tier, and
//!   [`VulkanCache::unregister_device`] (device teardown) writes it back, destroys it and
//!   evicts every pipeline of that device.
//! - **Pipelines.** [`VulkanCache::pipeline`] returns a lease on a compute pipeline built from
//!   a [`PipelineSpec`]: SPIR-V, entry point, specialization constants and a layout
//!   *described by content* ([`LayoutDesc`]). kcache creates the descriptor-set layouts and the
//!   pipeline layout itself (once per device and description) so that no key depends on a
//!   handle value and a key can never name a pipeline built against a different layout than the
//!   one it is used with. The memory key is the content digest plus the `VkDevice` (and the
//!   registration, since a handle value may be reused after `vkDestroyDevice`).
//! - **Disk.** The tier stores the device's pipeline-cache data under (vendorID, deviceID,
//!   driverVersion, pipelineCacheUUID). The blob's header is checked against the live device
//!   before the driver sees it; a mismatch is a counted miss and the pipeline cache starts
//!   empty. Data is written back by [`VulkanCache::flush`], by `unregister_device`, and when the
//!   `VulkanCache` is dropped — each time only if pipelines were created since the last write,
//!   after merging what another process stored in the meantime.

mod header;
mod reflect;
mod spec;
mod spirv;

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ash::vk::{self, Handle};
use parking_lot::{Mutex, RwLock};

pub use header::{CacheIdentity, HEADER_LEN, HeaderMismatch, check as check_cache_header};
pub use spec::{DescriptorBinding, LayoutDesc, PipelineSpec, PushConstantRange, SpecConstant};
pub use spirv::words_from_bytes;

use crate::disk::{DiskCache, DiskStats};
use crate::key::{Key, KeyBuilder};
use crate::memory::{Lease, MemoryCache, Options};
use crate::{BuildError, DeviceId, Error, Result};

/// The Vulkan loader's entry points.
pub struct Vulkan {
    entry: ash::Entry,
}

impl Vulkan {
    /// Opens the system's Vulkan loader (`libvulkan.so.1`).
    pub fn load() -> Result<Self> {
        // SAFETY: opening the loader runs its library initialisers, which the loader supports
        // being opened at any time; the entry keeps the library loaded while it lives.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| {
            Error::Unavailable(format!(
                "cannot load the Vulkan loader (libvulkan.so.1): {e}"
            ))
        })?;
        Ok(Self { entry })
    }

    /// Opens a Vulkan loader at `path` (a file name searched like `dlopen` does, or a path).
    pub fn load_from(path: impl AsRef<std::ffi::OsStr>) -> Result<Self> {
        let path = path.as_ref();
        // SAFETY: as for `load`; the caller names a Vulkan loader.
        let entry = unsafe { ash::Entry::load_from(path) }.map_err(|e| {
            Error::Unavailable(format!(
                "cannot load the Vulkan loader {}: {e}",
                path.to_string_lossy()
            ))
        })?;
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

/// Memory key of a pipeline. Built on each lookup from a [`PipelineSpec`]'s stored digest, so a
/// hit hashes 48 bytes, whatever the size of the SPIR-V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    registration: DeviceId,
    device: u64,
    digest: [u8; 32],
}

/// A lease on a cached pipeline; the pipeline lives at least as long as the lease.
pub type PipelineLease = Lease<PipelineKey, Pipeline>;

#[derive(Default)]
struct Counters {
    pipelines_created: AtomicU64,
    pipelines_destroyed: AtomicU64,
    layouts_created: AtomicU64,
    data_loaded: AtomicU64,
    data_missing: AtomicU64,
    data_rejected: AtomicU64,
    data_written: AtomicU64,
    data_merged: AtomicU64,
    disk_errors: AtomicU64,
}

/// What kcache did with Vulkan objects and pipeline-cache data, next to the memory tier's
/// own statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VulkanStats {
    pub memory: crate::memory::Stats,
    /// Successful `vkCreateComputePipelines` calls.
    pub pipelines_created: u64,
    /// `vkDestroyPipeline` calls (each with its `vkDestroyShaderModule`).
    pub pipelines_destroyed: u64,
    /// Pipeline layouts created (one per device and layout description).
    pub layouts_created: u64,
    /// Pipeline-cache blobs read from disk, validated and handed to the driver.
    pub cache_data_loaded: u64,
    /// Device registrations that found no pipeline-cache data on disk.
    pub cache_data_missing: u64,
    /// Blobs refused before reaching the driver (header names another device, driver or
    /// format), plus blobs the driver itself refused. Each is a miss.
    pub cache_data_rejected: u64,
    /// Pipeline-cache blobs written to disk.
    pub cache_data_written: u64,
    /// Blobs another cache stored since this one last read or wrote, merged in before a write.
    pub cache_data_merged: u64,
    /// Disk reads or writes that failed. A failed read at registration starts the device's
    /// pipeline cache empty; a failed write is returned by the call that flushed.
    pub disk_errors: u64,
    /// The disk tier's own counters (integrity rejects, puts, evictions, I/O errors, …),
    /// all zero without a disk tier. A disk tier shared with other caches counts for all.
    pub disk: DiskStats,
}

/// Function table of one `VkDevice`, shared by everything that must outlive its registration.
struct DeviceFns {
    fns: ash::Device,
    live_pipelines: AtomicU64,
    /// Dropped after the last object of the device is destroyed.
    _owner: Option<Arc<dyn DeviceOwner>>,
    /// Keeps the loader library (and so `fns`) loaded while leases outlive the cache.
    _loader: ash::Entry,
}

/// Something that owns a Vulkan device and destroys it when dropped. A device registered
/// through [`VulkanCache::register_owned_device`] is kept alive by kcache until its last
/// pipeline and layout are destroyed, so no lifetime rule is left to the caller.
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

/// Descriptor-set layouts and pipeline layout made from one [`LayoutDesc`] on one device.
struct Layout {
    device: Arc<DeviceFns>,
    set_layouts: Vec<vk::DescriptorSetLayout>,
    pipeline_layout: vk::PipelineLayout,
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: the last pipeline referring to these layouts has been destroyed (each holds an
        // `Arc` of this) and the device's registry entry is gone, so nothing uses them.
        unsafe {
            let d = &self.device.fns;
            d.destroy_pipeline_layout(self.pipeline_layout, None);
            for &set in &self.set_layouts {
                d.destroy_descriptor_set_layout(set, None);
            }
        }
    }
}

/// A compute pipeline, its shader module and its layout. Destroyed exactly once, when it
/// leaves the cache and its last lease is released.
pub struct Pipeline {
    pipeline: vk::Pipeline,
    module: vk::ShaderModule,
    layout: Arc<Layout>,
    device: Arc<DeviceFns>,
    counters: Arc<Counters>,
}

impl Pipeline {
    pub fn pipeline(&self) -> vk::Pipeline {
        self.pipeline
    }

    pub fn shader_module(&self) -> vk::ShaderModule {
        self.module
    }

    /// The pipeline layout kcache created from the [`LayoutDesc`].
    pub fn layout(&self) -> vk::PipelineLayout {
        self.layout.pipeline_layout
    }

    /// `set_layouts()[n]` is the layout of descriptor set `n`.
    pub fn set_layouts(&self) -> &[vk::DescriptorSetLayout] {
        &self.layout.set_layouts
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("pipeline", &self.pipeline)
            .field("module", &self.module)
            .finish_non_exhaustive()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: the memory tier drops a value once, after its last lease is gone; the caller
        // must not still be executing it (the lease contract) and the device is still alive
        // (callers release leases before `vkDestroyDevice`).
        unsafe {
            let d = &self.device.fns;
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_shader_module(self.module, None);
        }
        self.device.live_pipelines.fetch_sub(1, Ordering::Relaxed);
        self.counters
            .pipelines_destroyed
            .fetch_add(1, Ordering::Relaxed);
    }
}

struct Limits {
    max_push_constants_size: u32,
    max_bound_descriptor_sets: u32,
}

struct DeviceState {
    registration: DeviceId,
    cache: u64,
    raw: vk::Device,
    fns: Arc<DeviceFns>,
    identity: CacheIdentity,
    /// Where this device's pipeline-cache data lives on disk.
    disk_key: Key,
    limits: Limits,
    /// Null once unregistered. Read-locked while a pipeline is created with it, so that
    /// teardown cannot destroy it under a build.
    pipeline_cache: RwLock<vk::PipelineCache>,
    retired: AtomicBool,
    layouts: Mutex<HashMap<[u8; 32], Arc<Layout>>>,
    /// Pipelines created since the data was last written.
    unsaved: AtomicU64,
    /// Time spent in `vkCreateComputePipelines` on this device: what the stored data saves a
    /// later process at best, recorded with it for the disk tier's eviction.
    build_nanos: AtomicU64,
    /// Digest of the blob last read from or written to disk; serialises write-backs.
    stored: Mutex<Option<[u8; 32]>>,
}

/// A device registered with a [`VulkanCache`]. Cloning it is cheap.
#[derive(Clone)]
pub struct VulkanDevice(Arc<DeviceState>);

impl VulkanDevice {
    /// The id under which the memory tier records this device's pipelines.
    pub fn id(&self) -> DeviceId {
        self.0.registration
    }

    pub fn identity(&self) -> &CacheIdentity {
        &self.0.identity
    }

    /// Whether the device was unregistered (or its cache dropped).
    pub fn is_retired(&self) -> bool {
        self.0.retired.load(Ordering::Acquire)
    }

    /// The disk key of this device's pipeline-cache data.
    pub fn pipeline_cache_key(&self) -> Key {
        self.0.disk_key
    }

    /// Pipelines of this device not yet destroyed (cached or still leased).
    pub fn live_pipelines(&self) -> u64 {
        self.0.fns.live_pipelines.load(Ordering::Relaxed)
    }
}

/// How a [`VulkanCache`] is set up.
#[derive(Clone, Default)]
pub struct VulkanOptions {
    /// Caps and hooks of the memory tier.
    pub memory: Options,
    /// Where pipeline-cache data persists; `None` keeps everything in memory. Its operator
    /// key and key requirement are those of the [`DiskConfig`](crate::disk::DiskConfig) it
    /// was opened with.
    pub disk: Option<Arc<DiskCache>>,
}

static NEXT_CACHE: AtomicU64 = AtomicU64::new(1);

/// A cache of compute pipelines for any number of registered devices. Share it behind an `Arc`.
pub struct VulkanCache {
    vulkan: Vulkan,
    id: u64,
    pipelines: MemoryCache<PipelineKey, Pipeline>,
    disk: Option<Arc<DiskCache>>,
    devices: Mutex<HashMap<u64, Arc<DeviceState>>>,
    next_registration: AtomicI64,
    counters: Arc<Counters>,
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

fn build_error(what: &str, r: vk::Result) -> BuildError {
    BuildError::new(r.as_raw(), format!("{what} failed: {r}"))
}

fn backend_error(what: &str, r: vk::Result) -> Error {
    Error::Backend(format!("{what} failed: {r}"))
}

fn digest(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// Creates the descriptor-set layouts of `desc`, then the pipeline layout over them. Each set
/// layout is pushed onto `set_layouts` as soon as it exists, so that the caller destroys what
/// was made whatever the outcome. `error` turns the failing call's name and result into `E`.
///
/// # Safety
/// `d` must be the function table of a live device.
unsafe fn create_layouts<E>(
    d: &ash::Device,
    desc: &LayoutDesc,
    set_layouts: &mut Vec<vk::DescriptorSetLayout>,
    error: impl Fn(&'static str, vk::Result) -> E,
) -> Result<vk::PipelineLayout, E> {
    for set in &desc.sets {
        let bindings: Vec<vk::DescriptorSetLayoutBinding> = set
            .iter()
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b.binding)
                    .descriptor_type(b.descriptor_type)
                    .descriptor_count(b.count)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: live device (caller's contract); the create info outlives the call.
        let set_layout = unsafe { d.create_descriptor_set_layout(&info, None) }
            .map_err(|r| error("vkCreateDescriptorSetLayout", r))?;
        set_layouts.push(set_layout);
    }
    let ranges: Vec<vk::PushConstantRange> = desc
        .push_constants
        .iter()
        .map(|pc| vk::PushConstantRange {
            stage_flags: vk::ShaderStageFlags::COMPUTE,
            offset: pc.offset,
            size: pc.size,
        })
        .collect();
    let info = vk::PipelineLayoutCreateInfo::default()
        .set_layouts(set_layouts)
        .push_constant_ranges(&ranges);
    // SAFETY: live device; the set layouts were just created from it.
    unsafe { d.create_pipeline_layout(&info, None) }.map_err(|r| error("vkCreatePipelineLayout", r))
}

/// One `vkCreateComputePipelines` for `spec`'s entry point and specialization constants.
///
/// # Safety
/// `d` must be the function table of a live device; `module`, `layout` and `cache` (or a null
/// `cache`) must belong to it and stay alive across the call.
unsafe fn create_pipeline(
    d: &ash::Device,
    cache: vk::PipelineCache,
    spec: &PipelineSpec,
    module: vk::ShaderModule,
    layout: vk::PipelineLayout,
) -> Result<vk::Pipeline, vk::Result> {
    let mut data = Vec::new();
    let entries: Vec<vk::SpecializationMapEntry> = spec
        .specialization
        .iter()
        .map(|c| {
            let entry = vk::SpecializationMapEntry {
                constant_id: c.id,
                offset: data.len() as u32,
                size: c.value.len(),
            };
            data.extend_from_slice(&c.value);
            entry
        })
        .collect();
    let specialization = vk::SpecializationInfo::default()
        .map_entries(&entries)
        .data(&data);
    let mut stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(&spec.entry_point);
    if !entries.is_empty() {
        stage = stage.specialization_info(&specialization);
    }
    let info = vk::ComputePipelineCreateInfo::default()
        .stage(stage)
        .layout(layout);
    // SAFETY: forwarded from the caller's contract; the create info outlives the call.
    unsafe { d.create_compute_pipelines(cache, &[info], None) }
        .map(|pipelines| pipelines[0])
        .map_err(|(_, r)| r)
}

impl VulkanCache {
    pub fn new(vulkan: Vulkan, options: VulkanOptions) -> Self {
        Self {
            vulkan,
            id: NEXT_CACHE.fetch_add(1, Ordering::Relaxed),
            // Dropping a pipeline destroys it, so the destroy step is the drop itself.
            pipelines: MemoryCache::new(options.memory, |pipeline| {
                drop(pipeline);
                Ok(())
            }),
            disk: options.disk,
            devices: Mutex::new(HashMap::new()),
            next_registration: AtomicI64::new(0),
            counters: Arc::default(),
        }
    }

    /// Registers the caller's device: reads its identity, loads its function table, and
    /// creates its `VkPipelineCache`, seeded from disk when a blob with a matching header is
    /// stored. The caller keeps ownership of all three handles.
    ///
    /// # Safety
    /// The handles must be live and related (`physical_device` from `instance`, `device` from
    /// `physical_device`), created through this cache's loader, and stay alive until
    /// [`VulkanCache::unregister_device`] returns (or the cache is dropped) and every lease
    /// on this device's pipelines is released.
    pub unsafe fn register_device(
        &self,
        instance: vk::Instance,
        physical_device: vk::PhysicalDevice,
        device: vk::Device,
    ) -> Result<VulkanDevice> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.register(instance, physical_device, device, None) }
    }

    /// Registers a device that kcache keeps alive (through `owner`) until the device is
    /// unregistered and its last pipeline destroyed.
    pub fn register_owned_device(&self, owner: Arc<dyn DeviceOwner>) -> Result<VulkanDevice> {
        let (instance, physical, device) =
            (owner.instance(), owner.physical_device(), owner.device());
        // SAFETY: `DeviceOwner`'s contract keeps the handles valid while `owner` lives, and
        // the registration holds `owner` until the last object of the device is gone.
        unsafe { self.register(instance, physical, device, Some(owner)) }
    }

    /// # Safety
    /// As for [`VulkanCache::register_device`].
    unsafe fn register(
        &self,
        instance: vk::Instance,
        physical_device: vk::PhysicalDevice,
        device: vk::Device,
        owner: Option<Arc<dyn DeviceOwner>>,
    ) -> Result<VulkanDevice> {
        if instance == vk::Instance::null()
            || physical_device == vk::PhysicalDevice::null()
            || device == vk::Device::null()
        {
            return Err(Error::InvalidArgument("null Vulkan handle".into()));
        }
        let mut devices = self.devices.lock();
        if devices.contains_key(&device.as_raw()) {
            return Err(Error::InvalidArgument(
                "this VkDevice is already registered".into(),
            ));
        }
        let get_instance_proc_addr = self.vulkan.entry.static_fn().get_instance_proc_addr;
        for name in [c"vkGetPhysicalDeviceProperties", c"vkGetDeviceProcAddr"] {
            // SAFETY: `instance` is live and belongs to this loader (caller's contract).
            if unsafe { get_instance_proc_addr(instance, name.as_ptr()) }.is_none() {
                return Err(missing_function(name));
            }
        }
        // SAFETY: the caller guarantees `instance` is live and belongs to this loader.
        let instance_fns = unsafe { ash::Instance::load(self.vulkan.entry.static_fn(), instance) };
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
        let identity = CacheIdentity {
            vendor_id: props.vendor_id,
            device_id: props.device_id,
            driver_version: props.driver_version,
            pipeline_cache_uuid: props.pipeline_cache_uuid,
        };
        let disk_key = pipeline_cache_key(&identity, &props)?;
        let fns = Arc::new(DeviceFns {
            fns,
            live_pipelines: AtomicU64::new(0),
            _owner: owner,
            _loader: self.vulkan.entry.clone(),
        });
        let (pipeline_cache, stored) =
            self.create_pipeline_cache(&fns.fns, &identity, &disk_key)?;
        let state = Arc::new(DeviceState {
            registration: self.next_registration.fetch_add(1, Ordering::Relaxed),
            cache: self.id,
            raw: device,
            fns,
            identity,
            disk_key,
            limits: Limits {
                max_push_constants_size: props.limits.max_push_constants_size,
                max_bound_descriptor_sets: props.limits.max_bound_descriptor_sets,
            },
            pipeline_cache: RwLock::new(pipeline_cache),
            retired: AtomicBool::new(false),
            layouts: Mutex::new(HashMap::new()),
            unsaved: AtomicU64::new(0),
            build_nanos: AtomicU64::new(0),
            stored: Mutex::new(stored),
        });
        devices.insert(device.as_raw(), state.clone());
        Ok(VulkanDevice(state))
    }

    /// Creates the device's pipeline cache, from disk data when its header names this device.
    fn create_pipeline_cache(
        &self,
        fns: &ash::Device,
        identity: &CacheIdentity,
        key: &Key,
    ) -> Result<(vk::PipelineCache, Option<[u8; 32]>)> {
        let blob = match &self.disk {
            // A disk that cannot be read costs the warm start, not the device.
            Some(disk) => match disk.get(key) {
                Ok(entry) => entry.map(crate::disk::Entry::into_payload),
                Err(_) => {
                    self.counters.disk_errors.fetch_add(1, Ordering::Relaxed);
                    None
                }
            },
            None => None,
        };
        // Remembered even for a rejected blob, so that a write-back neither merges it nor
        // counts it a second time, and replaces it.
        let stored = blob.as_deref().map(digest);
        let initial: &[u8] = match &blob {
            None => {
                if self.disk.is_some() {
                    self.counters.data_missing.fetch_add(1, Ordering::Relaxed);
                }
                &[]
            }
            Some(data) if header::check(data, identity).is_ok() => data,
            Some(_) => {
                self.counters.data_rejected.fetch_add(1, Ordering::Relaxed);
                &[]
            }
        };
        let info = vk::PipelineCacheCreateInfo::default().initial_data(initial);
        // SAFETY: `fns` is the live device's table; `initial` is empty or carries a header
        // that names this very device, driver build and cache format.
        match unsafe { fns.create_pipeline_cache(&info, None) } {
            Ok(cache) => {
                if !initial.is_empty() {
                    self.counters.data_loaded.fetch_add(1, Ordering::Relaxed);
                }
                Ok((cache, stored))
            }
            Err(_) if !initial.is_empty() => {
                // The driver refused data whose header matched: a miss like any other.
                self.counters.data_rejected.fetch_add(1, Ordering::Relaxed);
                let empty = vk::PipelineCacheCreateInfo::default();
                // SAFETY: as above, with no initial data.
                let cache = unsafe { fns.create_pipeline_cache(&empty, None) }
                    .map_err(|r| backend_error("vkCreatePipelineCache", r))?;
                Ok((cache, stored))
            }
            Err(r) => Err(backend_error("vkCreatePipelineCache", r)),
        }
    }

    fn check_device(&self, device: &VulkanDevice) -> Result<()> {
        if device.0.cache != self.id {
            return Err(Error::InvalidArgument(
                "device is registered with another VulkanCache".into(),
            ));
        }
        if device.0.retired.load(Ordering::Acquire) {
            return Err(Error::DeviceDestroyed(device.0.registration));
        }
        Ok(())
    }

    /// Returns a lease on the compute pipeline for `spec` on `device`, creating it on a miss
    /// (one `vkCreateComputePipelines` per key however many threads miss at once).
    pub fn pipeline(&self, device: &VulkanDevice, spec: &PipelineSpec) -> Result<PipelineLease> {
        self.check_device(device)?;
        let state = &device.0;
        let layout = spec.layout();
        if layout.sets.len() as u64 > u64::from(state.limits.max_bound_descriptor_sets) {
            return Err(Error::InvalidArgument(format!(
                "{} descriptor sets exceed the device's maxBoundDescriptorSets ({})",
                layout.sets.len(),
                state.limits.max_bound_descriptor_sets
            )));
        }
        let push_end = layout.push_constants.map_or(0, |pc| pc.offset + pc.size);
        if push_end > state.limits.max_push_constants_size {
            return Err(Error::InvalidArgument(format!(
                "push constants end at byte {push_end} beyond the device's \
                 maxPushConstantsSize ({})",
                state.limits.max_push_constants_size
            )));
        }
        let key = PipelineKey {
            registration: state.registration,
            device: state.raw.as_raw(),
            digest: *spec.digest(),
        };
        self.pipelines
            .find_or_build(&key, Some(state.registration), || {
                // Checked again once the build is registered: a teardown that ran since the
                // check above has bumped the device's epoch before this flight began, so
                // only this check keeps the pipeline from being installed for a dead device.
                if state.retired.load(Ordering::Acquire) {
                    return Err(BuildError::new(0, "the device was unregistered"));
                }
                self.build(state, spec)
            })
            .map_err(|e| match e {
                Error::Build(_) if state.retired.load(Ordering::Acquire) => {
                    Error::DeviceDestroyed(state.registration)
                }
                e => e,
            })
    }

    fn layout_for(
        &self,
        state: &DeviceState,
        spec: &PipelineSpec,
    ) -> Result<Arc<Layout>, BuildError> {
        let mut layouts = state.layouts.lock();
        if let Some(layout) = layouts.get(&spec.layout_digest) {
            return Ok(layout.clone());
        }
        let d = &state.fns.fns;
        let desc = spec.layout();
        let mut layout = Layout {
            device: state.fns.clone(),
            set_layouts: Vec::with_capacity(desc.sets.len()),
            pipeline_layout: vk::PipelineLayout::null(),
        };
        // SAFETY: live device; the bindings were validated by `PipelineSpec::new`. On failure,
        // `layout`'s drop destroys the set layouts created so far.
        layout.pipeline_layout =
            unsafe { create_layouts(d, desc, &mut layout.set_layouts, build_error) }?;
        self.counters
            .layouts_created
            .fetch_add(1, Ordering::Relaxed);
        let layout = Arc::new(layout);
        layouts.insert(spec.layout_digest, layout.clone());
        Ok(layout)
    }

    fn build(
        &self,
        state: &DeviceState,
        spec: &PipelineSpec,
    ) -> Result<(Pipeline, u64), BuildError> {
        let layout = self.layout_for(state, spec)?;
        let d = &state.fns.fns;
        let module_info = vk::ShaderModuleCreateInfo::default().code(&spec.spirv);
        // SAFETY: live device; the code passed the header, bounds and entry-point checks.
        let module = unsafe { d.create_shader_module(&module_info, None) }
            .map_err(|r| build_error("vkCreateShaderModule", r))?;
        let started = Instant::now();
        let created = {
            let cache = state.pipeline_cache.read();
            // SAFETY: live device; module, layout and (possibly null) pipeline cache belong to
            // it, and the read lock keeps the pipeline cache alive across the call.
            unsafe { create_pipeline(d, *cache, spec, module, layout.pipeline_layout) }
        };
        let pipeline = match created {
            Ok(p) => p,
            Err(r) => {
                // SAFETY: the module was created above and nothing else refers to it.
                unsafe { d.destroy_shader_module(module, None) };
                return Err(build_error("vkCreateComputePipelines", r));
            }
        };
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        state.build_nanos.fetch_add(nanos, Ordering::Relaxed);
        state.fns.live_pipelines.fetch_add(1, Ordering::Relaxed);
        state.unsaved.fetch_add(1, Ordering::Relaxed);
        self.counters
            .pipelines_created
            .fetch_add(1, Ordering::Relaxed);
        let weight = std::mem::size_of_val(spec.spirv.as_slice()) as u64;
        Ok((
            Pipeline {
                pipeline,
                module,
                layout,
                device: state.fns.clone(),
                counters: self.counters.clone(),
            },
            weight,
        ))
    }

    /// Writes the device's pipeline-cache data to disk if pipelines were created since the
    /// last write, merging in what another process stored meanwhile. Returns whether it wrote.
    pub fn flush(&self, device: &VulkanDevice) -> Result<bool> {
        self.check_device(device)?;
        self.write_back(&device.0)
    }

    fn write_back(&self, state: &DeviceState) -> Result<bool> {
        let Some(disk) = &self.disk else {
            return Ok(false);
        };
        let mut stored = state.stored.lock();
        let cache = state.pipeline_cache.read();
        if *cache == vk::PipelineCache::null() {
            return Ok(false);
        }
        let pending = state.unsaved.swap(0, Ordering::AcqRel);
        if pending == 0 {
            return Ok(false);
        }
        let result = self.write_data(disk, state, *cache, &mut stored);
        if result.is_err() {
            // Keep the data marked unsaved so that the next flush retries.
            state.unsaved.fetch_add(pending, Ordering::AcqRel);
        }
        result
    }

    fn write_data(
        &self,
        disk: &DiskCache,
        state: &DeviceState,
        cache: vk::PipelineCache,
        stored: &mut Option<[u8; 32]>,
    ) -> Result<bool> {
        let d = &state.fns.fns;
        let theirs = disk.get(&state.disk_key).inspect_err(|_| {
            self.counters.disk_errors.fetch_add(1, Ordering::Relaxed);
        })?;
        let theirs = theirs.as_ref().map(|e| e.payload());
        if let Some(theirs) = theirs.filter(|t| Some(digest(t)) != *stored) {
            if header::check(theirs, &state.identity).is_ok() {
                self.merge(d, cache, theirs)?;
                // If merging added nothing of ours, the stored blob already says it all.
                *stored = Some(digest(theirs));
            } else {
                self.counters.data_rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
        // SAFETY: live device and pipeline cache (read-locked, so not destroyed meanwhile).
        let data = unsafe { d.get_pipeline_cache_data(cache) }
            .map_err(|r| backend_error("vkGetPipelineCacheData", r))?;
        if let Err(m) = header::check(&data, &state.identity) {
            return Err(Error::Backend(format!(
                "the driver's own pipeline-cache data fails the header check: {m}"
            )));
        }
        let written = digest(&data);
        if Some(written) == *stored {
            return Ok(false);
        }
        let build_time = Duration::from_nanos(state.build_nanos.load(Ordering::Relaxed));
        disk.put(&state.disk_key, &data, build_time)
            .inspect_err(|_| {
                self.counters.disk_errors.fetch_add(1, Ordering::Relaxed);
            })?;
        *stored = Some(written);
        self.counters.data_written.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    fn merge(&self, d: &ash::Device, into: vk::PipelineCache, data: &[u8]) -> Result<()> {
        let info = vk::PipelineCacheCreateInfo::default().initial_data(data);
        // SAFETY: live device; `data`'s header names this device (checked by the caller).
        let Ok(theirs) = (unsafe { d.create_pipeline_cache(&info, None) }) else {
            self.counters.data_rejected.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        // SAFETY: both caches belong to the live device; `theirs` is used by nobody else.
        let merged = unsafe { d.merge_pipeline_caches(into, &[theirs]) };
        // SAFETY: `theirs` was created above and is no longer needed.
        unsafe { d.destroy_pipeline_cache(theirs, None) };
        merged.map_err(|r| backend_error("vkMergePipelineCaches", r))?;
        self.counters.data_merged.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Device teardown: writes its pipeline-cache data back, destroys the pipeline cache and
    /// the layouts no pipeline uses, and evicts every pipeline of the device (each destroyed
    /// now, or when its last lease is released). Returns how many pipelines are still alive
    /// because a lease holds them; they must be released before `vkDestroyDevice`.
    pub fn unregister_device(&self, device: &VulkanDevice) -> Result<u64> {
        if device.0.cache != self.id {
            return Err(Error::InvalidArgument(
                "device is registered with another VulkanCache".into(),
            ));
        }
        let state = &device.0;
        if state.retired.swap(true, Ordering::AcqRel) {
            return Err(Error::DeviceDestroyed(state.registration));
        }
        self.devices.lock().remove(&state.raw.as_raw());
        let flushed = self.retire(state);
        let evicted = self.pipelines.evict_device(state.registration);
        flushed?;
        evicted?;
        Ok(device.live_pipelines())
    }

    /// Writes back and destroys the device's pipeline cache and drops its layout table.
    fn retire(&self, state: &DeviceState) -> Result<()> {
        let flushed = self.write_back(state);
        let mut cache = state.pipeline_cache.write();
        // SAFETY: the write lock excludes every build using the cache; null after this.
        unsafe { state.fns.fns.destroy_pipeline_cache(*cache, None) };
        *cache = vk::PipelineCache::null();
        state.layouts.lock().clear();
        flushed.map(|_| ())
    }

    /// Pipelines in the memory tier, all devices together.
    pub fn len(&self) -> usize {
        self.pipelines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pipelines.is_empty()
    }

    pub fn stats(&self) -> VulkanStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VulkanStats {
            memory: self.pipelines.stats(),
            pipelines_created: get(&c.pipelines_created),
            pipelines_destroyed: get(&c.pipelines_destroyed),
            layouts_created: get(&c.layouts_created),
            cache_data_loaded: get(&c.data_loaded),
            cache_data_missing: get(&c.data_missing),
            cache_data_rejected: get(&c.data_rejected),
            cache_data_written: get(&c.data_written),
            cache_data_merged: get(&c.data_merged),
            disk_errors: get(&c.disk_errors),
            disk: self.disk.as_ref().map(|d| d.stats()).unwrap_or_default(),
        }
    }
}

impl Drop for VulkanCache {
    /// Writes back and retires every device still registered, then drops the pipelines (leased
    /// ones go with their last lease).
    fn drop(&mut self) {
        let devices: Vec<_> = self.devices.lock().drain().map(|(_, s)| s).collect();
        for state in devices {
            state.retired.store(true, Ordering::Release);
            let _ = self.retire(&state);
        }
    }
}

/// Disk key of a device's pipeline-cache data: everything the cache header names, plus the
/// driver version the header leaves out.
fn pipeline_cache_key(
    identity: &CacheIdentity,
    props: &vk::PhysicalDeviceProperties,
) -> Result<Key> {
    let name = props
        .device_name_as_c_str()
        .map(CStr::to_bytes)
        .unwrap_or_default();
    let mut k = KeyBuilder::new();
    k.backend("vulkan")
        .device_vendor(identity.vendor_id.to_le_bytes())
        .device_name(name)
        .driver_version(identity.driver_version.to_le_bytes())
        .entry("VkPipelineCache")
        .extra("deviceID", identity.device_id.to_le_bytes())
        .extra("pipelineCacheUUID", identity.pipeline_cache_uuid);
    k.finish()
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
