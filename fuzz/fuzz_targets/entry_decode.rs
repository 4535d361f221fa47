//! The disk entry decoder and verifier (`kcache::disk::format`) on hostile bytes.
//!
//! An entry file is whatever is on disk: another user's leftovers, a truncated write, a file
//! swapped in by someone who can write the directory. `Header::decode` and `format::verify`
//! must never panic on it, and `verify` must accept exactly the files the documented format
//! accepts. The target compares it with an oracle written here from the format's table
//! (`docs/disk-format.md`), field by field, so that a check that is skipped, reordered into
//! uselessness or off by one shows up as a disagreement, not only a crash.
//!
//! The first input byte picks the mode:
//! - even: the rest is an entry file, checked against a BLAKE3 (mode 0) or HMAC (mode 2)
//!   configuration that expects the key and schema the file's own header names (so that the
//!   later checks are reachable at all);
//! - odd: the rest drives a structured case: a valid entry (format 2 with a descriptor, or
//!   format 1 without) is encoded, mutated (bytes set, flipped, cut, appended, the tag
//!   optionally recomputed so that header edits get past it), then verified under the
//!   writer's or another configuration.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use kcache::disk::format::{
    ALG_BLAKE3, ALG_HMAC_SHA256, Expect, FORMAT_VERSION, FORMAT_VERSION_1, HEADER_LEN, Header,
    MAGIC, TAG_LEN, Tagger,
};
use kcache::disk::{Descriptor, MAX_BACKEND_LEN, MAX_DEVICE_LEN, MAX_NAME_LEN, OperatorKey};
use kcache::key::{KEY_SCHEMA_VERSION, Key};
use libfuzzer_sys::fuzz_target;

fn operator_key(seed: u8) -> OperatorKey {
    OperatorKey::new(vec![seed; 32]).expect("32 bytes is a valid operator key length")
}

fn tagger(choice: u8) -> Tagger {
    match choice % 3 {
        0 => Tagger::new(None),
        1 => Tagger::new(Some(&operator_key(0xa5))),
        _ => Tagger::new(Some(&operator_key(0x5a))),
    }
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Whether `d` is a descriptor as the format table has it: backend, device and name, each a
/// u16 length within its limit and that many bytes of UTF-8, and nothing after.
fn oracle_descriptor(d: &[u8]) -> bool {
    let mut at = 0;
    for limit in [MAX_BACKEND_LEN, MAX_DEVICE_LEN, MAX_NAME_LEN] {
        if at + 2 > d.len() {
            return false;
        }
        let n = usize::from(le_u16(d, at));
        at += 2;
        if n > limit || at + n > d.len() || std::str::from_utf8(&d[at..at + n]).is_err() {
            return false;
        }
        at += n;
    }
    at == d.len()
}

/// The length of the header at the start of `bytes` by the format table: 72 for format 1,
/// 74 + its descriptor's length for format 2 when the descriptor is whole and well formed;
/// `None` for anything else (short, bad magic or reserved byte, another version).
fn oracle_header_len(bytes: &[u8]) -> Option<usize> {
    if bytes.len() < HEADER_LEN || bytes[0..8] != MAGIC || bytes[11] != 0 {
        return None;
    }
    match le_u16(bytes, 8) {
        FORMAT_VERSION_1 => Some(HEADER_LEN),
        FORMAT_VERSION if bytes.len() >= HEADER_LEN + 2 => {
            let end = HEADER_LEN + 2 + usize::from(le_u16(bytes, HEADER_LEN));
            (end <= bytes.len() && oracle_descriptor(&bytes[HEADER_LEN + 2..end])).then_some(end)
        }
        _ => None,
    }
}

/// Whether the documented format accepts `bytes` for `expect`, decided from the byte offsets
/// of the format table, not from the library's `Header`.
fn oracle_accepts(bytes: &[u8], tagger: &Tagger, schema: u32, key: &Key) -> bool {
    if bytes.len() < HEADER_LEN + TAG_LEN {
        return false;
    }
    let Some(header_len) = oracle_header_len(bytes) else {
        return false;
    };
    let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
    bytes[10] == tagger.algorithm()
        && bytes[16..24] == tagger.fingerprint()
        && le_u64(bytes, 56).checked_add((header_len + TAG_LEN) as u64) == Some(bytes.len() as u64)
        && tagger.tag(&[body]) == tag
        && le_u32(bytes, 12) == schema
        && bytes[24..56] == key.as_bytes()[..]
}

/// Decodes, verifies and compares with the oracle. Returns whether `verify` accepted.
fn check(bytes: &[u8], tagger: &Tagger, schema: u32, key: &Key) -> bool {
    // `decode` reads the header only (fixed part and, in format 2, the descriptor); whatever
    // it accepts must re-encode to the same bytes (every field is kept and the reserved byte
    // is zero), or a field is lost or moved. It refuses exactly what the table refuses.
    let decoded = Header::decode(bytes);
    let header_len = oracle_header_len(bytes);
    if let Ok(header) = &decoded {
        assert_eq!(Some(header.encoded_len()), header_len);
        assert_eq!(
            header.encode()[..],
            bytes[..header.encoded_len()],
            "decode/encode round trip"
        );
    } else {
        assert_eq!(header_len, None, "decode refused a header the format table accepts");
    }

    let expect = Expect {
        tagger,
        schema,
        key,
    };
    let verified = kcache::disk::format::verify(bytes, &expect);
    let accepted = oracle_accepts(bytes, tagger, schema, key);
    assert_eq!(
        verified.is_ok(),
        accepted,
        "verify said {verified:?}, the documented format says accepted={accepted}"
    );
    if let Ok(header) = &verified {
        // What a successful verify returns is what the bytes say, and what was expected.
        assert_eq!(Ok(header), decoded.as_ref());
        assert!(header.version == FORMAT_VERSION || header.version == FORMAT_VERSION_1);
        assert_eq!(header.descriptor.is_some(), header.version == FORMAT_VERSION);
        assert_eq!(header.algorithm, tagger.algorithm());
        assert!(header.algorithm == ALG_BLAKE3 || header.algorithm == ALG_HMAC_SHA256);
        assert_eq!(header.fingerprint, tagger.fingerprint());
        assert_eq!(header.schema, schema);
        assert_eq!(header.key, *key);
        assert_eq!(
            header.payload_len as usize + header.encoded_len() + TAG_LEN,
            bytes.len()
        );
    }
    verified.is_ok()
}

#[derive(Arbitrary, Debug)]
enum Mutation {
    SetByte {
        at: u16,
        value: u8,
    },
    FlipBit {
        at: u16,
        bit: u8,
    },
    /// Overwrites a little-endian u64 at a header offset: payload length, build time, ...
    SetU64 {
        at: u8,
        value: u64,
    },
    Truncate {
        len: u16,
    },
    Append {
        bytes: Vec<u8>,
    },
    /// Recomputes the tag over the (mutated) body with the writer's configuration, as someone
    /// holding the operator key (or anyone, for BLAKE3) could.
    Retag,
}

#[derive(Arbitrary, Debug)]
struct Structured {
    writer: u8,
    reader: u8,
    schema_delta: u8,
    key: [u8; 32],
    build_nanos: u64,
    /// Backend, device and name of a format 2 entry (cut to their limits); `None` writes
    /// format 1.
    descriptor: Option<(String, String, String)>,
    payload: Vec<u8>,
    mutations: Vec<Mutation>,
}

fn encode(
    tagger: &Tagger,
    schema: u32,
    key: Key,
    build_nanos: u64,
    descriptor: Option<Descriptor>,
    payload: &[u8],
) -> Vec<u8> {
    let header = Header {
        version: if descriptor.is_some() {
            FORMAT_VERSION
        } else {
            FORMAT_VERSION_1
        },
        algorithm: tagger.algorithm(),
        schema,
        fingerprint: tagger.fingerprint(),
        key,
        payload_len: payload.len() as u64,
        build_nanos,
        descriptor,
    }
    .encode();
    let tag = tagger.tag(&[&header, payload]);
    [&header[..], payload, &tag].concat()
}

fn retag(bytes: &mut [u8], tagger: &Tagger) {
    if bytes.len() < TAG_LEN {
        return;
    }
    let body_len = bytes.len() - TAG_LEN;
    let tag = tagger.tag(&[&bytes[..body_len]]);
    bytes[body_len..].copy_from_slice(&tag);
}

fn structured(s: Structured) {
    let writer = tagger(s.writer);
    let key = Key::from_bytes(s.key);
    let schema = KEY_SCHEMA_VERSION;
    let descriptor = s
        .descriptor
        .as_ref()
        .map(|(backend, device, name)| Descriptor::new(backend, device, name));
    let original = encode(&writer, schema, key, s.build_nanos, descriptor, &s.payload);

    // The untouched entry verifies under its writer's configuration, and the header it
    // returns is the one written.
    assert!(
        check(&original, &writer, schema, &key),
        "a fresh entry was refused"
    );

    let mut bytes = original.clone();
    let mut retagged = false;
    for m in s.mutations.iter().take(16) {
        match *m {
            Mutation::SetByte { at, value } => {
                if let Some(b) = bytes.get_mut(usize::from(at)) {
                    *b = value;
                }
            }
            Mutation::FlipBit { at, bit } => {
                if let Some(b) = bytes.get_mut(usize::from(at)) {
                    *b ^= 1 << (bit % 8);
                }
            }
            Mutation::SetU64 { at, value } => {
                let at = usize::from(at) % HEADER_LEN;
                if let Some(field) = bytes.get_mut(at..at + 8) {
                    field.copy_from_slice(&value.to_le_bytes());
                }
            }
            Mutation::Truncate { len } => bytes.truncate(usize::from(len)),
            Mutation::Append { bytes: ref extra } => bytes.extend_from_slice(extra),
            Mutation::Retag => {
                retag(&mut bytes, &writer);
                retagged = true;
            }
        }
    }

    let reader = tagger(s.reader);
    // A reader expecting another schema sees a genuine entry under the wrong name.
    let expected_schema = schema.wrapping_add(u32::from(s.schema_delta % 2));
    let ok = check(&bytes, &reader, expected_schema, &key);
    if !retagged && bytes != original {
        // Without the tag being recomputed, any change at all must be caught: this is what
        // the tag is for. (A colliding BLAKE3 or HMAC-SHA256 tag is not a realistic input.)
        assert!(!ok, "a modified entry verified without a new tag");
    }
    if bytes == original {
        // An intact entry is accepted exactly by its writer's configuration and schema.
        assert_eq!(
            ok,
            s.reader % 3 == s.writer % 3 && s.schema_delta.is_multiple_of(2)
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode.is_multiple_of(2) {
        let tagger = tagger(mode / 2);
        // Expect the key and schema the file names, so that the checks after the tag can be
        // reached by an input whose tag is right.
        let (schema, key) = if rest.len() >= HEADER_LEN {
            let mut key = [0u8; 32];
            key.copy_from_slice(&rest[24..56]);
            (le_u32(rest, 12), Key::from_bytes(key))
        } else {
            (KEY_SCHEMA_VERSION, Key::from_bytes([0; 32]))
        };
        check(rest, &tagger, schema, &key);
    } else if let Ok(s) = Structured::arbitrary_take_rest(Unstructured::new(rest)) {
        structured(s);
    }
});
