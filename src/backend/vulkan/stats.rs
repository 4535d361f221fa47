//! What the Vulkan cache counts: Vulkan objects made and destroyed and pipeline-cache data
//! moved to and from disk, next to the memory and disk tiers' own counters.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::disk::DiskStats;
use crate::memory::counters;

counters! {
    pub(super) struct Counters {
        pipelines_created, pipelines_destroyed, layouts_created, data_loaded, data_missing,
        data_rejected, data_written, data_merged, disk_errors,
    }
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
    /// Pipeline-cache blobs read from disk (or from the remote tier behind it, which counts
    /// its reads in `disk.remote`), validated and handed to the driver.
    pub cache_data_loaded: u64,
    /// Device registrations that found no pipeline-cache data on disk.
    pub cache_data_missing: u64,
    /// Blobs refused before reaching the driver (header names another device, driver or
    /// format), plus blobs the driver itself refused. Each is a miss.
    pub cache_data_rejected: u64,
    /// Pipeline-cache blobs written to disk (each also written to a remote tier that takes
    /// writes, unless the remote holds that data already).
    pub cache_data_written: u64,
    /// Blobs another cache (or node, through the remote tier) stored since this one last read
    /// or wrote, merged in before a write.
    pub cache_data_merged: u64,
    /// Disk reads or writes that failed. A failed read at registration starts the device's
    /// pipeline cache empty; a failed write is returned by the call that flushed.
    pub disk_errors: u64,
    /// The disk tier's own counters (integrity rejects, puts, evictions, I/O errors, …),
    /// all zero without a disk tier. A disk tier shared with other caches counts for all.
    pub disk: DiskStats,
}

impl VulkanStats {
    /// The memory tier's hit rate: pipelines are created (with the help of the device's
    /// pipeline cache) or found in memory. `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        self.memory.hit_rate()
    }
}

impl Counters {
    /// Zeroes every counter (all are events).
    pub(super) fn reset(&self) {
        crate::stats::zero(&[
            &self.pipelines_created,
            &self.pipelines_destroyed,
            &self.layouts_created,
            &self.data_loaded,
            &self.data_missing,
            &self.data_rejected,
            &self.data_written,
            &self.data_merged,
            &self.disk_errors,
        ]);
    }

    /// The counters, next to the tiers' own.
    pub(super) fn stats(&self, memory: crate::memory::Stats, disk: DiskStats) -> VulkanStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VulkanStats {
            memory,
            pipelines_created: get(&self.pipelines_created),
            pipelines_destroyed: get(&self.pipelines_destroyed),
            layouts_created: get(&self.layouts_created),
            cache_data_loaded: get(&self.data_loaded),
            cache_data_missing: get(&self.data_missing),
            cache_data_rejected: get(&self.data_rejected),
            cache_data_written: get(&self.data_written),
            cache_data_merged: get(&self.data_merged),
            disk_errors: get(&self.disk_errors),
            disk,
        }
    }
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
