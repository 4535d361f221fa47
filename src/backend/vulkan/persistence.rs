//! The device's `VkPipelineCache` data on disk: read and checked at registration, merged with
//! what another process stored and written back on flush and teardown, under the entry's
//! cross-process lock. With a remote tier behind the disk tier, a registration that finds no
//! usable blob on disk reads the remote's, and a write-back merges the remote's blob too and
//! writes the result there after the disk.
//!
//! This is where Vulkan differs from the other backends' disk tier: the driver keeps one
//! pipeline cache per device, holding every pipeline it created, so the disk holds one blob
//! per device (under its identity) rather than one entry per value.

use std::ffi::CStr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ash::vk;

use super::device::DeviceState;
use super::header::{self, CacheIdentity};
use super::stats::Counters;
use crate::Persistence;
use crate::disk::Descriptor;
use crate::key::{Key, KeyBuilder};
use crate::stats::bump;
use crate::{Error, Result};

fn backend_error(what: &str, r: vk::Result) -> Error {
    Error::Backend(format!("{what} failed: {r}"))
}

fn digest(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// Disk key of a device's pipeline-cache data: everything the cache header names, plus the
/// driver version the header leaves out.
pub(super) fn pipeline_cache_key(
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

/// What a device's pipeline-cache entry says it holds.
pub(super) fn descriptor(props: &vk::PhysicalDeviceProperties) -> Descriptor {
    let name = props.device_name_as_c_str().unwrap_or_default();
    Descriptor::new("vulkan", &name.to_string_lossy(), "VkPipelineCache")
}

/// Digests of the blobs last read from or written to each store: a write-back merges only
/// what changed there since, and writes only where its data differs.
pub(super) struct Stored {
    pub(super) disk: Option<[u8; 32]>,
    pub(super) remote: Option<[u8; 32]>,
}

/// A device's new pipeline cache, and what it was seeded from.
pub(super) struct Created {
    pub(super) cache: vk::PipelineCache,
    pub(super) stored: Stored,
    /// Seeded from the remote tier's blob, which the disk has no copy of yet.
    pub(super) from_remote: bool,
}

/// Creates the device's pipeline cache from disk data whose header names this device, else
/// from the remote tier's (behind the disk tier, when it has one), else empty.
pub(super) fn create_pipeline_cache(
    disk: Option<&Persistence>,
    counters: &Counters,
    fns: &ash::Device,
    identity: &CacheIdentity,
    key: &Key,
) -> Result<Created> {
    let blob = match disk {
        // A disk that cannot be read costs the warm start, not the device.
        Some(disk) => match disk.get(key) {
            Ok(entry) => entry.map(crate::disk::Entry::into_payload),
            Err(_) => {
                bump(&counters.disk_errors, 1);
                None
            }
        },
        None => None,
    };
    // Remembered even for a rejected blob, so that a write-back neither merges it nor
    // counts it a second time, and replaces it.
    let mut stored = Stored {
        disk: blob.as_deref().map(digest),
        remote: None,
    };
    if blob.is_none() && disk.is_some() {
        bump(&counters.cache_data_missing, 1);
    }
    let mut seed = blob.and_then(|data| checked(counters, data, identity));
    if seed.is_none() {
        // Verified as a disk entry is, and counted in the remote tier's statistics.
        seed = disk
            .and_then(|disk| disk.fetch_shared(key))
            .and_then(|entry| checked(counters, entry.into_payload(), identity));
        stored.remote = seed.as_deref().map(digest);
    }
    let initial = seed.as_deref().unwrap_or_default();
    let info = vk::PipelineCacheCreateInfo::default().initial_data(initial);
    // SAFETY: `fns` is the live device's table; `initial` is empty or carries a header
    // that names this very device, driver build and cache format.
    match unsafe { fns.create_pipeline_cache(&info, None) } {
        Ok(cache) => {
            if !initial.is_empty() {
                bump(&counters.cache_data_loaded, 1);
            }
            Ok(Created {
                cache,
                from_remote: stored.remote.is_some(),
                stored,
            })
        }
        Err(_) if !initial.is_empty() => {
            // The driver refused data whose header matched: a miss like any other.
            bump(&counters.cache_data_rejected, 1);
            let empty = vk::PipelineCacheCreateInfo::default();
            // SAFETY: as above, with no initial data.
            let cache = unsafe { fns.create_pipeline_cache(&empty, None) }
                .map_err(|r| backend_error("vkCreatePipelineCache", r))?;
            Ok(Created {
                cache,
                stored,
                from_remote: false,
            })
        }
        Err(r) => Err(backend_error("vkCreatePipelineCache", r)),
    }
}

/// `data` if its header names this device; otherwise it is counted and dropped.
fn checked(counters: &Counters, data: Vec<u8>, identity: &CacheIdentity) -> Option<Vec<u8>> {
    if header::check(&data, identity).is_ok() {
        Some(data)
    } else {
        bump(&counters.cache_data_rejected, 1);
        None
    }
}

/// Writes the device's pipeline-cache data to disk, and to the remote tier when the disk
/// tier shares with one, if pipelines were created (or remote data loaded) since the last
/// write, merging in what another process or node stored meanwhile. Returns whether it wrote
/// to disk.
pub(super) fn write_back(
    disk: Option<&Persistence>,
    counters: &Counters,
    state: &DeviceState,
) -> Result<bool> {
    let Some(disk) = disk else {
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
    let result = write_data(disk, counters, state, *cache, &mut stored);
    if result.is_err() {
        // Keep the data marked unsaved so that the next flush retries.
        state.unsaved.fetch_add(pending, Ordering::AcqRel);
    }
    result
}

fn write_data(
    disk: &Persistence,
    counters: &Counters,
    state: &DeviceState,
    cache: vk::PipelineCache,
    stored: &mut Stored,
) -> Result<bool> {
    let d = &state.fns.fns;
    // Read, merge and write as one step across processes, so that two processes writing back
    // at once do not each drop the other's pipelines.
    let _merging = disk.lock(&state.disk_key);
    let theirs = disk.get(&state.disk_key).inspect_err(|_| {
        bump(&counters.disk_errors, 1);
    })?;
    if let Some(theirs) = theirs {
        let (seen, known) = (&mut stored.disk, stored.remote);
        merge_new(counters, state, cache, theirs.payload(), seen, known)?;
    }
    // Another node's data too, so that this write does not drop it from the remote (one read,
    // within the remote's budget; nothing while its breaker is open). Two nodes writing at
    // once are not serialized: the last write wins until the other's next write-back.
    let shares = disk.shares();
    if let Some(theirs) = shares.then(|| disk.fetch_shared(&state.disk_key)).flatten() {
        let (seen, known) = (&mut stored.remote, stored.disk);
        merge_new(counters, state, cache, theirs.payload(), seen, known)?;
    }
    // SAFETY: live device and pipeline cache (read-locked, so not destroyed meanwhile).
    let data = unsafe { d.get_pipeline_cache_data(cache) }
        .map_err(|r| backend_error("vkGetPipelineCacheData", r))?;
    if let Err(m) = header::check(&data, &state.identity) {
        return Err(Error::Backend(format!(
            "the driver's own pipeline-cache data fails the header check: {m}"
        )));
    }
    let written = Some(digest(&data));
    let build_time = Duration::from_nanos(state.build_nanos.load(Ordering::Relaxed));
    let to_disk = written != stored.disk;
    if to_disk {
        disk.put_described(&state.disk_key, &data, build_time, &state.descriptor)
            .inspect_err(|_| {
                bump(&counters.disk_errors, 1);
            })?;
        stored.disk = written;
        bump(&counters.cache_data_written, 1);
    }
    if shares && written != stored.remote {
        // Off the caller's path, as every remote write; the size limit is the remote's.
        disk.share_later(&state.disk_key, data, build_time, state.descriptor.clone());
        stored.remote = written;
    }
    Ok(to_disk)
}

/// Merges `theirs`, a store's blob, into `cache` unless it is the one last seen there
/// (`seen`, then set to it) or the other store's (`known`), which is in `cache` already.
fn merge_new(
    counters: &Counters,
    state: &DeviceState,
    cache: vk::PipelineCache,
    theirs: &[u8],
    seen: &mut Option<[u8; 32]>,
    known: Option<[u8; 32]>,
) -> Result<()> {
    let found = Some(digest(theirs));
    if found == *seen {
        return Ok(());
    }
    if found == known {
        *seen = found;
        return Ok(());
    }
    if header::check(theirs, &state.identity).is_ok() {
        merge(counters, &state.fns.fns, cache, theirs)?;
        // If merging added nothing of ours, the stored blob already says it all.
        *seen = found;
    } else {
        bump(&counters.cache_data_rejected, 1);
    }
    Ok(())
}

fn merge(counters: &Counters, d: &ash::Device, into: vk::PipelineCache, data: &[u8]) -> Result<()> {
    let info = vk::PipelineCacheCreateInfo::default().initial_data(data);
    // SAFETY: live device; `data`'s header names this device (checked by the caller).
    let Ok(theirs) = (unsafe { d.create_pipeline_cache(&info, None) }) else {
        bump(&counters.cache_data_rejected, 1);
        return Ok(());
    };
    // SAFETY: both caches belong to the live device; `theirs` is used by nobody else.
    let merged = unsafe { d.merge_pipeline_caches(into, &[theirs]) };
    // SAFETY: `theirs` was created above and is no longer needed.
    unsafe { d.destroy_pipeline_cache(theirs, None) };
    merged.map_err(|r| backend_error("vkMergePipelineCaches", r))?;
    bump(&counters.cache_data_merged, 1);
    Ok(())
}
