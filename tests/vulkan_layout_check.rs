//! A pipeline description whose layout does not cover what its shader uses is refused before
//! any driver sees it: lavapipe crashes in vkCreateComputePipelines on some such pipelines
//! (a storage buffer with no binding in the layout). Layouts that cover the shader, including
//! ones that describe more than it uses, still build and run on lavapipe. A description with
//! no layout gets the one the shader implies.

mod vulkan_common;

use std::sync::Arc;

use ash::vk;
use kcache::Error;
use kcache::backend::vulkan::{
    DescriptorBinding, LayoutDesc, PipelineDesc, PipelineSpec, PushConstantRange, SpecConstant,
};
use kcache_testkit::vulkan::{TestGpu, glslang};
use vulkan_common::{cache, compile, dispatch, expected, layout, spirv, vulkan};

fn binding(binding: u32, descriptor_type: vk::DescriptorType, count: u32) -> DescriptorBinding {
    DescriptorBinding {
        binding,
        descriptor_type,
        count,
    }
}

fn storage(binding_number: u32) -> DescriptorBinding {
    binding(binding_number, vk::DescriptorType::STORAGE_BUFFER, 1)
}

fn push(offset: u32, size: u32) -> Option<PushConstantRange> {
    Some(PushConstantRange { offset, size })
}

/// The reason a description is refused; panics if it is accepted.
fn refused(words: &[u32], layout: &LayoutDesc) -> String {
    match PipelineSpec::new(words, "main", &[SpecConstant::u32(0, 2)], layout) {
        Err(Error::InvalidArgument(message)) => message,
        Err(e) => panic!("expected InvalidArgument, got {e:?}"),
        Ok(_) => panic!("a layout that does not cover the shader was accepted: {layout:?}"),
    }
}

fn accepted(words: &[u32], layout: &LayoutDesc) -> PipelineSpec {
    PipelineSpec::new(words, "main", &[SpecConstant::u32(0, 2)], layout)
        .unwrap_or_else(|e| panic!("a layout that covers the shader was refused: {e}"))
}

#[test]
fn the_description_that_crashed_lavapipe_is_refused() {
    let Some(_) = glslang() else {
        return;
    };
    // The shader writes a storage buffer at set 0 binding 0; the layout has no binding.
    let no_bindings = LayoutDesc {
        sets: vec![],
        push_constants: push(0, 4),
    };
    let message = refused(spirv(), &no_bindings);
    assert!(message.contains("set 0 binding 0"), "{message}");
    assert!(message.contains("storage buffer"), "{message}");
    let empty_set = LayoutDesc {
        sets: vec![vec![]],
        push_constants: push(0, 4),
    };
    refused(spirv(), &empty_set);
    let other_binding = LayoutDesc {
        sets: vec![vec![storage(1)]],
        push_constants: push(0, 4),
    };
    refused(spirv(), &other_binding);
    let other_set = LayoutDesc {
        sets: vec![vec![], vec![storage(0)]],
        push_constants: push(0, 4),
    };
    refused(spirv(), &other_set);
}

#[test]
fn a_wrong_descriptor_type_is_refused() {
    let Some(_) = glslang() else {
        return;
    };
    for wrong in [
        vk::DescriptorType::UNIFORM_BUFFER,
        vk::DescriptorType::STORAGE_IMAGE,
        vk::DescriptorType::STORAGE_TEXEL_BUFFER,
    ] {
        let layout = LayoutDesc {
            sets: vec![vec![binding(0, wrong, 1)]],
            push_constants: push(0, 4),
        };
        let message = refused(spirv(), &layout);
        assert!(message.contains("cannot back it"), "{message}");
    }
    let dynamic = LayoutDesc {
        sets: vec![vec![binding(
            0,
            vk::DescriptorType::STORAGE_BUFFER_DYNAMIC,
            1,
        )]],
        push_constants: push(0, 4),
    };
    accepted(spirv(), &dynamic);
}

#[test]
fn push_constants_must_be_covered() {
    let Some(_) = glslang() else {
        return;
    };
    let none = LayoutDesc {
        push_constants: None,
        ..layout()
    };
    let message = refused(spirv(), &none);
    assert!(message.contains("push"), "{message}");

    let wide = compile(
        r#"#version 450
layout(local_size_x = 1) in;
layout(push_constant) uniform Push { uint a; layout(offset = 16) uvec2 b; } pc;
layout(std430, set = 0, binding = 0) buffer Data { uint v[]; } data;
void main() { data.v[0] = pc.a + pc.b.y; }
"#,
    );
    // The block spans bytes 0..24: offset 16 plus a uvec2.
    for short in [push(0, 4), push(0, 20), push(4, 20)] {
        let layout = LayoutDesc {
            sets: vec![vec![storage(0)]],
            push_constants: short,
        };
        let message = refused(&wide, &layout);
        assert!(message.contains("0..24"), "{message}");
    }
    accepted(
        &wide,
        &LayoutDesc {
            sets: vec![vec![storage(0)]],
            push_constants: push(0, 24),
        },
    );
}

#[test]
fn arrays_need_as_many_descriptors() {
    let Some(_) = glslang() else {
        return;
    };
    let words = compile(
        r#"#version 450
layout(local_size_x = 1) in;
layout(std430, set = 0, binding = 3) buffer Data { uint v[]; } bufs[3];
void main() { bufs[2].v[0] = bufs[0].v[0] + bufs[1].v[0]; }
"#,
    );
    let with = |count| LayoutDesc {
        sets: vec![vec![binding(3, vk::DescriptorType::STORAGE_BUFFER, count)]],
        push_constants: None,
    };
    let message = refused(&words, &with(2));
    assert!(message.contains("array of 3"), "{message}");
    accepted(&words, &with(3));
    accepted(&words, &with(4));
}

#[test]
fn image_sampler_and_uniform_kinds_are_told_apart() {
    let Some(_) = glslang() else {
        return;
    };
    let words = compile(
        r#"#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) uniform sampler2D tex;
layout(set = 0, binding = 1, rgba8) uniform writeonly image2D img;
layout(set = 1, binding = 0) uniform Params { vec4 scale; } params;
layout(set = 1, binding = 1) uniform samplerBuffer texels;
void main() {
    imageStore(img, ivec2(0), texture(tex, vec2(0.5)) * params.scale + texelFetch(texels, 0));
}
"#,
    );
    use vk::DescriptorType as D;
    let right = [
        D::COMBINED_IMAGE_SAMPLER,
        D::STORAGE_IMAGE,
        D::UNIFORM_BUFFER,
        D::UNIFORM_TEXEL_BUFFER,
    ];
    let build = |types: [D; 4]| LayoutDesc {
        sets: vec![
            vec![binding(0, types[0], 1), binding(1, types[1], 1)],
            vec![binding(0, types[2], 1), binding(1, types[3], 1)],
        ],
        push_constants: None,
    };
    accepted(&words, &build(right));
    let wrong = [
        D::SAMPLED_IMAGE,
        D::SAMPLED_IMAGE,
        D::STORAGE_BUFFER,
        D::STORAGE_TEXEL_BUFFER,
    ];
    for i in 0..4 {
        let mut types = right;
        types[i] = wrong[i];
        let message = refused(&words, &build(types));
        assert!(message.contains("cannot back it"), "slot {i}: {message}");
    }
}

#[test]
fn layouts_that_cover_the_shader_build_and_run_on_lavapipe() {
    let vulkan = vulkan();
    let Some(gpu) = TestGpu::for_test() else {
        return;
    };
    let gpu = Arc::new(gpu);
    let cache = cache(vulkan);
    let device = cache.register_owned_device(gpu.clone()).unwrap();

    // A binding only a function the entry point never calls uses is not required.
    let words = compile(
        r#"#version 450
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint MUL = 1;
layout(push_constant) uniform Push { uint add; } pc;
layout(std430, set = 0, binding = 0) buffer Data { uint v[]; } data;
layout(std430, set = 0, binding = 1) buffer Unused { uint v[]; } unused;
void never_called() { unused.v[0] = 1u; }
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < data.v.length()) {
        data.v[i] = data.v[i] * MUL + pc.add;
    }
}
"#,
    );
    let spec = accepted(&words, &layout());
    let lease = cache.find_or_build(&device, &spec).unwrap();
    let out = dispatch(&gpu, &lease, 5);
    assert_eq!(out, expected(2, 5));

    // A layout that describes more than the shader uses (an extra set, a wider push-constant
    // range) is compatible too.
    let wider = LayoutDesc {
        sets: vec![vec![storage(0)], vec![storage(0), storage(1)]],
        push_constants: push(0, 16),
    };
    let spec = accepted(spirv(), &wider);
    let lease = cache.find_or_build(&device, &spec).unwrap();
    let out = dispatch(&gpu, &lease, 3);
    assert_eq!(out, expected(2, 3));
    drop(lease);
    cache.unregister_device(&device).unwrap();
}

/// The spec of `words` with no layout: the one derived from the shader.
fn derived(words: &[u32]) -> kcache::Result<PipelineSpec> {
    PipelineSpec::from_desc(&PipelineDesc {
        specialization: &[SpecConstant::u32(0, 2)],
        ..PipelineDesc::new(words, "main")
    })
}

#[test]
fn a_missing_layout_is_derived_from_the_shader() {
    let Some(_) = glslang() else {
        return;
    };
    // The test shader's storage buffer and 4-byte push constant: the derived layout is the
    // one the other tests describe by hand, so both share a key.
    let spec = derived(spirv()).unwrap();
    assert_eq!(spec.layout(), &layout());
    assert_eq!(spec.digest(), accepted(spirv(), &layout()).digest());

    let words = compile(
        r#"#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) uniform sampler2D tex;
layout(set = 0, binding = 1, rgba8) uniform writeonly image2D img[3];
layout(set = 2, binding = 4) uniform Params { vec4 scale; } params;
layout(set = 2, binding = 1) uniform samplerBuffer texels;
layout(push_constant) uniform Push { layout(offset = 8) uint a; uint b; } pc;
void main() {
    vec4 v = texture(tex, vec2(0.5)) * params.scale + texelFetch(texels, int(pc.b));
    imageStore(img[pc.a], ivec2(0), v);
}
"#,
    );
    use vk::DescriptorType as D;
    let expected = LayoutDesc {
        sets: vec![
            vec![
                binding(0, D::COMBINED_IMAGE_SAMPLER, 1),
                binding(1, D::STORAGE_IMAGE, 3),
            ],
            vec![],
            vec![
                binding(1, D::UNIFORM_TEXEL_BUFFER, 1),
                binding(4, D::UNIFORM_BUFFER, 1),
            ],
        ],
        push_constants: push(8, 8),
    };
    assert_eq!(derived(&words).unwrap().layout(), &expected);
}

#[test]
fn a_layout_the_shader_does_not_decide_must_be_described() {
    let Some(_) = glslang() else {
        return;
    };
    // A push-constant block sized by a specialization constant: its range is the caller's.
    let words = compile(
        r#"#version 450
layout(local_size_x = 1) in;
layout(constant_id = 1) const int N = 4;
layout(push_constant) uniform Push { uint v[N]; } pc;
layout(std430, set = 0, binding = 0) buffer Data { uint v[]; } data;
void main() { data.v[0] = pc.v[N - 1]; }
"#,
    );
    let message = match derived(&words) {
        Err(Error::InvalidArgument(message)) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert!(message.contains("describe the layout"), "{message}");
    let described = LayoutDesc {
        sets: vec![vec![storage(0)]],
        push_constants: push(0, 16),
    };
    accepted(&words, &described);

    // A set number no device binds (glslang refuses to write one, so the decoration is
    // patched) would make a derived layout of 101 sets.
    let mut far = compile(
        r#"#version 450
layout(local_size_x = 1) in;
layout(std430, set = 7, binding = 0) buffer Data { uint v[]; } data;
void main() { data.v[0] = 1u; }
"#,
    );
    const OP_DECORATE_4_WORDS: u32 = (4 << 16) | 71;
    const DESCRIPTOR_SET: u32 = 34;
    let at = far
        .windows(4)
        .position(|w| w[0] == OP_DECORATE_4_WORDS && w[2] == DESCRIPTOR_SET && w[3] == 7)
        .expect("the DescriptorSet decoration");
    far[at + 3] = 100;
    let message = match derived(&far) {
        Err(Error::InvalidArgument(message)) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert!(message.contains("set 100"), "{message}");
}

#[test]
fn a_derived_layout_builds_and_dispatches_under_validation() {
    let Some(gpu) = TestGpu::for_test() else {
        return;
    };
    let gpu = Arc::new(gpu);
    let cache = cache(vulkan());
    let device = cache.register_owned_device(gpu.clone()).unwrap();
    let spec = derived(spirv()).unwrap();
    let lease = cache.find_or_build(&device, &spec).unwrap();
    assert_eq!(dispatch(&gpu, &lease, 4), expected(2, 4));
    // The hand-written equivalent is the same pipeline.
    let described = cache
        .find_or_build(&device, &accepted(spirv(), &layout()))
        .unwrap();
    assert_eq!(described.value().pipeline(), lease.value().pipeline());
    assert_eq!(cache.stats().pipelines_created, 1);
    drop((lease, described));
    cache.unregister_device(&device).unwrap();
}
