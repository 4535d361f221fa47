//! What a compute pipeline is made of, validated and digested once so that a cache hit costs a
//! hash-table probe and nothing proportional to the SPIR-V size.

use std::ffi::CString;

use ash::vk;

use super::reflect::{self, Interface, PushConstants, Resource};
use super::spirv;
use crate::{Error, Result};

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

/// A specialization constant: `constant_id` and the value's bytes (4 for `bool`/`int`/`uint`/
/// `float`, 8 for 64-bit types, 2 or 1 for the small integer types).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConstant {
    pub id: u32,
    pub value: Vec<u8>,
}

impl SpecConstant {
    pub fn u32(id: u32, value: u32) -> Self {
        Self {
            id,
            value: value.to_ne_bytes().to_vec(),
        }
    }
}

/// A validated compute pipeline description with its content digest. Build it once per kernel
/// and reuse it for every lookup.
#[derive(Clone)]
pub struct PipelineSpec {
    pub(crate) spirv: Vec<u32>,
    pub(crate) entry_point: CString,
    /// Sorted by id, unique.
    pub(crate) specialization: Vec<SpecConstant>,
    /// Bindings sorted by binding number within each set.
    pub(crate) layout: LayoutDesc,
    pub(crate) digest: [u8; 32],
    pub(crate) layout_digest: [u8; 32],
}

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

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// Writes fields with their lengths so that no two different descriptions share an encoding.
struct Digest(blake3::Hasher);

impl Digest {
    fn new(context: &str) -> Self {
        Self(blake3::Hasher::new_derive_key(context))
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.update(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.update(&(b.len() as u64).to_le_bytes());
        self.0.update(b);
        self
    }
    fn finish(&self) -> [u8; 32] {
        *self.0.finalize().as_bytes()
    }
}

/// A sorted copy of `items`, so that the digest does not depend on the caller's order; two
/// items with the same `key` are an invalid argument, described by `twice`.
fn sorted_unique<T: Clone>(
    items: &[T],
    key: impl Fn(&T) -> u32,
    twice: impl FnOnce(u32) -> String,
) -> Result<Vec<T>> {
    let mut sorted = items.to_vec();
    sorted.sort_by_key(&key);
    match sorted
        .windows(2)
        .find(|pair| key(&pair[0]) == key(&pair[1]))
    {
        Some(pair) => Err(invalid(twice(key(&pair[0])))),
        None => Ok(sorted),
    }
}

fn normalize_layout(layout: &LayoutDesc) -> Result<LayoutDesc> {
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
fn check_covers(shader: &Interface, layout: &LayoutDesc) -> Result<()> {
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

fn layout_digest(layout: &LayoutDesc) -> [u8; 32] {
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

impl std::fmt::Debug for PipelineSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineSpec")
            .field("spirv_words", &self.spirv.len())
            .field("entry_point", &self.entry_point)
            .field("specialization", &self.specialization)
            .field("layout", &self.layout)
            .field("digest", &crate::key::Key::from_bytes(self.digest))
            .finish()
    }
}

impl PipelineSpec {
    /// Validates every part (SPIR-V header and bounds, a `GLCompute` entry point of that name,
    /// unique specialization ids with 1/2/4/8-byte values, a compute-usable layout that covers
    /// every descriptor binding and push-constant byte the entry point uses) and digests the
    /// normalized content. Errors are [`Error::InvalidArgument`]; the layout may describe more
    /// than the shader uses.
    pub fn new(
        spirv: &[u32],
        entry_point: &str,
        specialization: &[SpecConstant],
        layout: &LayoutDesc,
    ) -> Result<Self> {
        spirv::validate(spirv, entry_point)?;
        let entry = CString::new(entry_point)
            .map_err(|_| invalid("entry point name contains a NUL byte"))?;
        let spec = sorted_unique(
            specialization,
            |c| c.id,
            |id| format!("specialization constant {id} given twice"),
        )?;
        if let Some(c) = spec.iter().find(|c| ![1, 2, 4, 8].contains(&c.value.len())) {
            return Err(invalid(format!(
                "specialization constant {} has {} bytes; expected 1, 2, 4 or 8",
                c.id,
                c.value.len()
            )));
        }
        let layout = normalize_layout(layout)?;
        check_covers(&reflect::interface(spirv, entry_point)?, &layout)?;
        let layout_digest = layout_digest(&layout);

        let mut d = Digest::new("kcache vulkan compute pipeline v1");
        let words: Vec<u8> = spirv.iter().flat_map(|w| w.to_le_bytes()).collect();
        d.bytes(&words).bytes(entry_point.as_bytes());
        d.u32(spec.len() as u32);
        for c in &spec {
            d.u32(c.id).bytes(&c.value);
        }
        d.bytes(&layout_digest);
        Ok(Self {
            spirv: spirv.to_vec(),
            entry_point: entry,
            specialization: spec,
            layout,
            digest: d.finish(),
            layout_digest,
        })
    }

    /// The content digest: equal for equal descriptions, independent of any handle.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    pub fn layout(&self) -> &LayoutDesc {
        &self.layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module() -> Vec<u32> {
        let name = u32::from_le_bytes(*b"main");
        vec![
            spirv::MAGIC,
            0x0001_0000,
            0,
            2,
            0,
            (5 << 16) | 15,
            5,
            1,
            name,
            0,
        ]
    }

    fn binding(binding: u32) -> DescriptorBinding {
        DescriptorBinding {
            binding,
            descriptor_type: vk::DescriptorType::STORAGE_BUFFER,
            count: 1,
        }
    }

    #[test]
    fn digest_ignores_order_and_sees_every_field() {
        let layout = LayoutDesc {
            sets: vec![vec![binding(0), binding(1)]],
            push_constants: Some(PushConstantRange { offset: 0, size: 4 }),
        };
        let reordered = LayoutDesc {
            sets: vec![vec![binding(1), binding(0)]],
            ..layout.clone()
        };
        let spec = [SpecConstant::u32(0, 3), SpecConstant::u32(1, 4)];
        let spec_rev = [SpecConstant::u32(1, 4), SpecConstant::u32(0, 3)];
        let a = PipelineSpec::new(&module(), "main", &spec, &layout).unwrap();
        let b = PipelineSpec::new(&module(), "main", &spec_rev, &reordered).unwrap();
        assert_eq!(a.digest(), b.digest());

        let other_value = [SpecConstant::u32(0, 3), SpecConstant::u32(1, 5)];
        let c = PipelineSpec::new(&module(), "main", &other_value, &layout).unwrap();
        assert_ne!(a.digest(), c.digest());
        let no_push = LayoutDesc {
            push_constants: None,
            ..layout.clone()
        };
        let d = PipelineSpec::new(&module(), "main", &spec, &no_push).unwrap();
        assert_ne!(a.digest(), d.digest());
        assert_ne!(a.layout_digest, d.layout_digest);
    }

    #[test]
    fn rejects_inconsistent_descriptions() {
        let m = module();
        let dup = LayoutDesc {
            sets: vec![vec![binding(2), binding(2)]],
            push_constants: None,
        };
        assert!(PipelineSpec::new(&m, "main", &[], &dup).is_err());
        let spec = [SpecConstant::u32(0, 1), SpecConstant::u32(0, 2)];
        assert!(PipelineSpec::new(&m, "main", &spec, &LayoutDesc::default()).is_err());
        let odd = [SpecConstant {
            id: 0,
            value: vec![0; 3],
        }];
        assert!(PipelineSpec::new(&m, "main", &odd, &LayoutDesc::default()).is_err());
        let pc = LayoutDesc {
            sets: vec![],
            push_constants: Some(PushConstantRange { offset: 2, size: 4 }),
        };
        assert!(PipelineSpec::new(&m, "main", &[], &pc).is_err());
        let input_attachment = LayoutDesc {
            sets: vec![vec![DescriptorBinding {
                descriptor_type: vk::DescriptorType::INPUT_ATTACHMENT,
                ..binding(0)
            }]],
            push_constants: None,
        };
        assert!(PipelineSpec::new(&m, "main", &[], &input_attachment).is_err());
        assert!(PipelineSpec::new(&m, "ma\0in", &[], &LayoutDesc::default()).is_err());
    }
}
