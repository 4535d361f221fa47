//! Entry descriptors (backend, device, name) on hostile bytes and hostile text.
//!
//! A descriptor is read from every entry's header (`Descriptor::decode`) and shown by `kcache
//! ls`, `inspect` and `evict`; a C caller's strings become one through `Descriptor::new`. The
//! target holds both to the documented rule (`src/disk/descriptor.rs`, `docs/disk-format.md`).
//!
//! First byte even: the rest is an encoded descriptor. `decode` accepts exactly what an
//! oracle written from the layout accepts (three fields, each a u16 little-endian length and
//! that many bytes of UTF-8 within 32, 256 and 1024 bytes, nothing after), and an accepted
//! one re-encodes to the same bytes. Odd: three strings made into a descriptor: each field is
//! the longest prefix within its limit that ends on a character boundary (an empty backend is
//! `custom`), it round-trips through `encode` and `decode`, and inside an entry header too.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use kcache::disk::format::{ALG_BLAKE3, FORMAT_VERSION, Header};
use kcache::disk::{
    CUSTOM_BACKEND, Descriptor, MAX_BACKEND_LEN, MAX_DEVICE_LEN, MAX_ENCODED_LEN, MAX_NAME_LEN,
};
use kcache::key::Key;
use libfuzzer_sys::fuzz_target;

const LIMITS: [usize; 3] = [MAX_BACKEND_LEN, MAX_DEVICE_LEN, MAX_NAME_LEN];

/// The three fields the layout says `bytes` hold, or `None`.
fn oracle(bytes: &[u8]) -> Option<[String; 3]> {
    let mut at = 0;
    let mut fields: [String; 3] = Default::default();
    for (field, limit) in fields.iter_mut().zip(LIMITS) {
        let len = bytes.get(at..at + 2)?;
        let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
        at += 2;
        if len > limit {
            return None;
        }
        *field = String::from_utf8(bytes.get(at..at + len)?.to_vec()).ok()?;
        at += len;
    }
    (at == bytes.len()).then_some(fields)
}

/// `text` cut as the rule says: the longest prefix of at most `limit` bytes on a character
/// boundary, found by walking the characters (not as the library does).
fn cut(text: &str, limit: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if out.len() + c.len_utf8() > limit {
            break;
        }
        out.push(c);
    }
    out
}

fn check_bytes(bytes: &[u8]) {
    let decoded = Descriptor::decode(bytes);
    let expected = oracle(bytes);
    assert_eq!(
        decoded.is_some(),
        expected.is_some(),
        "decode disagrees with the layout"
    );
    if let (Some(d), Some([backend, device, name])) = (decoded, expected) {
        assert_eq!(
            (d.backend(), d.device(), d.name()),
            (&*backend, &*device, &*name)
        );
        assert_eq!(d.encode(), bytes);
        assert_eq!(d.encoded_len(), bytes.len());
        assert!(d.encoded_len() <= MAX_ENCODED_LEN);
    }
}

#[derive(Arbitrary, Debug)]
struct Texts {
    backend: String,
    device: String,
    name: String,
}

fn check_texts(t: Texts) {
    let d = Descriptor::new(&t.backend, &t.device, &t.name);
    let backend = if t.backend.is_empty() {
        CUSTOM_BACKEND
    } else {
        &t.backend
    };
    assert_eq!(d.backend(), cut(backend, MAX_BACKEND_LEN));
    assert_eq!(d.device(), cut(&t.device, MAX_DEVICE_LEN));
    assert_eq!(d.name(), cut(&t.name, MAX_NAME_LEN));
    let bytes = d.encode();
    assert_eq!(bytes.len(), d.encoded_len());
    assert!(bytes.len() <= MAX_ENCODED_LEN);
    assert_eq!(Descriptor::decode(&bytes).as_ref(), Some(&d));
    check_bytes(&bytes);
    // In an entry's header, as written and read back.
    let header = Header {
        version: FORMAT_VERSION,
        algorithm: ALG_BLAKE3,
        schema: 1,
        fingerprint: [0; 8],
        key: Key::from_bytes([7; 32]),
        payload_len: 0,
        build_nanos: 0,
        descriptor: Some(d.clone()),
    };
    let encoded = header.encode();
    assert_eq!(encoded.len(), header.encoded_len());
    assert_eq!(Header::decode(&encoded).unwrap().descriptor, Some(d));
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        check_bytes(rest);
    } else if let Ok(texts) = Texts::arbitrary_take_rest(Unstructured::new(rest)) {
        check_texts(texts);
    }
});
