//! What the Vulkan cache counts: Vulkan objects made and destroyed and pipeline-cache data
//! moved to and from disk, next to the memory and disk tiers' own counters.

use crate::disk::DiskStats;

crate::stats::statistics! {
    /// What kcache did with Vulkan objects and pipeline-cache data, next to the memory tier's
    /// own statistics.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct VulkanStats {
        nested memory: crate::memory::Stats,
        /// Successful `vkCreateComputePipelines` calls.
        counted pipelines_created,
        /// `vkDestroyPipeline` calls (each with its `vkDestroyShaderModule`).
        counted pipelines_destroyed,
        /// Pipeline layouts created (one per device and layout description).
        counted layouts_created,
        /// Pipeline-cache blobs read from disk (or from the remote tier behind it, which counts
        /// its reads in `disk.remote`), validated and handed to the driver.
        counted cache_data_loaded,
        /// Device registrations that found no pipeline-cache data on disk.
        counted cache_data_missing,
        /// Blobs refused before reaching the driver (header names another device, driver or
        /// format), plus blobs the driver itself refused. Each is a miss.
        counted cache_data_rejected,
        /// Pipeline-cache blobs written to disk (each also written to a remote tier that takes
        /// writes, unless the remote holds that data already).
        counted cache_data_written,
        /// Blobs another cache (or node, through the remote tier) stored since this one last read
        /// or wrote, merged in before a write.
        counted cache_data_merged,
        /// Disk reads or writes that failed. A failed read at registration starts the device's
        /// pipeline cache empty; a failed write is returned by the call that flushed.
        counted disk_errors,
        /// The disk tier's own counters (integrity rejects, puts, evictions, I/O errors, …),
        /// all zero without a disk tier. A disk tier shared with other caches counts for all.
        nested disk: DiskStats,
    }
    /// What the cache counts, zeroed by `VulkanCache::reset_stats`.
    live pub(super) struct Counters;
}

impl VulkanStats {
    /// The memory tier's hit rate: pipelines are created (with the help of the device's
    /// pipeline cache) or found in memory. `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        self.memory.hit_rate()
    }
}
