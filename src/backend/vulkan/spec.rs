//! What a compute pipeline is made of, validated and digested once so that a cache hit costs a
//! hash-table probe and nothing proportional to the SPIR-V size.

use std::ffi::CString;

use ash::vk;

use super::layout::{LayoutDesc, check_covers, derive_layout, layout_digest, normalize_layout};
use super::reflect;
use super::spirv;
use crate::{Error, Result};

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

    /// The constants of a `VkSpecializationInfo`: each map entry's `size` bytes at its
    /// `offset` in `data`. An entry that reaches past `data` is an invalid argument; sizes and
    /// duplicate ids are checked by [`PipelineSpec::new`], as for constants given one by one.
    pub fn from_map_entries(
        entries: &[vk::SpecializationMapEntry],
        data: &[u8],
    ) -> Result<Vec<SpecConstant>> {
        entries
            .iter()
            .map(|e| {
                let start = e.offset as usize;
                let value = start
                    .checked_add(e.size)
                    .and_then(|end| data.get(start..end))
                    .ok_or_else(|| {
                        invalid(format!(
                            "specialization map entry for constant {} (offset {}, size {}) \
                             reaches past the {} bytes of data",
                            e.constant_id,
                            e.offset,
                            e.size,
                            data.len()
                        ))
                    })?;
                Ok(SpecConstant {
                    id: e.constant_id,
                    value: value.to_vec(),
                })
            })
            .collect()
    }
}

/// Everything a compute pipeline is made of, as [`PipelineSpec::from_desc`] takes it. Start
/// from [`PipelineDesc::new`] and set what the pipeline needs.
#[derive(Debug, Clone, Copy)]
pub struct PipelineDesc<'a> {
    pub spirv: &'a [u32],
    pub entry_point: &'a str,
    pub specialization: &'a [SpecConstant],
    /// `None`: the layout is derived from the bindings and push constants the entry point
    /// uses (see [`PipelineSpec::from_desc`]).
    pub layout: Option<&'a LayoutDesc>,
    /// `VkComputePipelineCreateInfo::flags`: one of [`ALLOWED_PIPELINE_FLAGS`].
    pub flags: vk::PipelineCreateFlags,
    /// `VkPipelineShaderStageRequiredSubgroupSizeCreateInfo::requiredSubgroupSize`: a power of
    /// two the device supports for compute (`VK_EXT_subgroup_size_control`, core in 1.3), with
    /// the `subgroupSizeControl` feature enabled on the device by its creator.
    pub required_subgroup_size: Option<u32>,
}

impl<'a> PipelineDesc<'a> {
    /// No specialization, a layout derived from the shader, no flags.
    pub fn new(spirv: &'a [u32], entry_point: &'a str) -> Self {
        Self {
            spirv,
            entry_point,
            specialization: &[],
            layout: None,
            flags: vk::PipelineCreateFlags::empty(),
            required_subgroup_size: None,
        }
    }
}

/// The pipeline-creation flags a cached compute pipeline may carry. `DERIVATIVE` is not among
/// them (a cached pipeline cannot name a base pipeline), nor are flags of other pipeline kinds
/// or of extensions that change what the layout means (descriptor buffers).
pub const ALLOWED_PIPELINE_FLAGS: vk::PipelineCreateFlags = vk::PipelineCreateFlags::from_raw(
    vk::PipelineCreateFlags::DISABLE_OPTIMIZATION.as_raw()
        | vk::PipelineCreateFlags::ALLOW_DERIVATIVES.as_raw()
        | vk::PipelineCreateFlags::DISPATCH_BASE.as_raw()
        | vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR.as_raw()
        | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR.as_raw()
        | vk::PipelineCreateFlags::FAIL_ON_PIPELINE_COMPILE_REQUIRED.as_raw()
        | vk::PipelineCreateFlags::EARLY_RETURN_ON_FAILURE.as_raw(),
);

/// Vulkan's largest subgroup size (`maxSubgroupSize` is at most 128).
const MAX_SUBGROUP_SIZE: u32 = 128;

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
    pub(crate) flags: vk::PipelineCreateFlags,
    pub(crate) required_subgroup_size: Option<u32>,
    pub(crate) digest: [u8; 32],
    pub(crate) layout_digest: [u8; 32],
}

pub(super) fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// Writes fields with their lengths so that no two different descriptions share an encoding.
pub(super) struct Digest(blake3::Hasher);

impl Digest {
    pub(super) fn new(context: &str) -> Self {
        Self(blake3::Hasher::new_derive_key(context))
    }
    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.update(&v.to_le_bytes());
        self
    }
    pub(super) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.update(&(b.len() as u64).to_le_bytes());
        self.0.update(b);
        self
    }
    pub(super) fn finish(&self) -> [u8; 32] {
        *self.0.finalize().as_bytes()
    }
}

/// A sorted copy of `items`, so that the digest does not depend on the caller's order; two
/// items with the same `key` are an invalid argument, described by `twice`.
pub(super) fn sorted_unique<T: Clone>(
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

fn check_create_settings(flags: vk::PipelineCreateFlags, subgroup: Option<u32>) -> Result<()> {
    let unknown = flags & !ALLOWED_PIPELINE_FLAGS;
    if !unknown.is_empty() {
        return Err(invalid(format!(
            "pipeline creation flags {:#x} are not supported for cached compute pipelines \
             (allowed: {:#x})",
            unknown.as_raw(),
            ALLOWED_PIPELINE_FLAGS.as_raw()
        )));
    }
    match subgroup {
        Some(size) if !size.is_power_of_two() || size > MAX_SUBGROUP_SIZE => Err(invalid(format!(
            "required subgroup size {size} is not a power of two up to {MAX_SUBGROUP_SIZE}"
        ))),
        _ => Ok(()),
    }
}

impl std::fmt::Debug for PipelineSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineSpec")
            .field("spirv_words", &self.spirv.len())
            .field("entry_point", &self.entry_point)
            .field("specialization", &self.specialization)
            .field("layout", &self.layout)
            .field("flags", &self.flags)
            .field("required_subgroup_size", &self.required_subgroup_size)
            .field("digest", &crate::key::Key::from_bytes(self.digest))
            .finish()
    }
}

impl PipelineSpec {
    /// [`PipelineSpec::from_desc`] with the layout given, no flags and no required subgroup
    /// size.
    pub fn new(
        spirv: &[u32],
        entry_point: &str,
        specialization: &[SpecConstant],
        layout: &LayoutDesc,
    ) -> Result<Self> {
        Self::from_desc(&PipelineDesc {
            specialization,
            layout: Some(layout),
            ..PipelineDesc::new(spirv, entry_point)
        })
    }

    /// Validates every part (SPIR-V header and bounds, a `GLCompute` entry point of that name,
    /// unique specialization ids with 1/2/4/8-byte values, a compute-usable layout that covers
    /// every descriptor binding and push-constant byte the entry point uses) and digests the
    /// normalized content. Errors are [`Error::InvalidArgument`]; the layout may describe more
    /// than the shader uses. Without a layout, the layout is derived from the shader: each
    /// binding it uses with the descriptor type its resource implies (a storage buffer, a
    /// uniform buffer, a storage image, …; an image whose use the shader leaves open, or an
    /// unknown resource kind, must be described), and a push-constant range over the bytes it
    /// reads. Flags outside [`ALLOWED_PIPELINE_FLAGS`] and a required subgroup size that is not
    /// a power of two up to 128 are refused here; whether the device supports that size is
    /// checked by [`VulkanCache::find_or_build`](super::VulkanCache::find_or_build). Flags and
    /// subgroup size are part of the digest.
    pub fn from_desc(desc: &PipelineDesc<'_>) -> Result<Self> {
        let PipelineDesc {
            spirv,
            entry_point,
            specialization,
            layout,
            flags,
            required_subgroup_size,
        } = *desc;
        spirv::validate(spirv, entry_point)?;
        check_create_settings(flags, required_subgroup_size)?;
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
        let shader = reflect::interface(spirv, entry_point)?;
        let layout = match layout {
            Some(layout) => normalize_layout(layout)?,
            None => derive_layout(&shader)?,
        };
        check_covers(&shader, &layout)?;
        let layout_digest = layout_digest(&layout);

        let mut d = Digest::new("kcache vulkan compute pipeline v1");
        let words: Vec<u8> = spirv.iter().flat_map(|w| w.to_le_bytes()).collect();
        d.bytes(&words).bytes(entry_point.as_bytes());
        d.u32(spec.len() as u32);
        for c in &spec {
            d.u32(c.id).bytes(&c.value);
        }
        d.bytes(&layout_digest);
        d.u32(flags.as_raw())
            .u32(required_subgroup_size.unwrap_or(0));
        Ok(Self {
            spirv: spirv.to_vec(),
            entry_point: entry,
            specialization: spec,
            layout,
            flags,
            required_subgroup_size,
            digest: d.finish(),
            layout_digest,
        })
    }

    /// The content digest: equal for equal descriptions, independent of any handle.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The layout given, normalized (bindings sorted), or the one derived from the shader.
    pub fn layout(&self) -> &LayoutDesc {
        &self.layout
    }

    pub fn flags(&self) -> vk::PipelineCreateFlags {
        self.flags
    }

    pub fn required_subgroup_size(&self) -> Option<u32> {
        self.required_subgroup_size
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::{DescriptorBinding, PushConstantRange};
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
