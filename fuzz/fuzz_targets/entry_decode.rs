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
//! - odd: the rest drives a structured case: a valid entry is encoded, mutated (bytes set,
//!   flipped, cut, appended, the tag optionally recomputed so that header edits get past it),
//!   then verified under the writer's or another configuration.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use kcache::disk::OperatorKey;
use kcache::disk::format::{
    ALG_BLAKE3, ALG_HMAC_SHA256, Expect, FORMAT_VERSION, HEADER_LEN, Header, MAGIC, TAG_LEN, Tagger,
};
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

/// Whether the documented format accepts `bytes` for `expect`, decided from the byte offsets
/// of the format table, not from the library's `Header`.
fn oracle_accepts(bytes: &[u8], tagger: &Tagger, schema: u32, key: &Key) -> bool {
    if bytes.len() < HEADER_LEN + TAG_LEN {
        return false;
    }
    let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
    bytes[0..8] == MAGIC
        && bytes[11] == 0
        && le_u16(bytes, 8) == FORMAT_VERSION
        && bytes[10] == tagger.algorithm()
        && bytes[16..24] == tagger.fingerprint()
        && le_u64(bytes, 56) == (bytes.len() - HEADER_LEN - TAG_LEN) as u64
        && tagger.tag(&[body]) == tag
        && le_u32(bytes, 12) == schema
        && bytes[24..56] == key.as_bytes()[..]
}

/// Decodes, verifies and compares with the oracle. Returns whether `verify` accepted.
fn check(bytes: &[u8], tagger: &Tagger, schema: u32, key: &Key) -> bool {
    // `decode` reads the fixed header only; whatever it accepts must re-encode to the same 72
    // bytes (every field is kept and the reserved byte is zero), or a field is lost or moved.
    let decoded = Header::decode(bytes);
    if let Some(header) = decoded {
        assert_eq!(
            header.encode()[..],
            bytes[..HEADER_LEN],
            "decode/encode round trip"
        );
    } else {
        assert!(
            bytes.len() < HEADER_LEN || bytes[0..8] != MAGIC || bytes[11] != 0,
            "decode refused a header with the right magic and reserved byte"
        );
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
    if let Ok(header) = verified {
        // What a successful verify returns is what the bytes say, and what was expected.
        assert_eq!(Some(header), decoded);
        assert_eq!(header.version, FORMAT_VERSION);
        assert_eq!(header.algorithm, tagger.algorithm());
        assert!(header.algorithm == ALG_BLAKE3 || header.algorithm == ALG_HMAC_SHA256);
        assert_eq!(header.fingerprint, tagger.fingerprint());
        assert_eq!(header.schema, schema);
        assert_eq!(header.key, *key);
        assert_eq!(
            header.payload_len as usize + HEADER_LEN + TAG_LEN,
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
    payload: Vec<u8>,
    mutations: Vec<Mutation>,
}

fn encode(tagger: &Tagger, schema: u32, key: Key, build_nanos: u64, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        version: FORMAT_VERSION,
        algorithm: tagger.algorithm(),
        schema,
        fingerprint: tagger.fingerprint(),
        key,
        payload_len: payload.len() as u64,
        build_nanos,
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
    let original = encode(&writer, schema, key, s.build_nanos, &s.payload);

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
