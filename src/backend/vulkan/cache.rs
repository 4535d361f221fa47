//! The Vulkan pipeline cache: registration of the caller's devices, lookups through the
//! backend skeleton, and device teardown.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ash::vk::{self, Handle};
use parking_lot::{Mutex, RwLock};

use super::device::{self, DeviceOwner, DeviceState, Limits, VulkanDevice};
use super::loader::Vulkan;
use super::persistence;
use super::pipeline::{self, Pipeline};
use super::spec::PipelineSpec;
use super::stats::{Counters, VulkanStats};
use crate::Persistence;
use crate::backend::handle_cache::{Compiled, HandleCache, Registered, Runtime, common_calls};
use crate::disk::{Reported, Reporter};
use crate::key::Key;
use crate::memory::{Lease, Options};
use crate::metrics::Backend;
use crate::stats::Live;
use crate::{BuildError, Error, Result};

/// A lease on a cached pipeline; the pipeline lives at least as long as the lease.
pub type PipelineLease = Lease<Vec<u8>, Pipeline>;

/// How a [`VulkanCache`] is set up.
#[derive(Clone, Default)]
pub struct VulkanOptions {
    /// Caps and hooks of the memory tier.
    pub memory: Options,
    /// Where pipeline-cache data persists; `None` keeps everything in memory. Its operator
    /// key and key requirement are those of the [`PersistenceConfig`](crate::PersistenceConfig) it
    /// was opened with.
    pub persistence: Option<Arc<Persistence>>,
    /// A loader already opened; `None` opens the system's with [`Vulkan::load`].
    pub vulkan: Option<Vulkan>,
}

static NEXT_CACHE: AtomicU64 = AtomicU64::new(1);

/// The Vulkan calls of the cache.
///
/// Vulkan fits the skeleton with two differences. Devices are registered explicitly, with the
/// three handles a lookup does not carry, so lookups go through
/// [`HandleCache::find_or_build_registered`] and `describe` is never asked. And the driver
/// keeps one `VkPipelineCache` per device holding every pipeline it created, so the disk holds
/// that per-device blob (see `persistence`) instead of one entry per pipeline: the skeleton's
/// disk tier stays off, and `disk_key` and `load` are never asked either.
pub(super) struct VulkanRuntime {
    vulkan: Vulkan,
    counters: Arc<Counters>,
}

impl Runtime for VulkanRuntime {
    /// The `VkDevice`, by value.
    type Handle = u64;
    type Info = DeviceState;
    type Value = Pipeline;
    type Input<'a> = &'a PipelineSpec;
    const BACKEND: Backend = Backend::Vulkan;

    fn describe(&self, _: &PipelineSpec) -> Result<DeviceState> {
        Err(Error::InvalidArgument(
            "register the device with VulkanCache::register_device first".into(),
        ))
    }

    /// The spec's stored digest: a hit hashes 40 bytes, whatever the size of the SPIR-V.
    fn memory_key(key: &mut Vec<u8>, spec: &PipelineSpec) {
        key.extend_from_slice(spec.digest());
    }

    fn disk_key(&self, _: &DeviceState, _: &PipelineSpec) -> Result<Key> {
        Err(Error::Unavailable(
            "Vulkan pipelines persist through their device's pipeline cache".into(),
        ))
    }

    fn load(
        &self,
        _: &Registered<Self>,
        _: &PipelineSpec,
        _: &[u8],
    ) -> crate::memory::Built<Pipeline> {
        Err(BuildError::new(
            0,
            "Vulkan pipelines persist through their device's pipeline cache",
        ))
    }

    fn build(
        &self,
        registered: &Registered<Self>,
        spec: &PipelineSpec,
    ) -> std::result::Result<Compiled<Pipeline>, BuildError> {
        pipeline::build(&self.counters, registered.info(), spec)
    }
}

/// A cache of compute pipelines for any number of registered devices. Share it behind an `Arc`.
pub struct VulkanCache {
    cache: HandleCache<VulkanRuntime>,
    id: u64,
    /// Where each registered device's pipeline-cache data persists.
    disk: Option<Arc<Persistence>>,
    /// What `disk` has been told of the memory tier's lookups and builds.
    reported: Reporter,
}

impl VulkanCache {
    /// Fails with [`Error::Unavailable`] when no loader is given and none can be opened.
    pub fn new(options: VulkanOptions) -> Result<VulkanCache> {
        let vulkan = match options.vulkan {
            Some(vulkan) => vulkan,
            None => Vulkan::load()?,
        };
        let runtime = VulkanRuntime {
            vulkan,
            counters: Arc::default(),
        };
        Ok(VulkanCache {
            cache: HandleCache::new(runtime, options.memory, None),
            id: NEXT_CACHE.fetch_add(1, Ordering::Relaxed),
            disk: options.persistence,
            reported: Reporter::default(),
        })
    }

    fn counters(&self) -> &Counters {
        &self.cache.runtime().counters
    }

    /// Registers the caller's device: reads its identity, loads its function table, and
    /// creates its `VkPipelineCache`, seeded from disk when a blob with a matching header is
    /// stored, else from the disk tier's remote tier when it has one. The caller keeps
    /// ownership of all three handles.
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
        device::check_handles(instance, physical_device, device)?;
        let vulkan = &self.cache.runtime().vulkan;
        // SAFETY: forwarded from the caller's contract; the handles are not null.
        let device::Opened {
            fns,
            props,
            subgroups,
        } = unsafe { device::open(vulkan, instance, physical_device, device, owner) }?;
        let identity = device::identity(&props);
        let disk_key = persistence::pipeline_cache_key(&identity, &props)?;
        let created = persistence::create_pipeline_cache(
            self.disk.as_deref(),
            self.counters(),
            &fns.fns,
            &identity,
            &disk_key,
        )?;
        let state = DeviceState {
            cache: self.id,
            fns,
            identity,
            disk_key,
            descriptor: persistence::descriptor(&props),
            limits: Limits {
                max_push_constants_size: props.limits.max_push_constants_size,
                max_bound_descriptor_sets: props.limits.max_bound_descriptor_sets,
            },
            subgroups,
            pipeline_cache: RwLock::new(created.cache),
            layouts: Mutex::new(HashMap::new()),
            // Data from the remote tier goes to disk at the first write-back, merged under the
            // entry's lock like any write, so that it cannot overwrite what another process
            // of this node wrote meanwhile.
            unsaved: AtomicU64::new(u64::from(created.from_remote)),
            build_nanos: AtomicU64::new(0),
            stored: Mutex::new(created.stored),
        };
        match self.cache.register(device.as_raw(), state) {
            Ok(registered) => Ok(VulkanDevice(registered)),
            Err(state) => {
                // Nothing was built with it: only its pipeline cache is to be destroyed.
                destroy_pipeline_cache(&state);
                Err(Error::InvalidArgument(
                    "this VkDevice is already registered".into(),
                ))
            }
        }
    }

    /// Refuses a device registered with another cache.
    fn check_owner(&self, device: &VulkanDevice) -> Result<()> {
        if device.state().cache != self.id {
            return Err(Error::InvalidArgument(
                "device is registered with another VulkanCache".into(),
            ));
        }
        Ok(())
    }

    /// Returns a lease on the compute pipeline for `spec` on `device`, creating it on a miss
    /// (one `vkCreateComputePipelines` per key however many threads miss at once).
    pub fn find_or_build(
        &self,
        device: &VulkanDevice,
        spec: &PipelineSpec,
    ) -> Result<PipelineLease> {
        self.check_owner(device)?;
        let limits = &device.state().limits;
        let layout = spec.layout();
        if layout.sets.len() as u64 > u64::from(limits.max_bound_descriptor_sets) {
            return Err(Error::InvalidArgument(format!(
                "{} descriptor sets exceed the device's maxBoundDescriptorSets ({})",
                layout.sets.len(),
                limits.max_bound_descriptor_sets
            )));
        }
        let push_end = layout.push_constants.map_or(0, |pc| pc.offset + pc.size);
        if push_end > limits.max_push_constants_size {
            return Err(Error::InvalidArgument(format!(
                "push constants end at byte {push_end} beyond the device's \
                 maxPushConstantsSize ({})",
                limits.max_push_constants_size
            )));
        }
        if let Some(size) = spec.required_subgroup_size() {
            if device.is_retired() {
                return Err(Error::DeviceDestroyed(device.id()));
            }
            // SAFETY: a registered device's instance and physical device are alive (the
            // registration's contract).
            match unsafe { device.state().subgroups.compute_sizes() } {
                Some((min, max)) if (min..=max).contains(&size) => {}
                Some((min, max)) => {
                    return Err(Error::InvalidArgument(format!(
                        "required subgroup size {size} is outside the device's compute \
                         subgroup sizes {min}..={max}"
                    )));
                }
                None => {
                    return Err(Error::InvalidArgument(
                        "the device cannot require a subgroup size for compute shaders \
                         (no VK_EXT_subgroup_size_control or Vulkan 1.3)"
                            .into(),
                    ));
                }
            }
        }
        self.cache.find_or_build_registered(&device.0, spec)
    }

    /// Writes the device's pipeline-cache data to disk if pipelines were created (or data
    /// loaded from the remote tier) since the last write, merging in what another process
    /// stored meanwhile; with a remote tier that takes writes, merges the remote's data too
    /// and writes the result there on the disk tier's background writer. Returns whether it
    /// wrote to disk.
    pub fn flush(&self, device: &VulkanDevice) -> Result<bool> {
        self.check_owner(device)?;
        if device.is_retired() {
            return Err(Error::DeviceDestroyed(device.id()));
        }
        persistence::write_back(self.disk.as_deref(), self.counters(), device.state())
    }

    /// Device teardown: writes its pipeline-cache data back, destroys the pipeline cache and
    /// the layouts no pipeline uses, and evicts every pipeline of the device (each destroyed
    /// now, or when its last lease is released). Returns how many pipelines are still alive
    /// because a lease holds them; they must be released before `vkDestroyDevice`.
    pub fn unregister_device(&self, device: &VulkanDevice) -> Result<u64> {
        self.check_owner(device)?;
        let id = device.id();
        let taken = self.cache.take(|registered| registered.id() == id);
        if taken.is_empty() {
            return Err(Error::DeviceDestroyed(id));
        }
        let flushed = self.retire(device.state());
        let evicted = self.cache.evict_registrations(&taken);
        flushed?;
        evicted?;
        Ok(device.live_pipelines())
    }

    /// Writes back and destroys the device's pipeline cache and drops its layout table.
    fn retire(&self, state: &DeviceState) -> Result<()> {
        let flushed = persistence::write_back(self.disk.as_deref(), self.counters(), state);
        destroy_pipeline_cache(state);
        state.layouts.lock().clear();
        flushed.map(|_| ())
    }

    // `clear` leaves the devices registered, with their pipeline caches.
    common_calls!();

    /// Zeroes the event counters of the cache, its memory tier and its disk tier (a disk tier
    /// shared with other caches is reset for them too); gauges stay.
    pub fn reset_stats(&self) {
        self.cache.memory().reset_stats();
        self.counters().zero();
        if let Some(disk) = &self.disk {
            disk.reset_stats();
        }
    }

    pub fn stats(&self) -> VulkanStats {
        VulkanStats {
            memory: self.cache.memory().stats(),
            disk: self.disk.as_ref().map(|d| d.stats()).unwrap_or_default(),
            ..self.counters().snapshot()
        }
    }
}

/// Destroys the device's pipeline cache; null after this.
fn destroy_pipeline_cache(state: &DeviceState) {
    let mut cache = state.pipeline_cache.write();
    // SAFETY: the write lock excludes every build using the cache; null after this, and
    // destroying a null pipeline cache is a no-op.
    unsafe { state.fns.fns.destroy_pipeline_cache(*cache, None) };
    *cache = vk::PipelineCache::null();
}

impl Drop for VulkanCache {
    /// Writes back and retires every device still registered, then drops the pipelines (leased
    /// ones go with their last lease).
    fn drop(&mut self) {
        for registered in self.cache.take(|_| true) {
            let _ = self.retire(registered.info());
        }
        if let Some(disk) = &self.disk {
            // Every memory build creates a pipeline.
            let memory = self.cache.memory().raw_stats();
            self.reported.report(
                disk,
                Reported {
                    memory_hits: memory.hits,
                    memory_misses: memory.misses,
                    builds: memory.builds,
                    ..Reported::default()
                },
            );
        }
    }
}
