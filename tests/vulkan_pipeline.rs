//! The Vulkan backend's memory tier on a real driver (Mesa lavapipe): builds, hits, dispatches,
//! SPIR-V checks, device eviction and single-flight creation.

mod vulkan_common;

use std::sync::{Arc, Barrier};

use kcache::Error;
use kcache::backend::vulkan::{PipelineSpec, SpecConstant, Vulkan, VulkanCache, VulkanDevice};
use kcache_testkit::assert_err;
use kcache_testkit::vulkan::{TestGpu, glslang};
use vulkan_common::{cache, dispatch, expected, layout, spec, spirv, vulkan};

fn setup() -> Option<(Arc<TestGpu>, VulkanCache, VulkanDevice)> {
    let vulkan = vulkan();
    let gpu = Arc::new(TestGpu::for_test()?);
    let cache = cache(vulkan);
    let device = cache.register_owned_device(gpu.clone()).unwrap();
    Some((gpu, cache, device))
}

#[test]
fn cold_build_then_hit_each_dispatch_correctly() {
    let Some((gpu, cache, device)) = setup() else {
        return;
    };
    let triple = spec(3);

    let cold = cache.find_or_build(&device, &triple).unwrap();
    let s = cache.stats();
    assert_eq!((s.memory.misses, s.memory.builds, s.memory.hits), (1, 1, 0));
    assert_eq!(s.pipelines_created, 1);
    let out = dispatch(&gpu, &cold, 5);
    assert_eq!(out, expected(3, 5));

    let hit = cache.find_or_build(&device, &triple).unwrap();
    let s = cache.stats();
    assert_eq!((s.memory.hits, s.memory.builds), (1, 1));
    assert_eq!(s.pipelines_created, 1);
    assert_eq!(hit.pipeline(), cold.pipeline());
    let out = dispatch(&gpu, &hit, 7);
    assert_eq!(out, expected(3, 7));

    // Another specialization value is another pipeline; the layout is shared.
    let quadruple = cache.find_or_build(&device, &spec(4)).unwrap();
    assert_ne!(quadruple.pipeline(), cold.pipeline());
    assert_eq!(quadruple.layout(), cold.layout());
    let out = dispatch(&gpu, &quadruple, 1);
    assert_eq!(out, expected(4, 1));
    let s = cache.stats();
    assert_eq!((s.pipelines_created, s.layouts_created), (2, 1));

    drop((cold, hit, quadruple));
    assert_eq!(cache.unregister_device(&device).unwrap(), 0);
    assert_eq!(cache.stats().pipelines_destroyed, 2);
}

#[test]
fn malformed_spirv_is_a_clear_invalid_argument() {
    let Some(_) = glslang() else {
        return;
    };
    let good = spirv();
    let check = |words: &[u32], entry: &str, needle: &str| match PipelineSpec::new(
        words,
        entry,
        &[],
        &layout(),
    ) {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains(needle), "{msg:?} should mention {needle:?}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let mut bad_magic = good.to_vec();
    bad_magic[0] = 0x0203_0723;
    check(&bad_magic, "main", "magic");
    let mut overrun = good.to_vec();
    overrun.push((3 << 16) | 1); // an OpUndef claiming three words, of which one is there
    check(&overrun, "main", "past the end");
    check(&good[..3], "main", "header");
    check(good, "mian", "entry point");
    let mut zero_bound = good.to_vec();
    zero_bound[3] = 0;
    check(&zero_bound, "main", "bound");
}

#[test]
fn device_eviction_destroys_each_pipeline_exactly_once() {
    let Some((gpu, cache, device)) = setup() else {
        return;
    };
    let held = cache.find_or_build(&device, &spec(2)).unwrap();
    drop(cache.find_or_build(&device, &spec(3)).unwrap());
    drop(cache.find_or_build(&device, &spec(5)).unwrap());
    assert_eq!(device.live_pipelines(), 3);

    // Two idle pipelines go at once; the leased one survives until its release.
    assert_eq!(cache.unregister_device(&device).unwrap(), 1);
    let s = cache.stats();
    assert_eq!((s.pipelines_destroyed, s.memory.device_evictions), (2, 3));
    assert!(cache.is_empty());
    let out = dispatch(&gpu, &held, 0);
    assert_eq!(out, expected(2, 0));
    drop(held);
    assert_eq!(cache.stats().pipelines_destroyed, 3);
    assert_eq!(device.live_pipelines(), 0);

    // The registration is gone: no new pipelines, no second teardown.
    assert_err!(
        cache.find_or_build(&device, &spec(2)),
        Error::DeviceDestroyed(_)
    );
    assert_err!(cache.unregister_device(&device), Error::DeviceDestroyed(_));
    drop(cache);
    assert_eq!(device.live_pipelines(), 0);
}

#[test]
fn eight_threads_on_one_cold_key_create_one_pipeline() {
    let Some((gpu, cache, device)) = setup() else {
        return;
    };
    let cache = Arc::new(cache);
    let spec = Arc::new(spec(6));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (cache, device, spec, barrier) =
                (cache.clone(), device.clone(), spec.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                cache.find_or_build(&device, &spec).map(|l| l.pipeline())
            })
        })
        .collect();
    let pipelines: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    assert!(pipelines.iter().all(|&p| p == pipelines[0]));
    let s = cache.stats();
    assert_eq!(s.memory.builds, 1);
    assert_eq!(s.pipelines_created, 1);
    assert_eq!(s.memory.hits + s.memory.waits + s.memory.misses, 8);

    let lease = cache.find_or_build(&device, &spec).unwrap();
    let out = dispatch(&gpu, &lease, 2);
    assert_eq!(out, expected(6, 2));
    drop(lease);
    cache.unregister_device(&device).unwrap();
}

#[test]
fn layouts_and_limits_are_checked_against_the_device() {
    let Some((gpu, cache, device)) = setup() else {
        return;
    };
    let mut huge = layout();
    huge.push_constants.as_mut().unwrap().size = 1 << 20;
    let spec = PipelineSpec::new(spirv(), "main", &[SpecConstant::u32(0, 1)], &huge).unwrap();
    assert_err!(
        cache.find_or_build(&device, &spec),
        Error::InvalidArgument(_)
    );
    // Set 0 covers the shader, so only the device's limit can refuse the other 999.
    let mut too_many_sets = layout();
    too_many_sets.sets.resize(1000, Vec::new());
    let spec = PipelineSpec::new(spirv(), "main", &[], &too_many_sets).unwrap();
    assert_err!(
        cache.find_or_build(&device, &spec),
        Error::InvalidArgument(_)
    );
    let again = cache.register_owned_device(gpu.clone());
    assert!(matches!(again, Err(Error::InvalidArgument(_))));
    assert_eq!(cache.stats().pipelines_created, 0);
    cache.unregister_device(&device).unwrap();
}

#[test]
fn a_missing_loader_is_unavailable() {
    match Vulkan::load_from("/nonexistent/libvulkan.so.1") {
        Err(Error::Unavailable(msg)) => assert!(msg.contains("libvulkan"), "{msg}"),
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(_) => panic!("expected Unavailable, got a loader"),
    }
}

#[test]
fn a_device_is_used_only_with_the_cache_it_is_registered_with() {
    let Some((_gpu, cache, device)) = setup() else {
        return;
    };
    let other = vulkan_common::cache(vulkan());
    assert_err!(
        other.find_or_build(&device, &spec(2)),
        Error::InvalidArgument(_)
    );
    assert_err!(other.flush(&device), Error::InvalidArgument(_));
    assert_err!(other.unregister_device(&device), Error::InvalidArgument(_));
    assert!(!device.is_retired());
    assert_eq!(cache.unregister_device(&device).unwrap(), 0);
    assert!(device.is_retired());
}

#[test]
fn reset_stats_zeroes_counters_keeps_gauges_and_hit_rate_follows() {
    let Some((_gpu, cache, device)) = setup() else {
        return;
    };
    assert_eq!(cache.stats().hit_rate(), None);
    let cold = cache.find_or_build(&device, &spec(3)).unwrap();
    drop(cache.find_or_build(&device, &spec(3)).unwrap());
    let s = cache.stats();
    assert_eq!(
        (s.memory.hits, s.memory.misses, s.pipelines_created),
        (1, 1, 1)
    );
    assert_eq!(s.hit_rate(), Some(0.5));

    cache.reset_stats();
    let s = cache.stats();
    assert_eq!(s.hit_rate(), None);
    assert_eq!(
        (s.memory.hits, s.memory.misses, s.pipelines_created),
        (0, 0, 0)
    );
    assert_eq!((s.memory.entries, s.memory.leases), (1, 1));

    drop(cache.find_or_build(&device, &spec(3)).unwrap());
    let s = cache.stats();
    assert_eq!((s.memory.hits, s.pipelines_created), (1, 0));
    assert_eq!(s.hit_rate(), Some(1.0));
    drop(cold);
    assert_eq!(cache.unregister_device(&device).unwrap(), 0);
}

#[test]
fn the_validation_layer_reports_misuse_to_the_tests() {
    // Every dispatching test passes only when the validation layer stays silent: here it must
    // speak, so pushing 8 bytes into the layout's 4-byte push-constant range is seen.
    let Some((gpu, cache, device)) = setup() else {
        return;
    };
    let lease = cache.find_or_build(&device, &spec(1)).unwrap();
    gpu.dispatch(&lease, &vulkan_common::input(), &[0; 8], 4)
        .unwrap();
    let messages = gpu.take_validation_messages();
    assert!(
        messages.iter().any(|m| m.contains("vkCmdPushConstants")),
        "{messages:?}"
    );
    assert!(gpu.validation_messages().is_empty());
    drop(lease);
    cache.unregister_device(&device).unwrap();
}
