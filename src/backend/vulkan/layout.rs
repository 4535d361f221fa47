//! A pipeline layout described by content: normalized when given, derived from the shader when
//! not, checked to cover what the shader uses, and digested so that no key depends on a handle.

use ash::vk;

use super::reflect::{self, Interface, PushConstants, Resource};
use super::spec::{Digest, invalid, sorted_unique};
use crate::Result;

/// One binding of a descriptor set layout. Every binding is visible to the compute stage only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorBinding {
    pub binding: u32,
    pub descriptor_type: vk::DescriptorType,
    pub count: u32,
}

/// The push-constant block `[offset, offset + size)` of the compute stage. Vulkan allows one
/// range per stage, so a compute layout has at most one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushConstantRange {
    pub offset: u32,
    pub size: u32,
}

/// A pipeline layout described by content. kcache creates (and caches per device) the
/// `VkDescriptorSetLayout`s and the `VkPipelineLayout` from it, so a key never depends on handle
/// values. A caller binding descriptor sets may use the layout handed back with the pipeline, or
/// its own layout created from the same description: Vulkan defines identically created layouts
/// as compatible.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayoutDesc {
    /// `sets[n]` is descriptor set `n`.
    pub sets: Vec<Vec<DescriptorBinding>>,
    pub push_constants: Option<PushConstantRange>,
}

/// The most descriptor sets a derived layout may have: more than any device binds
/// (`maxBoundDescriptorSets` is 32 at most on current drivers), few enough that a set number
/// read from a shader cannot make the layout huge.
const MAX_DERIVED_SETS: usize = 64;

const COMPUTE_DESCRIPTOR_TYPES: [vk::DescriptorType; 10] = [
    vk::DescriptorType::SAMPLER,
    vk::DescriptorType::COMBINED_IMAGE_SAMPLER,
    vk::DescriptorType::SAMPLED_IMAGE,
    vk::DescriptorType::STORAGE_IMAGE,
    vk::DescriptorType::UNIFORM_TEXEL_BUFFER,
    vk::DescriptorType::STORAGE_TEXEL_BUFFER,
    vk::DescriptorType::UNIFORM_BUFFER,
    vk::DescriptorType::STORAGE_BUFFER,
    vk::DescriptorType::UNIFORM_BUFFER_DYNAMIC,
    vk::DescriptorType::STORAGE_BUFFER_DYNAMIC,
];

pub(super) fn normalize_layout(layout: &LayoutDesc) -> Result<LayoutDesc> {
    let mut sets = Vec::with_capacity(layout.sets.len());
    for (n, set) in layout.sets.iter().enumerate() {
        let set = sorted_unique(
            set,
            |b| b.binding,
            |binding| format!("descriptor set {n} declares binding {binding} twice"),
        )?;
        if let Some(b) = set
            .iter()
            .find(|b| !COMPUTE_DESCRIPTOR_TYPES.contains(&b.descriptor_type))
        {
            return Err(invalid(format!(
                "descriptor set {n} binding {}: descriptor type {} is not usable from a compute shader",
                b.binding,
                b.descriptor_type.as_raw()
            )));
        }
        sets.push(set);
    }
    if let Some(pc) = layout.push_constants {
        if pc.size == 0 || pc.offset % 4 != 0 || pc.size % 4 != 0 {
            return Err(invalid(format!(
                "push-constant range offset {} size {} must be non-empty multiples of 4",
                pc.offset, pc.size
            )));
        }
        if pc.offset.checked_add(pc.size).is_none() {
            return Err(invalid("push-constant range overflows"));
        }
    }
    Ok(LayoutDesc {
        sets,
        push_constants: layout.push_constants,
    })
}

impl Resource {
    fn name(self) -> &'static str {
        match self {
            Resource::Sampler => "a sampler",
            Resource::SampledImage => "a sampled image",
            Resource::CombinedImageSampler => "a combined image sampler",
            Resource::StorageImage => "a storage image",
            Resource::Image => "an image",
            Resource::UniformTexelBuffer => "a uniform texel buffer",
            Resource::StorageTexelBuffer => "a storage texel buffer",
            Resource::UniformBuffer => "a uniform buffer",
            Resource::StorageBuffer => "a storage buffer",
            Resource::Other => "a resource",
        }
    }
}

/// Refuses a layout that does not cover what the shader uses: a pipeline created with it is
/// invalid, and drivers crash on some such pipelines rather than fail.
pub(super) fn check_covers(shader: &Interface, layout: &LayoutDesc) -> Result<()> {
    for used in &shader.bindings {
        let (set, binding) = (used.set, used.binding);
        let Some(desc) = layout
            .sets
            .get(set as usize)
            .and_then(|bindings| bindings.iter().find(|b| b.binding == binding))
        else {
            return Err(invalid(format!(
                "the shader uses descriptor set {set} binding {binding} ({}), which the layout \
                 does not describe",
                used.resource.name()
            )));
        };
        if !used.resource.accepts(desc.descriptor_type) {
            return Err(invalid(format!(
                "descriptor set {set} binding {binding} is {} in the shader; descriptor type {} \
                 cannot back it",
                used.resource.name(),
                desc.descriptor_type.as_raw()
            )));
        }
        if desc.count < used.count {
            return Err(invalid(format!(
                "descriptor set {set} binding {binding} is an array of {} in the shader; the \
                 layout gives {} descriptors",
                used.count, desc.count
            )));
        }
    }
    match (shader.push_constants, layout.push_constants) {
        (None, _) | (Some(PushConstants::Unsized), Some(_)) => Ok(()),
        (Some(_), None) => Err(invalid(
            "the shader uses push constants; the layout has no push-constant range",
        )),
        (Some(PushConstants::Bytes(first, end)), Some(range)) => {
            let range_end = range.offset.saturating_add(range.size);
            if range.offset <= first && end <= range_end {
                Ok(())
            } else {
                Err(invalid(format!(
                    "the shader's push constants occupy bytes {first}..{end}; the layout's \
                     push-constant range is {}..{range_end}",
                    range.offset
                )))
            }
        }
    }
}

/// The descriptor type a derived layout gives a resource the shader uses.
fn derived_type(used: &reflect::UsedBinding) -> Result<vk::DescriptorType> {
    use vk::DescriptorType as D;
    Ok(match used.resource {
        Resource::Sampler => D::SAMPLER,
        Resource::SampledImage => D::SAMPLED_IMAGE,
        Resource::CombinedImageSampler => D::COMBINED_IMAGE_SAMPLER,
        Resource::StorageImage => D::STORAGE_IMAGE,
        Resource::UniformTexelBuffer => D::UNIFORM_TEXEL_BUFFER,
        Resource::StorageTexelBuffer => D::STORAGE_TEXEL_BUFFER,
        Resource::UniformBuffer => D::UNIFORM_BUFFER,
        Resource::StorageBuffer => D::STORAGE_BUFFER,
        Resource::Image | Resource::Other => {
            return Err(invalid(format!(
                "descriptor set {} binding {} is {} whose descriptor type the shader does not \
                 decide; describe the layout",
                used.set,
                used.binding,
                used.resource.name()
            )));
        }
    })
}

/// The smallest layout that covers what the shader uses: each used binding with the
/// descriptor type its resource implies (never a dynamic one) and its array size, the sets up
/// to the highest one used (those in between empty), and a push-constant range over the
/// block's bytes, widened to multiples of 4.
pub(super) fn derive_layout(shader: &Interface) -> Result<LayoutDesc> {
    let set_count = shader.bindings.iter().map(|b| b.set as usize + 1).max();
    let set_count = set_count.unwrap_or(0);
    if set_count > MAX_DERIVED_SETS {
        return Err(invalid(format!(
            "the shader uses descriptor set {}, beyond the {MAX_DERIVED_SETS} sets a derived \
             layout may have; describe the layout",
            set_count - 1
        )));
    }
    let mut sets = vec![Vec::new(); set_count];
    for used in &shader.bindings {
        sets[used.set as usize].push(DescriptorBinding {
            binding: used.binding,
            descriptor_type: derived_type(used)?,
            count: used.count,
        });
    }
    let push_constants = match shader.push_constants {
        None => None,
        Some(PushConstants::Unsized) => {
            return Err(invalid(
                "the shader's push-constant block is sized by specialization constants; \
                 describe the layout",
            ));
        }
        Some(PushConstants::Bytes(first, end)) => {
            let offset = first & !3;
            let end = end
                .checked_add(3)
                .ok_or_else(|| invalid("push constants overflow"))?
                & !3;
            (end > offset).then_some(PushConstantRange {
                offset,
                size: end - offset,
            })
        }
    };
    Ok(LayoutDesc {
        sets,
        push_constants,
    })
}

pub(super) fn layout_digest(layout: &LayoutDesc) -> [u8; 32] {
    let mut d = Digest::new("kcache vulkan pipeline layout v1");
    d.u32(layout.sets.len() as u32);
    for set in &layout.sets {
        d.u32(set.len() as u32);
        for b in set {
            d.u32(b.binding)
                .u32(b.descriptor_type.as_raw() as u32)
                .u32(b.count);
        }
    }
    match layout.push_constants {
        Some(pc) => d.u32(1).u32(pc.offset).u32(pc.size),
        None => d.u32(0),
    };
    d.finish()
}
