//! Shared by the Vulkan tests and benchmark: a compute shader compiled at test time with
//! `glslangValidator`, its layout, and the expected result of a dispatch.

#![allow(dead_code)] // Each target uses a different subset.

use std::process::Command;
use std::sync::OnceLock;

use ash::vk;
use kcache::backend::vulkan::{
    DescriptorBinding, LayoutDesc, Pipeline, PipelineSpec, PushConstantRange, SpecConstant, Vulkan,
    VulkanCache, VulkanOptions, words_from_bytes,
};
use kcache_testkit::vulkan::TestGpu;

/// `data[i] = data[i] * MUL + add`, with `MUL` a specialization constant and `add` a push
/// constant, so that both reach the dispatch.
pub const SHADER: &str = r#"#version 450
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint MUL = 1;
layout(push_constant) uniform Push { uint add; } pc;
layout(std430, set = 0, binding = 0) buffer Data { uint v[]; } data;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < data.v.length()) {
        data.v[i] = data.v[i] * MUL + pc.add;
    }
}
"#;

pub const ELEMENTS: u32 = 256;

/// SPIR-V of [`SHADER`], compiled once per test binary.
pub fn spirv() -> &'static [u32] {
    static WORDS: OnceLock<Vec<u32>> = OnceLock::new();
    WORDS.get_or_init(|| compile(SHADER))
}

/// Compiles a GLSL compute shader to SPIR-V with `glslangValidator`, for Vulkan 1.0.
pub fn compile(glsl: &str) -> Vec<u32> {
    compile_for(glsl, "vulkan1.0")
}

/// Compiles a GLSL compute shader for the target environment `env` (`vulkan1.1`: SPIR-V 1.3,
/// which subgroup operations need).
pub fn compile_for(glsl: &str, env: &str) -> Vec<u32> {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("shader.comp");
    let out = dir.path().join("shader.spv");
    std::fs::write(&src, glsl).expect("write shader");
    let status = Command::new("glslangValidator")
        .args(["-V", "--target-env", env, "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("glslangValidator (package glslang-tools) must be installed");
    assert!(
        status.status.success(),
        "glslangValidator failed: {}",
        String::from_utf8_lossy(&status.stdout)
    );
    words_from_bytes(&std::fs::read(&out).expect("read SPIR-V")).expect("whole words")
}

pub fn layout() -> LayoutDesc {
    LayoutDesc {
        sets: vec![vec![DescriptorBinding {
            binding: 0,
            descriptor_type: vk::DescriptorType::STORAGE_BUFFER,
            count: 1,
        }]],
        push_constants: Some(PushConstantRange { offset: 0, size: 4 }),
    }
}

pub fn spec(mul: u32) -> PipelineSpec {
    PipelineSpec::new(spirv(), "main", &[SpecConstant::u32(0, mul)], &layout())
        .expect("valid pipeline description")
}

pub fn input() -> Vec<u32> {
    (0..ELEMENTS).collect()
}

pub fn expected(mul: u32, add: u32) -> Vec<u32> {
    (0..ELEMENTS).map(|i| i * mul + add).collect()
}

/// Runs `pipeline` on `gpu` over [`input`], with `add` as its push constant, and checks that
/// the validation layer reported nothing up to here.
pub fn dispatch(gpu: &TestGpu, pipeline: &Pipeline, add: u32) -> Vec<u32> {
    let out = gpu
        .dispatch(pipeline, &input(), &add.to_ne_bytes(), 4)
        .unwrap();
    assert_eq!(gpu.validation_messages(), Vec::<String>::new());
    out
}

pub fn vulkan() -> Vulkan {
    Vulkan::load().expect("the Vulkan loader (libvulkan1) and lavapipe (mesa-vulkan-drivers)")
}

/// A memory-only cache on `vulkan`.
pub fn cache(vulkan: Vulkan) -> VulkanCache {
    VulkanCache::new(VulkanOptions {
        vulkan: Some(vulkan),
        ..VulkanOptions::default()
    })
    .unwrap()
}
