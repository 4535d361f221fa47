//! What a compute entry point needs from its pipeline layout, read from the SPIR-V: the
//! descriptor bindings (set, binding, kind, array size) and the push-constant bytes it uses.
//!
//! A layout that leaves out a binding the shader uses, gives it an incompatible descriptor
//! type, or a push-constant range that does not cover the block, makes the pipeline invalid
//! (Vulkan spec, `VkComputePipelineCreateInfo`: the layout must be "consistent" with the
//! shader), and drivers may crash on it: lavapipe does, inside `vkCreateComputePipelines`.
//! kcache checks it before any driver sees the description.
//!
//! The module was already walked by [`super::spirv::validate`]; this pass reads the few
//! instructions that matter (decorations, types, constants, variables, functions and calls).
//! A resource counts as used when its variable's id appears as an operand in a function the
//! entry point reaches through `OpFunctionCall`: SPIR-V before 1.4 lists only input and output
//! variables in `OpEntryPoint`, so the interface cannot be taken from there. Taking any operand
//! word errs towards requiring a binding: a literal that happens to equal a resource's id can
//! only make the check stricter, never let a missing binding through.

use std::collections::{HashMap, HashSet};

use ash::vk;

use crate::{Error, Result};

const HEADER_WORDS: usize = 5;

const OP_ENTRY_POINT: u32 = 15;
const OP_TYPE_VOID: u32 = 19;
const OP_TYPE_INT: u32 = 21;
const OP_TYPE_FLOAT: u32 = 22;
const OP_TYPE_VECTOR: u32 = 23;
const OP_TYPE_MATRIX: u32 = 24;
const OP_TYPE_IMAGE: u32 = 25;
const OP_TYPE_SAMPLER: u32 = 26;
const OP_TYPE_SAMPLED_IMAGE: u32 = 27;
const OP_TYPE_ARRAY: u32 = 28;
const OP_TYPE_RUNTIME_ARRAY: u32 = 29;
const OP_TYPE_STRUCT: u32 = 30;
const OP_TYPE_POINTER: u32 = 32;
const OP_CONSTANT: u32 = 43;
const OP_FUNCTION: u32 = 54;
const OP_FUNCTION_END: u32 = 56;
const OP_FUNCTION_CALL: u32 = 57;
const OP_VARIABLE: u32 = 59;
const OP_DECORATE: u32 = 71;
const OP_MEMBER_DECORATE: u32 = 72;

const EXECUTION_MODEL_GL_COMPUTE: u32 = 5;

const DECORATION_BLOCK: u32 = 2;
const DECORATION_BUFFER_BLOCK: u32 = 3;
const DECORATION_ARRAY_STRIDE: u32 = 6;
const DECORATION_MATRIX_STRIDE: u32 = 7;
const DECORATION_BINDING: u32 = 33;
const DECORATION_DESCRIPTOR_SET: u32 = 34;
const DECORATION_OFFSET: u32 = 35;

const STORAGE_UNIFORM_CONSTANT: u32 = 0;
const STORAGE_UNIFORM: u32 = 2;
const STORAGE_PUSH_CONSTANT: u32 = 9;
const STORAGE_STORAGE_BUFFER: u32 = 12;

const DIM_BUFFER: u32 = 5;

/// What kind of resource a shader variable is, which decides the descriptor types that may
/// back it (Vulkan spec, "Shader Resource and Descriptor Type Correspondence").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    Sampler,
    SampledImage,
    CombinedImageSampler,
    StorageImage,
    /// An image whose `Sampled` operand is 0: sampled or storage, known only at run time.
    Image,
    UniformTexelBuffer,
    StorageTexelBuffer,
    UniformBuffer,
    StorageBuffer,
    /// A resource type this check does not know (an acceleration structure, …): the layout
    /// must describe the binding, with any type.
    Other,
}

impl Resource {
    /// Whether a descriptor of type `t` may back this resource.
    pub(crate) fn accepts(self, t: vk::DescriptorType) -> bool {
        use vk::DescriptorType as D;
        match self {
            Resource::Sampler => matches!(t, D::SAMPLER | D::COMBINED_IMAGE_SAMPLER),
            Resource::SampledImage => matches!(t, D::SAMPLED_IMAGE | D::COMBINED_IMAGE_SAMPLER),
            Resource::CombinedImageSampler => t == D::COMBINED_IMAGE_SAMPLER,
            Resource::StorageImage => t == D::STORAGE_IMAGE,
            Resource::Image => matches!(
                t,
                D::SAMPLED_IMAGE | D::COMBINED_IMAGE_SAMPLER | D::STORAGE_IMAGE
            ),
            Resource::UniformTexelBuffer => t == D::UNIFORM_TEXEL_BUFFER,
            Resource::StorageTexelBuffer => t == D::STORAGE_TEXEL_BUFFER,
            Resource::UniformBuffer => {
                matches!(t, D::UNIFORM_BUFFER | D::UNIFORM_BUFFER_DYNAMIC)
            }
            Resource::StorageBuffer => {
                matches!(t, D::STORAGE_BUFFER | D::STORAGE_BUFFER_DYNAMIC)
            }
            Resource::Other => true,
        }
    }
}

/// One descriptor binding the entry point uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UsedBinding {
    pub set: u32,
    pub binding: u32,
    pub resource: Resource,
    /// Descriptors the variable spans: its array length, 1 for a single resource or a
    /// runtime-sized array (which needs at least one).
    pub count: u32,
}

/// How the entry point uses push constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushConstants {
    /// `[first, end)`: the bytes the block's members occupy.
    Bytes(u32, u32),
    /// A block whose size depends on specialization constants: a range must exist, its size
    /// cannot be checked here.
    Unsized,
}

/// The pipeline-layout requirements of one entry point.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Interface {
    /// Sorted by (set, binding).
    pub bindings: Vec<UsedBinding>,
    pub push_constants: Option<PushConstants>,
}

/// Errors name the step: a module can pass the structural checks of `spirv.rs` and still have
/// an entry-point interface that cannot be read.
fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(format!("SPIR-V interface: {}", message.into()))
}

#[derive(Default)]
struct Module<'a> {
    /// id → (opcode, operands after the opcode word) of every type and constant.
    defs: HashMap<u32, (u32, &'a [u32])>,
    /// id → value of 32-bit (or wider: low word) integer constants.
    constants: HashMap<u32, u32>,
    decorations: HashMap<u32, Vec<(u32, u32)>>,
    member_offsets: HashMap<(u32, u32), u32>,
    member_matrix_strides: HashMap<(u32, u32), u32>,
    /// (variable id, pointer type id, storage class)
    variables: Vec<(u32, u32, u32)>,
    /// function id → its body's instructions
    functions: HashMap<u32, Vec<&'a [u32]>>,
}

fn instructions(words: &[u32]) -> impl Iterator<Item = &[u32]> {
    let mut at = HEADER_WORDS;
    std::iter::from_fn(move || {
        let count = (*words.get(at)? >> 16) as usize;
        let end = at
            .checked_add(count)
            .filter(|&e| count > 0 && e <= words.len())?;
        let inst = &words[at..end];
        at = end;
        Some(inst)
    })
}

fn entry_function(words: &[u32], entry_point: &str) -> Option<u32> {
    instructions(words).find_map(|inst| {
        let name = inst.get(3..)?;
        (inst[0] & 0xffff == OP_ENTRY_POINT
            && inst[1] == EXECUTION_MODEL_GL_COMPUTE
            && literal_equals(name, entry_point))
        .then_some(inst[2])
    })
}

fn literal_equals(words: &[u32], expected: &str) -> bool {
    let mut bytes = words.iter().flat_map(|w| w.to_le_bytes());
    expected.bytes().all(|b| bytes.next() == Some(b)) && bytes.next() == Some(0)
}

fn parse(words: &[u32]) -> Module<'_> {
    let mut m = Module::default();
    let mut current: Option<u32> = None;
    for inst in instructions(words) {
        let op = inst[0] & 0xffff;
        let operands = &inst[1..];
        match op {
            OP_DECORATE if operands.len() >= 2 => m
                .decorations
                .entry(operands[0])
                .or_default()
                .push((operands[1], operands.get(2).copied().unwrap_or(0))),
            OP_MEMBER_DECORATE if operands.len() >= 4 => {
                let key = (operands[0], operands[1]);
                match operands[2] {
                    DECORATION_OFFSET => {
                        m.member_offsets.insert(key, operands[3]);
                    }
                    DECORATION_MATRIX_STRIDE => {
                        m.member_matrix_strides.insert(key, operands[3]);
                    }
                    _ => {}
                }
            }
            OP_TYPE_VOID..=OP_TYPE_POINTER if !operands.is_empty() => {
                m.defs.insert(operands[0], (op, &operands[1..]));
            }
            OP_CONSTANT if operands.len() >= 3 => {
                m.constants.insert(operands[1], operands[2]);
            }
            OP_VARIABLE if operands.len() >= 3 && current.is_none() => {
                m.variables.push((operands[1], operands[0], operands[2]));
            }
            OP_FUNCTION if operands.len() >= 2 => {
                current = Some(operands[1]);
                m.functions.entry(operands[1]).or_default();
            }
            OP_FUNCTION_END => current = None,
            _ => {
                if let Some(f) = current {
                    m.functions.entry(f).or_default().push(inst);
                }
            }
        }
    }
    m
}

impl Module<'_> {
    fn def(&self, id: u32) -> Result<(u32, &[u32])> {
        self.defs
            .get(&id)
            .copied()
            .ok_or_else(|| invalid(format!("type %{id} is not defined")))
    }

    fn decoration(&self, id: u32, decoration: u32) -> Option<u32> {
        self.decorations
            .get(&id)?
            .iter()
            .find(|(d, _)| *d == decoration)
            .map(|(_, v)| *v)
    }

    fn has_decoration(&self, id: u32, decoration: u32) -> bool {
        self.decoration(id, decoration).is_some()
    }

    /// Functions reachable from `entry` through `OpFunctionCall`.
    fn reachable(&self, entry: u32) -> HashSet<u32> {
        let mut seen = HashSet::from([entry]);
        let mut todo = vec![entry];
        while let Some(f) = todo.pop() {
            let calls = self.functions.get(&f).into_iter().flatten();
            for inst in calls.filter(|inst| inst[0] & 0xffff == OP_FUNCTION_CALL) {
                match inst.get(3) {
                    Some(&callee) if seen.insert(callee) => todo.push(callee),
                    _ => {}
                }
            }
        }
        seen
    }

    /// Strips arrays: (element type, descriptors needed). An array sized by a specialization
    /// constant counts as one element: its size is not known before specialization.
    fn unwrap_arrays(&self, mut ty: u32) -> (u32, u32) {
        let mut count: u32 = 1;
        loop {
            match self.defs.get(&ty) {
                Some((OP_TYPE_ARRAY, [elem, length, ..])) => {
                    let n = self.constants.get(length).copied().unwrap_or(1);
                    count = count.saturating_mul(n);
                    ty = *elem;
                }
                Some((OP_TYPE_RUNTIME_ARRAY, [elem, ..])) => ty = *elem,
                _ => return (ty, count),
            }
        }
    }

    /// The kind of a resource variable of element type `ty`; types this check does not know
    /// (ray-tracing ones and other extensions) are `Other`.
    fn resource(&self, storage: u32, ty: u32) -> Resource {
        let Some(&def) = self.defs.get(&ty) else {
            return Resource::Other;
        };
        match (storage, def) {
            (STORAGE_STORAGE_BUFFER, _) => Resource::StorageBuffer,
            (STORAGE_UNIFORM, _) if self.has_decoration(ty, DECORATION_BUFFER_BLOCK) => {
                Resource::StorageBuffer
            }
            (STORAGE_UNIFORM, _) if self.has_decoration(ty, DECORATION_BLOCK) => {
                Resource::UniformBuffer
            }
            (_, (OP_TYPE_SAMPLER, _)) => Resource::Sampler,
            // GLSL's samplerBuffer: a sampled image of a buffer is a uniform texel buffer.
            (_, (OP_TYPE_SAMPLED_IMAGE, [image, ..])) => match self.defs.get(image) {
                Some((OP_TYPE_IMAGE, [_, DIM_BUFFER, ..])) => Resource::UniformTexelBuffer,
                _ => Resource::CombinedImageSampler,
            },
            (_, (OP_TYPE_IMAGE, [_, dim, _, _, _, sampled, ..])) => match (*dim, *sampled) {
                (DIM_BUFFER, 1) => Resource::UniformTexelBuffer,
                (DIM_BUFFER, 2) => Resource::StorageTexelBuffer,
                (DIM_BUFFER, _) => Resource::Other,
                (_, 1) => Resource::SampledImage,
                (_, 2) => Resource::StorageImage,
                _ => Resource::Image,
            },
            _ => Resource::Other,
        }
    }

    /// Size in bytes of a type laid out with explicit offsets and strides (a push-constant
    /// block's members); `matrix_stride` is the stride decorated on the member holding it.
    fn size_of(&self, ty: u32, matrix_stride: Option<u32>) -> Result<u32> {
        let size = match self.def(ty)? {
            (OP_TYPE_INT | OP_TYPE_FLOAT, [width, ..]) => width / 8,
            (OP_TYPE_VECTOR, [component, n, ..]) => {
                self.size_of(*component, None)?.saturating_mul(*n)
            }
            (OP_TYPE_MATRIX, [column, n, ..]) => match matrix_stride {
                Some(stride) => stride.saturating_mul(*n),
                None => self.size_of(*column, None)?.saturating_mul(*n),
            },
            (OP_TYPE_ARRAY, [elem, length, ..]) => {
                let n = *self
                    .constants
                    .get(length)
                    .ok_or_else(|| invalid(format!("array length %{length} is not a constant")))?;
                let stride = match self.decoration(ty, DECORATION_ARRAY_STRIDE) {
                    Some(stride) => stride,
                    None => self.size_of(*elem, matrix_stride)?,
                };
                stride.saturating_mul(n)
            }
            (OP_TYPE_STRUCT, members) => self.struct_extent(ty, members)?.1,
            (op, _) => {
                return Err(invalid(format!(
                    "type %{ty} (opcode {op}) has no size in a push-constant block"
                )));
            }
        };
        Ok(size)
    }

    /// `[first, end)` of a struct's members by their `Offset` decorations.
    fn struct_extent(&self, ty: u32, members: &[u32]) -> Result<(u32, u32)> {
        let mut first = u32::MAX;
        let mut end = 0u32;
        for (i, &member) in members.iter().enumerate() {
            let key = (ty, i as u32);
            let offset = self.member_offsets.get(&key).copied().unwrap_or(0);
            let size = self.size_of(member, self.member_matrix_strides.get(&key).copied())?;
            first = first.min(offset);
            end = end.max(offset.saturating_add(size));
        }
        Ok((if members.is_empty() { 0 } else { first }, end))
    }
}

/// The bindings and push-constant bytes `entry_point` uses. `words` must have passed
/// [`super::spirv::validate`] for that entry point.
pub(crate) fn interface(words: &[u32], entry_point: &str) -> Result<Interface> {
    let entry = entry_function(words, entry_point)
        .ok_or_else(|| invalid(format!("no GLCompute entry point named {entry_point:?}")))?;
    let m = parse(words);
    let reachable = m.reachable(entry);
    let resources: HashMap<u32, (u32, u32)> = m
        .variables
        .iter()
        .filter(|(_, _, storage)| {
            matches!(
                *storage,
                STORAGE_UNIFORM_CONSTANT
                    | STORAGE_UNIFORM
                    | STORAGE_STORAGE_BUFFER
                    | STORAGE_PUSH_CONSTANT
            )
        })
        .map(|&(id, ty, storage)| (id, (ty, storage)))
        .collect();
    let mut used = HashSet::new();
    for f in &reachable {
        for inst in m.functions.get(f).into_iter().flatten() {
            used.extend(inst[1..].iter().filter(|w| resources.contains_key(w)));
        }
    }

    let mut out = Interface::default();
    for &id in &used {
        let (pointer, storage) = resources[&id];
        let pointee = match m.def(pointer)? {
            (OP_TYPE_POINTER, [_, pointee, ..]) => *pointee,
            _ => return Err(invalid(format!("variable %{id} is not of a pointer type"))),
        };
        if storage == STORAGE_PUSH_CONSTANT {
            let extent = match m.def(pointee)? {
                (OP_TYPE_STRUCT, members) => m.struct_extent(pointee, members),
                _ => m.size_of(pointee, None).map(|end| (0, end)),
            };
            out.push_constants = Some(match (out.push_constants, extent) {
                (_, Err(_)) | (Some(PushConstants::Unsized), _) => PushConstants::Unsized,
                (None, Ok((first, end))) => PushConstants::Bytes(first, end),
                (Some(PushConstants::Bytes(lo, hi)), Ok((first, end))) => {
                    PushConstants::Bytes(lo.min(first), hi.max(end))
                }
            });
            continue;
        }
        let (Some(set), Some(binding)) = (
            m.decoration(id, DECORATION_DESCRIPTOR_SET),
            m.decoration(id, DECORATION_BINDING),
        ) else {
            // Vulkan requires both on every resource variable; spirv-val's job to say so.
            continue;
        };
        let (element, count) = m.unwrap_arrays(pointee);
        out.bindings.push(UsedBinding {
            set,
            binding,
            resource: m.resource(storage, element),
            count,
        });
    }
    out.bindings.sort_by_key(|b| (b.set, b.binding));
    Ok(out)
}
