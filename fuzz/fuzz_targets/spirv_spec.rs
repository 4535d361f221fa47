//! SPIR-V checks and `PipelineSpec` construction on hostile input (no GPU: parsing and
//! validation only).
//!
//! A `.spv` file or a caller's specialization and layout description reach
//! `PipelineSpec::new` before any driver does, and drivers are entitled to crash on what it
//! lets through. So besides "no panic", the target states the documented acceptance rule
//! (header, every instruction inside the module, a `GLCompute` entry point of that name,
//! unique specialization ids with 1/2/4/8-byte values, a compute-usable layout) as an oracle:
//! what breaks it is refused, and what keeps it is accepted unless the interface step (the
//! layout must cover the bindings and push constants the entry point uses) refuses it with its
//! own error. It also checks the digest's
//! promises: independent of the order of constants and bindings, different when the content is.
//!
//! First input byte even: the rest is a module's bytes, with entry point `main` and no
//! specialization or layout. Odd: the rest drives a structured description.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use ash::vk;
use kcache::backend::vulkan::{
    DescriptorBinding, LayoutDesc, PipelineDesc, PipelineSpec, PushConstantRange, SpecConstant,
    words_from_bytes,
};
use libfuzzer_sys::fuzz_target;

const MAGIC: u32 = 0x0723_0203;
const OP_ENTRY_POINT: u32 = 15;
const GL_COMPUTE: u32 = 5;
/// Descriptor types a compute shader can use (Vulkan 1.0 core, less input attachments).
const COMPUTE_TYPES: std::ops::RangeInclusive<i32> = 0..=9;

/// The SPIR-V rule of `PipelineSpec::new`, restated from its documentation.
fn module_ok(words: &[u32], entry: &str) -> bool {
    if words.len() < 5 || words[0] != MAGIC {
        return false;
    }
    let version = words[1];
    if version >> 24 != 0 || version & 0xff != 0 || (version >> 16) & 0xff != 1 {
        return false;
    }
    if words[3] == 0 || words[4] != 0 {
        return false;
    }
    let mut found = false;
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        if count == 0 || at + count > words.len() {
            return false;
        }
        if words[at] & 0xffff == OP_ENTRY_POINT && count >= 4 && words[at + 1] == GL_COMPUTE {
            let name: Vec<u8> = words[at + 3..at + count]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            let want = entry.as_bytes();
            found |= name.len() > want.len() && name.starts_with(want) && name[want.len()] == 0;
        }
        at += count;
    }
    found
}

fn spec_ok(spec: &[SpecConstant]) -> bool {
    let mut ids: Vec<u32> = spec.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len() == spec.len() && spec.iter().all(|c| matches!(c.value.len(), 1 | 2 | 4 | 8))
}

fn layout_ok(layout: &LayoutDesc) -> bool {
    let sets_ok = layout.sets.iter().all(|set| {
        let mut bindings: Vec<u32> = set.iter().map(|b| b.binding).collect();
        bindings.sort_unstable();
        bindings.dedup();
        bindings.len() == set.len()
            && set
                .iter()
                .all(|b| COMPUTE_TYPES.contains(&b.descriptor_type.as_raw()))
    });
    let push_ok = layout.push_constants.is_none_or(|pc| {
        pc.size != 0
            && pc.offset % 4 == 0
            && pc.size % 4 == 0
            && pc.offset.checked_add(pc.size).is_some()
    });
    sets_ok && push_ok
}

/// A refusal by the step this target does not restate: reading the entry point's interface
/// (its descriptor bindings and push constants) and checking that the layout covers it.
fn beyond_structure(err: &kcache::Error) -> bool {
    matches!(err, kcache::Error::InvalidArgument(m)
        if m.starts_with("SPIR-V interface: ")
            || m.contains("the shader")
            || m.contains("describe the layout"))
}

fn check(words: &[u32], entry: &str, spec: &[SpecConstant], layout: &LayoutDesc) {
    let built = PipelineSpec::new(words, entry, spec, layout);
    let structural =
        module_ok(words, entry) && !entry.contains('\0') && spec_ok(spec) && layout_ok(layout);
    // Structurally wrong: refused. Structurally right: accepted, unless the interface step
    // refuses it (an unreadable interface, or a layout that does not cover it).
    let agrees = match &built {
        Ok(_) => structural,
        Err(e) => !structural || beyond_structure(e),
    };
    assert!(
        agrees,
        "PipelineSpec::new said {built:?}, the documented rule says accepted={structural}"
    );
    let Ok(built) = built else {
        let err = built.unwrap_err();
        assert!(
            matches!(err, kcache::Error::InvalidArgument(_)),
            "errors are InvalidArgument: {err:?}"
        );
        return;
    };

    // The stored layout is the given one with each set sorted by binding number.
    assert_eq!(built.layout().sets.len(), layout.sets.len());
    for (stored, given) in built.layout().sets.iter().zip(&layout.sets) {
        assert!(stored.windows(2).all(|w| w[0].binding < w[1].binding));
        let mut given = given.clone();
        given.sort_by_key(|b| b.binding);
        assert_eq!(*stored, given);
    }
    assert_eq!(built.layout().push_constants, layout.push_constants);

    // Equal content, listed in another order: equal digest.
    let reversed_spec: Vec<SpecConstant> = spec.iter().rev().cloned().collect();
    let reversed_layout = LayoutDesc {
        sets: layout
            .sets
            .iter()
            .map(|s| s.iter().rev().copied().collect())
            .collect(),
        push_constants: layout.push_constants,
    };
    let again = PipelineSpec::new(words, entry, &reversed_spec, &reversed_layout)
        .expect("a reordering of an accepted description is accepted");
    assert_eq!(built.digest(), again.digest());

    // Different content: different digest.
    if let Some(first) = spec.first() {
        let mut changed = spec.to_vec();
        changed[0].value[0] ^= 1;
        let other = PipelineSpec::new(words, entry, &changed, layout).unwrap();
        assert_ne!(
            built.digest(),
            other.digest(),
            "{first:?} value not digested"
        );
    }
    // A layout derived from the shader, when it can be, is one the shader accepts when given,
    // under the same key.
    let derived = PipelineSpec::from_desc(&PipelineDesc {
        specialization: spec,
        ..PipelineDesc::new(words, entry)
    });
    match derived {
        Ok(derived) => {
            let given = PipelineSpec::new(words, entry, spec, derived.layout())
                .expect("a derived layout is accepted when given");
            assert_eq!(derived.digest(), given.digest());
        }
        Err(e) => assert!(beyond_structure(&e), "{e:?}"),
    }
    let mut longer = words.to_vec();
    longer.push(1 << 16); // OpNop: still a valid module, one word longer.
    let other = PipelineSpec::new(&longer, entry, spec, layout).unwrap();
    assert_ne!(built.digest(), other.digest(), "SPIR-V words not digested");
    let dropped_push = LayoutDesc {
        push_constants: match layout.push_constants {
            Some(_) => None,
            None => Some(PushConstantRange { offset: 0, size: 4 }),
        },
        ..layout.clone()
    };
    match PipelineSpec::new(words, entry, spec, &dropped_push) {
        Ok(other) => assert_ne!(
            built.digest(),
            other.digest(),
            "push constants not digested"
        ),
        // Only dropping a range the shader uses may be refused.
        Err(e) => assert!(
            layout.push_constants.is_some() && beyond_structure(&e),
            "{e:?}"
        ),
    }
}

#[derive(Arbitrary, Debug)]
struct EntryPoint {
    gl_compute: bool,
    id: u32,
    name: String,
    /// Leave out the terminating NUL when the name fills its last word exactly.
    unterminated: bool,
    interface: Vec<u32>,
}

#[derive(Arbitrary, Debug)]
enum Edit {
    SetWord { at: u16, value: u32 },
    Truncate { words: u16 },
}

#[derive(Arbitrary, Debug)]
struct Structured {
    version_minor: u8,
    bad_version_bits: bool,
    bound: u32,
    entry_points: Vec<EntryPoint>,
    /// Other instructions: opcode and operands.
    others: Vec<(u16, Vec<u32>)>,
    edits: Vec<Edit>,
    /// The requested entry point: one of the module's (by index), or this name.
    pick: Option<u8>,
    entry: String,
    spec: Vec<(u32, Vec<u8>)>,
    sets: Vec<Vec<(u32, u8, u32)>>,
    push: Option<(u32, u32)>,
}

fn encode_name(name: &str, unterminated: bool) -> Vec<u32> {
    let mut bytes = name.as_bytes().to_vec();
    if !(unterminated && bytes.len().is_multiple_of(4)) {
        bytes.push(0);
    }
    while !bytes.len().is_multiple_of(4) {
        bytes.push(0);
    }
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn instruction(opcode: u32, operands: &[u32]) -> Vec<u32> {
    let count = (1 + operands.len()).min(0xffff) as u32;
    let mut out = vec![(count << 16) | (opcode & 0xffff)];
    out.extend_from_slice(&operands[..count as usize - 1]);
    out
}

fn descriptor_type(raw: u8) -> vk::DescriptorType {
    match raw {
        0..=15 => vk::DescriptorType::from_raw(i32::from(raw)),
        // Extension types (inline uniform block, acceleration structure, mutable, ...).
        16..=31 => vk::DescriptorType::from_raw(1_000_138_000 + i32::from(raw)),
        _ => vk::DescriptorType::from_raw(i32::from(raw) % 10),
    }
}

fn structured(s: Structured) {
    let mut words = vec![
        MAGIC,
        (1 << 16) | (u32::from(s.version_minor % 8) << 8) | u32::from(s.bad_version_bits),
        0,
        s.bound,
        0,
    ];
    for (n, ep) in s.entry_points.iter().enumerate().take(8) {
        let mut operands = vec![
            if ep.gl_compute {
                GL_COMPUTE
            } else {
                n as u32 % 5
            },
            ep.id,
        ];
        operands.extend(encode_name(&ep.name, ep.unterminated));
        operands.extend(ep.interface.iter().take(8));
        words.extend(instruction(OP_ENTRY_POINT, &operands));
    }
    for (opcode, operands) in s.others.iter().take(8) {
        words.extend(instruction(
            u32::from(*opcode),
            &operands[..operands.len().min(16)],
        ));
    }
    for edit in s.edits.iter().take(4) {
        match *edit {
            Edit::SetWord { at, value } => {
                if let Some(w) = words.get_mut(usize::from(at)) {
                    *w = value;
                }
            }
            Edit::Truncate { words: n } => words.truncate(usize::from(n)),
        }
    }
    let entry = match s.pick {
        Some(i) if !s.entry_points.is_empty() => s.entry_points
            [usize::from(i) % s.entry_points.len()]
        .name
        .clone(),
        _ => s.entry.clone(),
    };
    let spec: Vec<SpecConstant> = s
        .spec
        .iter()
        .take(8)
        .map(|(id, value)| SpecConstant {
            id: *id % 16,
            value: value.iter().take(9).copied().collect(),
        })
        .collect();
    let layout = LayoutDesc {
        sets: s
            .sets
            .iter()
            .take(4)
            .map(|set| {
                set.iter()
                    .take(8)
                    .map(|&(binding, ty, count)| DescriptorBinding {
                        binding: binding % 16,
                        descriptor_type: descriptor_type(ty),
                        count,
                    })
                    .collect()
            })
            .collect(),
        push_constants: s
            .push
            .map(|(offset, size)| PushConstantRange { offset, size }),
    };
    check(&words, &entry, &spec, &layout);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let words = words_from_bytes(rest);
        assert_eq!(words.is_ok(), rest.len() % 4 == 0);
        if let Ok(words) = words {
            // Little-endian words, as the file stores them.
            let back: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            assert_eq!(back, rest);
            check(&words, "main", &[], &LayoutDesc::default());
        }
    } else if let Ok(s) = Structured::arbitrary_take_rest(Unstructured::new(rest)) {
        structured(s);
    }
});
