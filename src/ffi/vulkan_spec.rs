//! Vulkan pipeline descriptions through the C ABI: `kc_vulkan_pipeline_desc` and the structs
//! it points to, validated and digested into a `kc_vulkan_spec` that
//! `kc_vulkan_cache_find_or_build` (`vulkan.rs`) looks up.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};
use std::ptr;

use ash::vk;

use super::args::{GrownInput, c_str, elements, free_boxed, new_from_input};
use super::status::{byte_slice, guard_value, kc_status};
use crate::backend::vulkan::{
    DescriptorBinding, LayoutDesc, PipelineDesc, PipelineSpec, PushConstantRange, SpecConstant,
    words_from_bytes,
};
use crate::error::Error;

/// A validated pipeline description with its digest: make it once per kernel
/// (`kc_vulkan_spec_new`) and look it up as often as needed.
pub struct kc_vulkan_spec {
    pub(super) inner: PipelineSpec,
}

/// One descriptor binding of the pipeline layout, visible to the compute stage.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_vulkan_binding {
    /// Descriptor set index, below 64.
    pub set: u32,
    pub binding: u32,
    /// A `VkDescriptorType` value usable from a compute shader.
    pub descriptor_type: i32,
    /// Descriptor count (array size).
    pub count: u32,
}

/// A specialization constant: `size` bytes (1, 2, 4 or 8) at `data` for `constant_id` `id`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_vulkan_spec_constant {
    pub id: u32,
    pub size: u32,
    pub data: *const c_void,
}

/// One constant of a `kc_vulkan_specialization_info`: the same layout as
/// `VkSpecializationMapEntry`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_vulkan_spec_map_entry {
    pub constant_id: u32,
    /// Byte offset of the value in `data`.
    pub offset: u32,
    /// Bytes of the value: 1, 2, 4 or 8.
    pub size: usize,
}

/// Specialization constants as Vulkan has them: the same layout as `VkSpecializationInfo`, so
/// a program's `const VkSpecializationInfo *` can be passed cast to this type.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_vulkan_specialization_info {
    pub map_entry_count: u32,
    pub map_entries: *const kc_vulkan_spec_map_entry,
    pub data_size: usize,
    pub data: *const c_void,
}

/// Everything a compute pipeline is made of. The layout is described by content: kcache
/// creates the descriptor-set layouts and the pipeline layout (one per device and
/// description), so a lookup never depends on handle values. A layout the caller creates
/// from the same description is compatible with it for binding descriptor sets.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_vulkan_pipeline_desc {
    pub struct_size: usize,
    /// SPIR-V, as for `VkShaderModuleCreateInfo`: `code_size` is in bytes, a multiple of 4.
    pub code: *const u32,
    pub code_size: usize,
    /// The compute entry point; NULL means "main".
    pub entry_point: *const c_char,
    pub constants: *const kc_vulkan_spec_constant,
    pub constant_count: usize,
    /// Bindings of all sets; the layout has `max(set) + 1` sets. No bindings and no push-constant
    /// range: the layout is derived from what the entry point uses.
    pub bindings: *const kc_vulkan_binding,
    pub binding_count: usize,
    /// The compute push-constant range; `push_constant_size` 0 means none.
    pub push_constant_offset: u32,
    pub push_constant_size: u32,
    /// Since ABI 2.3. Specialization constants in `VkSpecializationInfo` form, in addition to
    /// `constants` (an id given in both is `KC_ERR_INVALID_ARGUMENT`); NULL: none.
    pub specialization: *const kc_vulkan_specialization_info,
    /// Since ABI 2.3. `VkPipelineCreateFlags`, part of the key; the bits allowed are listed in
    /// `docs/vulkan.md`, any other is `KC_ERR_INVALID_ARGUMENT`.
    pub flags: u32,
    /// Since ABI 2.3. The subgroup size the compute stage requires, part of the key; 0: none. One
    /// the device cannot require is `KC_ERR_INVALID_ARGUMENT` at lookup.
    pub required_subgroup_size: u32,
}

// SAFETY: every field is an integer or a raw pointer.
unsafe impl GrownInput for kc_vulkan_pipeline_desc {
    const C_NAME: &str = "kc_vulkan_pipeline_desc";
    /// The first layout ended with `push_constant_size`.
    const MIN_SIZE: usize = offset_of!(kc_vulkan_pipeline_desc, specialization);
    const BOOLS: &[usize] = &[];
    const DEFAULT: kc_vulkan_pipeline_desc = kc_vulkan_pipeline_desc {
        struct_size: size_of::<kc_vulkan_pipeline_desc>(),
        code: ptr::null(),
        code_size: 0,
        entry_point: ptr::null(),
        constants: ptr::null(),
        constant_count: 0,
        bindings: ptr::null(),
        binding_count: 0,
        push_constant_offset: 0,
        push_constant_size: 0,
        specialization: ptr::null(),
        flags: 0,
        required_subgroup_size: 0,
    };
}
/// The highest descriptor set number a binding may name, plus one: more sets than any device
/// binds (`maxBoundDescriptorSets` is 32 at most on current drivers), few enough that the
/// layout, which has `max(set) + 1` sets, stays small whatever number a caller passes.
const MAX_SETS: u32 = 64;

/// The layout a description gives; `None` (derive it) when it gives no binding and no
/// push-constant range. A set number of [`MAX_SETS`] or more is refused before any set is
/// allocated.
fn layout_of(
    bindings: &[kc_vulkan_binding],
    offset: u32,
    size: u32,
) -> Result<Option<LayoutDesc>, Error> {
    if bindings.is_empty() && size == 0 {
        return Ok(None);
    }
    if let Some(b) = bindings.iter().find(|b| b.set >= MAX_SETS) {
        return Err(Error::InvalidArgument(format!(
            "binding {} names descriptor set {}; sets are numbered below {MAX_SETS}",
            b.binding, b.set
        )));
    }
    let set_count = bindings
        .iter()
        .map(|b| b.set as usize + 1)
        .max()
        .unwrap_or(0);
    let mut sets = vec![Vec::new(); set_count];
    for b in bindings {
        sets[b.set as usize].push(DescriptorBinding {
            binding: b.binding,
            descriptor_type: vk::DescriptorType::from_raw(b.descriptor_type),
            count: b.count,
        });
    }
    Ok(Some(LayoutDesc {
        sets,
        push_constants: (size != 0).then_some(PushConstantRange { offset, size }),
    }))
}

/// The constants of a `kc_vulkan_specialization_info`, NULL being none.
///
/// # Safety
/// `info` must be NULL or point to a struct whose pointers are valid for its counts and sizes.
unsafe fn specialization_of(
    info: *const kc_vulkan_specialization_info,
) -> Result<Vec<SpecConstant>, Error> {
    if info.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: a non-NULL `info` points to a readable struct by contract.
    let info = unsafe { info.read_unaligned() };
    // SAFETY: `map_entry_count` elements at `map_entries` by contract.
    let entries = unsafe {
        elements(
            info.map_entries,
            info.map_entry_count as usize,
            "specialization->map_entries",
        )
    }?;
    // SAFETY: `data_size` readable bytes at `data` by contract.
    let data = unsafe { byte_slice(info.data.cast(), info.data_size, "specialization->data") }?;
    let entries: Vec<vk::SpecializationMapEntry> = entries
        .iter()
        .map(|e| vk::SpecializationMapEntry {
            constant_id: e.constant_id,
            offset: e.offset,
            size: e.size,
        })
        .collect();
    SpecConstant::from_map_entries(&entries, data)
}

/// Validates a pipeline description (the SPIR-V, its GLCompute entry point, the constants, a layout
/// that covers what the entry point uses, the flags and subgroup size; `docs/vulkan.md`) and
/// digests it. A malformed or inconsistent one is `KC_ERR_INVALID_ARGUMENT` with the reason, and
/// never reaches the driver. Everything is copied: the description's memory may be reused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_spec_new(
    desc: *const kc_vulkan_pipeline_desc,
    out_spec: *mut *mut kc_vulkan_spec,
) -> kc_status {
    let make = |desc: kc_vulkan_pipeline_desc| {
        // SAFETY: `code_size` readable bytes at `code` by contract.
        let bytes = unsafe { byte_slice(desc.code.cast(), desc.code_size, "code") }?;
        let words = words_from_bytes(bytes)?;
        let entry = if desc.entry_point.is_null() {
            "main"
        } else {
            // SAFETY: a non-NULL `entry_point` is a C string by contract.
            unsafe { c_str(desc.entry_point, "entry_point") }?
        };
        // SAFETY: `constant_count` elements at `constants` by contract.
        let raw_constants = unsafe { elements(desc.constants, desc.constant_count, "constants") }?;
        let mut constants = Vec::with_capacity(raw_constants.len());
        for c in raw_constants {
            // The size before the bytes: a constant is 1, 2, 4 or 8 bytes, never more.
            if ![1, 2, 4, 8].contains(&c.size) {
                return Err(Error::InvalidArgument(format!(
                    "specialization constant {} has {} bytes; expected 1, 2, 4 or 8",
                    c.id, c.size
                )));
            }
            // SAFETY: `size` readable bytes at `data` by contract.
            let value = unsafe { byte_slice(c.data.cast(), c.size as usize, "constants[i].data") }?;
            constants.push(SpecConstant {
                id: c.id,
                value: value.to_vec(),
            });
        }
        // SAFETY: a NULL or valid `specialization` by contract.
        constants.extend(unsafe { specialization_of(desc.specialization) }?);
        // SAFETY: `binding_count` elements at `bindings` by contract.
        let bindings = unsafe { elements(desc.bindings, desc.binding_count, "bindings") }?;
        let layout = layout_of(bindings, desc.push_constant_offset, desc.push_constant_size)?;
        let spec = PipelineSpec::from_desc(&PipelineDesc {
            specialization: &constants,
            layout: layout.as_ref(),
            flags: vk::PipelineCreateFlags::from_raw(desc.flags),
            required_subgroup_size: (desc.required_subgroup_size != 0)
                .then_some(desc.required_subgroup_size),
            ..PipelineDesc::new(&words, entry)
        })?;
        Ok(kc_vulkan_spec { inner: spec })
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { new_from_input(desc, "desc", out_spec, "out_spec", make) }
}

/// Frees a description.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_vulkan_spec_free(spec: *mut kc_vulkan_spec) {
    // SAFETY: the caller hands over the description it got from `kc_vulkan_spec_new`, or NULL.
    guard_value((), || unsafe { free_boxed(spec) })
}
