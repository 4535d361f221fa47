//! The Vulkan backend's disk tier on a real driver (Mesa lavapipe): pipeline-cache data written
//! back and reloaded by a fresh cache, and blobs for another device or with a corrupt header
//! refused before the driver sees them.
//!
//! lavapipe serializes no pipelines (`vkGetPipelineCacheData` returns the 32-byte header only),
//! so the round trip here carries a header; a driver that serializes pipelines carries them too.

mod vulkan_common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kcache::backend::vulkan::{
    CacheIdentity, HEADER_LEN, VulkanCache, VulkanDevice, VulkanOptions, check_cache_header,
};
use kcache::disk::Descriptor;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::vulkan::TestGpu;
use kcache_testkit::{cache_data, rerun_test, successful_stdout};
use vulkan_common::{dispatch, expected, spec, vulkan};

/// A cache over `dir` with a freshly opened disk tier and a freshly created device, as a new
/// process would have.
fn fresh(dir: &Path) -> Option<(Arc<TestGpu>, Arc<Persistence>, VulkanCache, VulkanDevice)> {
    let vulkan = vulkan();
    let gpu = Arc::new(TestGpu::for_test()?);
    let disk = Arc::new(Persistence::open(PersistenceConfig::in_dir(dir)).unwrap());
    let cache = VulkanCache::new(VulkanOptions {
        persistence: Some(disk.clone()),
        vulkan: Some(vulkan),
        ..VulkanOptions::default()
    })
    .unwrap();
    let device = cache.register_owned_device(gpu.clone()).unwrap();
    Some((gpu, disk, cache, device))
}

fn build_and_dispatch(gpu: &TestGpu, cache: &VulkanCache, device: &VulkanDevice, mul: u32) {
    let lease = cache.find_or_build(device, &spec(mul)).unwrap();
    let out = dispatch(gpu, &lease, 9);
    assert_eq!(out, expected(mul, 9));
}

fn stored_blob(disk: &Persistence, device: &VulkanDevice) -> Option<Vec<u8>> {
    disk.get(&device.pipeline_cache_key())
        .unwrap()
        .map(|e| e.into_payload())
}

/// Set in the child process of the round trip to the directory the parent wrote.
const CHILD_DIR: &str = "KCACHE_TEST_VULKAN_CHILD_DIR";

#[test]
fn pipeline_cache_data_round_trips_through_disk() {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        return second_process(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let Some((gpu, disk, cache, device)) = fresh(dir.path()) else {
            return;
        };
        let s = cache.stats();
        assert_eq!((s.cache_data_missing, s.cache_data_loaded), (1, 0));
        assert!(
            !cache.flush(&device).unwrap(),
            "nothing built, nothing to write"
        );
        build_and_dispatch(&gpu, &cache, &device, 3);
        assert!(cache.flush(&device).unwrap());
        assert!(
            !cache.flush(&device).unwrap(),
            "no new pipeline since the write"
        );
        assert_eq!(cache.stats().cache_data_written, 1);
        let blob = stored_blob(&disk, &device).expect("written back");
        assert!(blob.len() >= HEADER_LEN);
        check_cache_header(&blob, device.identity()).unwrap();
        // The entry says what it holds: this device's pipeline-cache data.
        let entry = disk.get(&device.pipeline_cache_key()).unwrap().unwrap();
        assert_eq!(
            entry.descriptor(),
            Some(&Descriptor::new("vulkan", gpu.name(), "VkPipelineCache"))
        );
    }

    // The reader is a new process: nothing but the directory carries over.
    let name = "pipeline_cache_data_round_trips_through_disk";
    let stdout = successful_stdout(
        "the second process",
        rerun_test(name).env(CHILD_DIR, dir.path()),
    );
    assert!(
        stdout.contains("1 passed"),
        "the second process ran no test:\n{stdout}"
    );
}

fn second_process(dir: &Path) {
    let Some((gpu, _disk, cache, device)) = fresh(dir) else {
        return;
    };
    assert_eq!(
        cache_data!(cache.stats()),
        (0, 1, 0),
        "the stored header names this device and reaches the driver"
    );
    build_and_dispatch(&gpu, &cache, &device, 3);
    assert_eq!(
        cache.stats().memory.builds,
        1,
        "a fresh memory tier builds once"
    );
}

#[test]
fn write_back_happens_on_unregister_and_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let Some((gpu, disk, cache, device)) = fresh(dir.path()) else {
        return;
    };
    build_and_dispatch(&gpu, &cache, &device, 2);
    assert_eq!(cache.unregister_device(&device).unwrap(), 0);
    assert_eq!(cache.stats().cache_data_written, 1);
    assert!(stored_blob(&disk, &device).is_some());

    assert!(disk.remove(&device.pipeline_cache_key()).unwrap());
    let device = cache.register_owned_device(gpu.clone()).unwrap();
    build_and_dispatch(&gpu, &cache, &device, 2);
    drop(cache);
    assert!(
        stored_blob(&disk, &device).is_some(),
        "dropping the cache writes back"
    );
}

#[test]
fn write_back_merges_what_another_cache_stored_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let Some((gpu_a, disk, a, device_a)) = fresh(dir.path()) else {
        return;
    };
    let Some((gpu_b, _disk_b, b, device_b)) = fresh(dir.path()) else {
        return;
    };
    build_and_dispatch(&gpu_a, &a, &device_a, 2);
    build_and_dispatch(&gpu_b, &b, &device_b, 3);
    assert!(a.flush(&device_a).unwrap());
    assert_eq!(
        a.stats().cache_data_merged,
        0,
        "nothing stored before a's write"
    );
    // Whether b then writes depends on the driver: lavapipe's merged data is the same header
    // that a stored, so there is nothing new to write.
    b.flush(&device_b).unwrap();
    assert_eq!(
        b.stats().cache_data_merged,
        1,
        "a's data merged into b's before b writes"
    );
    assert!(!b.flush(&device_b).unwrap(), "no new pipeline since");
    let blob = stored_blob(&disk, &device_b).unwrap();
    check_cache_header(&blob, device_b.identity()).unwrap();
}

/// A valid header for `id`, which each case then damages.
fn header_for(id: &CacheIdentity) -> Vec<u8> {
    // Header length, header version one, vendor, device, UUID: little-endian, as the spec says.
    [
        &(HEADER_LEN as u32).to_le_bytes()[..],
        &1u32.to_le_bytes(),
        &id.vendor_id.to_le_bytes(),
        &id.device_id.to_le_bytes(),
        &id.pipeline_cache_uuid,
    ]
    .concat()
}

#[test]
fn foreign_or_corrupt_blobs_are_rejected_before_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let (identity, key) = {
        let Some((_gpu, _disk, cache, device)) = fresh(dir.path()) else {
            return;
        };
        let found = (*device.identity(), device.pipeline_cache_key());
        cache.unregister_device(&device).unwrap();
        found
    };
    let valid = header_for(&identity);
    check_cache_header(&valid, &identity).unwrap();

    type Damage = fn(&mut Vec<u8>);
    let damage: [(&str, Damage); 6] = [
        ("foreign pipelineCacheUUID", |b| b[16] ^= 0xff),
        ("foreign vendor", |b| b[8] ^= 0x01),
        ("foreign device", |b| b[12] ^= 0x01),
        ("unknown header version", |b| b[4] = 2),
        ("header length beyond the blob", |b| b[0] = 200),
        ("truncated header", |b| b.truncate(20)),
    ];
    for (what, corrupt) in damage {
        let mut blob = valid.clone();
        corrupt(&mut blob);
        let writer = Persistence::open(PersistenceConfig::in_dir(dir.path())).unwrap();
        writer.put(&key, &blob, Duration::ZERO).unwrap();

        let Some((gpu, disk, cache, device)) = fresh(dir.path()) else {
            return;
        };
        let s = cache.stats();
        assert_eq!(
            (s.cache_data_rejected, s.cache_data_loaded),
            (1, 0),
            "{what}: counted as a miss, not handed to the driver"
        );
        build_and_dispatch(&gpu, &cache, &device, 5);
        assert!(
            cache.flush(&device).unwrap(),
            "{what}: replaced on write-back"
        );
        assert_eq!(cache.stats().cache_data_rejected, 1, "{what}: counted once");
        let replaced = stored_blob(&disk, &device).unwrap();
        check_cache_header(&replaced, &identity).unwrap();
    }
}

#[test]
fn a_tampered_blob_shows_in_the_disk_tier_counters() {
    let dir = tempfile::tempdir().unwrap();
    let path = {
        let Some((gpu, disk, cache, device)) = fresh(dir.path()) else {
            return;
        };
        build_and_dispatch(&gpu, &cache, &device, 5);
        assert!(cache.flush(&device).unwrap());
        let s = cache.stats();
        assert_eq!((s.disk.puts, s.disk.integrity_rejects), (1, 0));
        disk.entry_path(&device.pipeline_cache_key())
    };
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[80] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();

    let Some((_gpu, _disk, cache, _device)) = fresh(dir.path()) else {
        return;
    };
    let s = cache.stats();
    assert_eq!(s.cache_data_missing, 1);
    assert_eq!(s.disk.integrity_rejects, 1);
    assert_eq!((s.disk.hits, s.disk.misses), (0, 1));
}
