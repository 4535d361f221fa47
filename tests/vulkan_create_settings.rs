//! What a description carries besides the shader and its layout: pipeline-creation flags, a
//! required subgroup size, and specialization constants given as Vulkan's map entries and
//! data. Each is part of the key, and each pipeline built with it dispatches on lavapipe with
//! the validation layer silent.

mod vulkan_common;

use std::sync::Arc;

use ash::vk;
use kcache::Error;
use kcache::backend::vulkan::{
    ALLOWED_PIPELINE_FLAGS, PipelineDesc, PipelineSpec, SpecConstant, VulkanCache, VulkanDevice,
};
use kcache_testkit::vulkan::{TestGpu, glslang};
use vulkan_common::{SHADER, cache, compile_for, dispatch, expected, input, layout, spirv, vulkan};

fn setup() -> Option<(Arc<TestGpu>, VulkanCache, VulkanDevice)> {
    let gpu = Arc::new(TestGpu::for_test()?);
    let cache = cache(vulkan());
    let device = cache.register_owned_device(gpu.clone()).unwrap();
    Some((gpu, cache, device))
}

fn with(flags: vk::PipelineCreateFlags, subgroup: Option<u32>) -> kcache::Result<PipelineSpec> {
    let layout = layout();
    PipelineSpec::from_desc(&PipelineDesc {
        specialization: &[SpecConstant::u32(0, 3)],
        layout: Some(&layout),
        flags,
        required_subgroup_size: subgroup,
        ..PipelineDesc::new(spirv(), "main")
    })
}

fn invalid(result: kcache::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(Error::InvalidArgument(message)) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn flags_change_the_key_and_reach_the_driver() {
    let Some((gpu, cache, device)) = setup() else {
        return;
    };
    let plain = with(vk::PipelineCreateFlags::empty(), None).unwrap();
    let unoptimized = with(vk::PipelineCreateFlags::DISABLE_OPTIMIZATION, None).unwrap();
    assert_ne!(plain.digest(), unoptimized.digest());
    assert_eq!(
        unoptimized.flags(),
        vk::PipelineCreateFlags::DISABLE_OPTIMIZATION
    );

    let a = cache.find_or_build(&device, &plain).unwrap();
    let b = cache.find_or_build(&device, &unoptimized).unwrap();
    assert_ne!(a.value().pipeline(), b.value().pipeline());
    assert_eq!(cache.stats().pipelines_created, 2);
    assert_eq!(dispatch(&gpu, &a, 1), expected(3, 1));
    assert_eq!(dispatch(&gpu, &b, 2), expected(3, 2));
    drop((a, b));
    cache.unregister_device(&device).unwrap();
}

#[test]
fn flags_a_cached_pipeline_cannot_honour_are_refused() {
    let Some(_) = glslang() else {
        return;
    };
    // A derivative names a base pipeline, which a cache key cannot.
    let message = invalid(with(vk::PipelineCreateFlags::DERIVATIVE, None));
    assert!(message.contains("0x4"), "{message}");
    let graphics_only = vk::PipelineCreateFlags::from_raw(1 << 31);
    assert!(!ALLOWED_PIPELINE_FLAGS.contains(graphics_only));
    invalid(with(graphics_only, None));
}

#[test]
fn a_required_subgroup_size_is_part_of_the_key_and_checked_against_the_device() {
    let Some((gpu, cache, device)) = setup() else {
        return;
    };
    let message = invalid(with(vk::PipelineCreateFlags::empty(), Some(3)));
    assert!(message.contains("power of two"), "{message}");
    invalid(with(vk::PipelineCreateFlags::empty(), Some(256)));

    // Far beyond any device's range: refused at lookup, before the driver.
    let too_big = with(vk::PipelineCreateFlags::empty(), Some(128)).unwrap();
    let message = invalid(cache.find_or_build(&device, &too_big));
    assert!(message.contains("subgroup"), "{message}");
    assert_eq!(cache.stats().pipelines_created, 0);

    // lavapipe supports subgroup size control with one size (8 on x86-64 with AVX2): a shader
    // that reports its subgroup size runs with the one required.
    let size = (1..=64)
        .map(|p| 1u32 << (p % 7))
        .find(|&s| gpu.supports_subgroup_size(s))
        .expect("lavapipe supports VK_EXT_subgroup_size_control");
    let glsl = SHADER
        .replace(
            "#version 450\n",
            "#version 450\n#extension GL_KHR_shader_subgroup_basic : require\n",
        )
        .replace("data.v[i] * MUL", "gl_SubgroupSize * MUL");
    let words = compile_for(&glsl, "vulkan1.1");
    let layout = layout();
    let required = |subgroup| {
        PipelineSpec::from_desc(&PipelineDesc {
            specialization: &[SpecConstant::u32(0, 1)],
            layout: Some(&layout),
            required_subgroup_size: subgroup,
            ..PipelineDesc::new(&words, "main")
        })
        .unwrap()
    };
    let fixed = required(Some(size));
    assert_ne!(fixed.digest(), required(None).digest());
    let lease = cache.find_or_build(&device, &fixed).unwrap();
    let out = dispatch(&gpu, &lease, 1);
    assert_eq!(out, vec![size + 1; input().len()]);
    drop(lease);
    cache.unregister_device(&device).unwrap();
}

#[test]
fn specialization_from_vulkan_map_entries() {
    let Some((gpu, cache, device)) = setup() else {
        return;
    };
    // A program's VkSpecializationInfo: constant 0 at byte 4 of its data, after another value.
    let data = [7u32.to_ne_bytes(), 5u32.to_ne_bytes()].concat();
    let entries = [vk::SpecializationMapEntry {
        constant_id: 0,
        offset: 4,
        size: 4,
    }];
    let constants = SpecConstant::from_map_entries(&entries, &data).unwrap();
    assert_eq!(constants, vec![SpecConstant::u32(0, 5)]);
    let from_entries = PipelineSpec::new(spirv(), "main", &constants, &layout()).unwrap();
    let by_hand =
        PipelineSpec::new(spirv(), "main", &[SpecConstant::u32(0, 5)], &layout()).unwrap();
    assert_eq!(from_entries.digest(), by_hand.digest());
    let lease = cache.find_or_build(&device, &from_entries).unwrap();
    assert_eq!(dispatch(&gpu, &lease, 2), expected(5, 2));

    let past_end = [vk::SpecializationMapEntry {
        constant_id: 0,
        offset: 6,
        size: 4,
    }];
    let message = invalid(SpecConstant::from_map_entries(&past_end, &data));
    assert!(message.contains("past the 8 bytes"), "{message}");
    // Vulkan requires unique constant ids; so does the description.
    let twice = [entries[0], entries[0]];
    let constants = SpecConstant::from_map_entries(&twice, &data).unwrap();
    invalid(PipelineSpec::new(spirv(), "main", &constants, &layout()));
    drop(lease);
    cache.unregister_device(&device).unwrap();
}
