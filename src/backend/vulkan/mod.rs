//! Vulkan: cached compute `VkPipeline`s, with the device's `VkPipelineCache` data on disk.
//!
//! - **Runtime.** [`Vulkan::load`] opens `libvulkan.so.1` at run time (no link dependency; a
//!   machine without a loader gets [`Error::Unavailable`](crate::Error::Unavailable)), or
//!   [`Vulkan::from_get_instance_proc_addr`] uses a loader the caller already has.
//! - **Devices.** The caller keeps owning its `VkInstance`, `VkPhysicalDevice` and `VkDevice`
//!   and registers the device with [`VulkanCache::register_device`]. kcache creates one
//!   `VkPipelineCache` per registered device, seeded from the disk tier, and
//!   [`VulkanCache::unregister_device`] (device teardown) writes it back, destroys it and
//!   evicts every pipeline of that device.
//! - **Pipelines.** [`VulkanCache::find_or_build`] returns a lease on a compute pipeline built
//!   from a [`PipelineSpec`] ([`PipelineDesc`]): SPIR-V, entry point, specialization
//!   constants, creation flags, a required subgroup size and a layout *described by content*
//!   ([`LayoutDesc`]), or derived from the shader when none is given. kcache creates the descriptor-set layouts and the
//!   pipeline layout itself (once per device and description) so that no key depends on a
//!   handle value and a key can never name a pipeline built against a different layout than the
//!   one it is used with. The memory key is the content digest plus the device's registration
//!   (not the `VkDevice`, whose value may be reused after `vkDestroyDevice`).
//! - **Lookups** go through the backend skeleton
//!   ([`HandleCache`](crate::backend::handle_cache::HandleCache)), as OpenCL's and CUDA's do.
//! - **Disk.** The tier stores the device's pipeline-cache data under (vendorID, deviceID,
//!   driverVersion, pipelineCacheUUID). The blob's header is checked against the live device
//!   before the driver sees it; a mismatch is a counted miss and the pipeline cache starts
//!   empty. Data is written back by [`VulkanCache::flush`], by `unregister_device`, and when the
//!   `VulkanCache` is dropped — each time only if pipelines were created since the last write,
//!   after merging what another process stored in the meantime.
//! - **Remote.** With a remote tier behind the disk tier ([`crate::remote`]), a device whose
//!   disk has no usable blob is seeded from the remote's (verified as every remote entry), and
//!   a write-back merges the remote's blob as well and writes the result there too.

mod cache;
mod device;
mod header;
mod layout;
mod loader;
mod persistence;
mod pipeline;
mod reflect;
mod spec;
mod spirv;
mod stats;

pub use cache::{PipelineLease, VulkanCache, VulkanOptions};
pub use device::{DeviceOwner, VulkanDevice};
pub use header::{CacheIdentity, HEADER_LEN, HeaderMismatch, check as check_cache_header};
pub use layout::{DescriptorBinding, LayoutDesc, PushConstantRange};
pub use loader::Vulkan;
pub use pipeline::{Pipeline, UncachedPipeline, create_uncached};
pub use spec::{ALLOWED_PIPELINE_FLAGS, PipelineDesc, PipelineSpec, SpecConstant};
pub use spirv::words_from_bytes;
pub use stats::VulkanStats;
