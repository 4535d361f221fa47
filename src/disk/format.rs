//! The entry format (`docs/disk-format.md` is the prose version).
//!
//! ```text
//! offset  size  field
//!      0     8  magic            89 4B 43 41 43 48 45 0A  ("\x89KCACHE\n")
//!      8     2  format version   u16 little-endian, currently 2 (1 is still read)
//!     10     1  tag algorithm    1 = BLAKE3 checksum, 2 = HMAC-SHA256
//!     11     1  reserved         0
//!     12     4  key schema       u32 little-endian
//!     16     8  key-id fingerprint (all zero for BLAKE3 entries)
//!     24    32  full key
//!     56     8  payload length   u64 little-endian
//!     64     8  build time       u64 little-endian, nanoseconds
//!     72     2  descriptor length d, u16 little-endian        (format 2 only)
//!     74     d  descriptor (see `descriptor`)                  (format 2 only)
//!   74+d     n  payload          (at 72 in format 1)
//! 74+d+n    32  tag over every byte before it
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::config::OperatorKey;
use super::descriptor::{self, Descriptor};
use crate::key::{KEY_LEN, Key};

pub const MAGIC: [u8; 8] = *b"\x89KCACHE\n";
/// The version written.
pub const FORMAT_VERSION: u16 = 2;
/// The previous version, without a descriptor: still read, removed by `gc`.
pub const FORMAT_VERSION_1: u16 = 1;
/// The fixed part of the header, the whole header of format 1.
pub const HEADER_LEN: usize = 72;
/// The descriptor length field of format 2.
pub const DESCRIPTOR_LEN_FIELD: usize = 2;
/// The longest header: format 2 with the longest descriptor.
pub const MAX_HEADER_LEN: usize = HEADER_LEN + DESCRIPTOR_LEN_FIELD + descriptor::MAX_ENCODED_LEN;
pub const TAG_LEN: usize = 32;
/// The fewest bytes an entry adds to its payload (a format 1 header and the tag); a file
/// shorter than this is no entry.
pub const OVERHEAD: u64 = (HEADER_LEN + TAG_LEN) as u64;

pub const ALG_BLAKE3: u8 = 1;
pub const ALG_HMAC_SHA256: u8 = 2;

/// Identifies an operator key without revealing it, so entries of an older key generation
/// can be recognised and collected after a rotation.
pub type Fingerprint = [u8; 8];

const FINGERPRINT_CONTEXT: &str = "kcache 2026-12 operator key fingerprint";

/// Computes and checks tags. With an operator key only HMAC-SHA256 entries are accepted:
/// anyone can compute a BLAKE3 checksum, so accepting one would let whoever can write the
/// directory bypass the key.
pub enum Tagger {
    Blake3,
    /// Keeps the key itself (wiped on drop), not a keyed HMAC state: `hmac`'s state is as
    /// good as the key and is not wiped, so it is set up per tag and dropped at once. That
    /// costs two SHA-256 blocks per entry, next to the thousands the payload takes.
    Hmac {
        key: OperatorKey,
        fingerprint: Fingerprint,
    },
}

impl Tagger {
    pub fn new(key: Option<&OperatorKey>) -> Tagger {
        match key {
            None => Tagger::Blake3,
            Some(key) => {
                let derived = blake3::derive_key(FINGERPRINT_CONTEXT, key.bytes());
                let mut fingerprint = [0u8; 8];
                fingerprint.copy_from_slice(&derived[..8]);
                Tagger::Hmac {
                    key: key.duplicate(),
                    fingerprint,
                }
            }
        }
    }

    fn mac(key: &OperatorKey) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(key.bytes()).expect("HMAC accepts keys of any length")
    }

    pub fn algorithm(&self) -> u8 {
        match self {
            Tagger::Blake3 => ALG_BLAKE3,
            Tagger::Hmac { .. } => ALG_HMAC_SHA256,
        }
    }

    pub fn fingerprint(&self) -> Fingerprint {
        match self {
            Tagger::Blake3 => [0; 8],
            Tagger::Hmac { fingerprint, .. } => *fingerprint,
        }
    }

    /// The tag over `parts`, concatenated.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; TAG_LEN] {
        match self {
            Tagger::Blake3 => {
                let mut h = blake3::Hasher::new();
                for p in parts {
                    h.update(p);
                }
                *h.finalize().as_bytes()
            }
            Tagger::Hmac { key, .. } => {
                let mut m = Self::mac(key);
                for p in parts {
                    m.update(p);
                }
                m.finalize().into_bytes().into()
            }
        }
    }

    /// Constant-time comparison of the stored tag with the recomputed one.
    fn verify(&self, body: &[u8], tag: &[u8]) -> bool {
        match self {
            Tagger::Blake3 => {
                let Ok(stored) = <[u8; TAG_LEN]>::try_from(tag) else {
                    return false;
                };
                blake3::hash(body) == blake3::Hash::from_bytes(stored)
            }
            Tagger::Hmac { key, .. } => {
                let mut m = Self::mac(key);
                m.update(body);
                m.verify_slice(tag).is_ok()
            }
        }
    }
}

/// The fields of a header, as read; nothing in it is trusted before the tag is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub algorithm: u8,
    pub schema: u32,
    pub fingerprint: Fingerprint,
    pub key: Key,
    pub payload_len: u64,
    pub build_nanos: u64,
    /// What the entry holds; `None` in format 1, which had no descriptor (and is the only
    /// version encoded without one).
    pub descriptor: Option<Descriptor>,
}

impl Header {
    /// The header's bytes: format 1 when it has no descriptor, else format 2.
    pub fn encode(&self) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&self.version.to_le_bytes());
        h[10] = self.algorithm;
        h[12..16].copy_from_slice(&self.schema.to_le_bytes());
        h[16..24].copy_from_slice(&self.fingerprint);
        h[24..56].copy_from_slice(self.key.as_bytes());
        h[56..64].copy_from_slice(&self.payload_len.to_le_bytes());
        h[64..72].copy_from_slice(&self.build_nanos.to_le_bytes());
        if let Some(descriptor) = &self.descriptor {
            let encoded = descriptor.encode();
            // Within u16: `Descriptor` bounds its fields.
            h.extend_from_slice(&(encoded.len() as u16).to_le_bytes());
            h.extend_from_slice(&encoded);
        }
        h
    }

    /// Bytes the encoded header takes: where the payload starts.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + self
                .descriptor
                .as_ref()
                .map_or(0, |d| DESCRIPTOR_LEN_FIELD + d.encoded_len())
    }

    /// Bytes the entry adds to its payload: header and tag.
    pub fn overhead(&self) -> u64 {
        (self.encoded_len() + TAG_LEN) as u64
    }

    /// Parses the header at the start of `bytes` (which may go on into the payload), or says
    /// why it cannot: bad magic or reserved byte, a version other than 1 and 2, or (format 2)
    /// a descriptor that is cut short or malformed.
    pub fn decode(bytes: &[u8]) -> Result<Header, &'static str> {
        let h: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or("shorter than a header and a tag")?;
        if h[0..8] != MAGIC || h[11] != 0 {
            return Err("bad magic");
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        let descriptor = match version {
            FORMAT_VERSION_1 => None,
            FORMAT_VERSION => Some(decode_descriptor(&bytes[HEADER_LEN..])?),
            _ => return Err("unknown format version"),
        };
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(&h[24..56]);
        let mut fingerprint = [0u8; 8];
        fingerprint.copy_from_slice(&h[16..24]);
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(b)
        };
        Ok(Header {
            version,
            algorithm: h[10],
            schema: u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
            fingerprint,
            key: Key::from_bytes(key),
            payload_len: u64_at(56),
            build_nanos: u64_at(64),
            descriptor,
        })
    }
}

/// The length-prefixed descriptor at the start of `bytes`.
fn decode_descriptor(bytes: &[u8]) -> Result<Descriptor, &'static str> {
    let (len, rest) = bytes
        .split_first_chunk::<DESCRIPTOR_LEN_FIELD>()
        .ok_or("shorter than its descriptor")?;
    let len = usize::from(u16::from_le_bytes(*len));
    if len > descriptor::MAX_ENCODED_LEN {
        return Err("bad descriptor");
    }
    let encoded = rest.get(..len).ok_or("shorter than its descriptor")?;
    Descriptor::decode(encoded).ok_or("bad descriptor")
}

/// What a read expects an entry to be.
pub struct Expect<'a> {
    pub tagger: &'a Tagger,
    pub schema: u32,
    pub key: &'a Key,
}

/// Checks a whole entry file. Returns the header and the payload range, or why it was refused.
pub fn verify(bytes: &[u8], expect: &Expect<'_>) -> Result<Header, &'static str> {
    if bytes.len() < HEADER_LEN + TAG_LEN {
        return Err("shorter than a header and a tag");
    }
    let header = Header::decode(bytes)?;
    if header.algorithm != expect.tagger.algorithm() {
        return Err("tag algorithm differs from the configured one");
    }
    if header.fingerprint != expect.tagger.fingerprint() {
        return Err("written under another operator key");
    }
    if header.payload_len.checked_add(header.overhead()) != Some(bytes.len() as u64) {
        return Err("payload length does not match the file size");
    }
    let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
    if !expect.tagger.verify(body, tag) {
        return Err("tag mismatch");
    }
    // Checked after the tag so a mismatch here means a genuine entry stored under the wrong
    // name (a swapped or copied file), not corruption.
    if header.schema != expect.schema {
        return Err("written under another key schema");
    }
    if header.key != *expect.key {
        return Err("stored key differs from the requested key");
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header of the current format, every field set.
    fn sample() -> Header {
        Header {
            version: FORMAT_VERSION,
            algorithm: ALG_HMAC_SHA256,
            schema: 7,
            fingerprint: [1, 2, 3, 4, 5, 6, 7, 8],
            key: Key::from_bytes([9; 32]),
            payload_len: 1234,
            build_nanos: 5678,
            descriptor: Some(Descriptor::new("opencl", "cpu", "add")),
        }
    }

    #[test]
    fn header_round_trip() {
        let h = sample();
        let bytes = h.encode();
        assert_eq!(bytes.len(), h.encoded_len());
        assert_eq!(bytes.len(), HEADER_LEN + 2 + 6 + 6 + 3 + 3);
        assert_eq!(Header::decode(&bytes), Ok(h.clone()));
        // Cut inside the descriptor: refused, never read past.
        assert!(Header::decode(&bytes[..bytes.len() - 1]).is_err());
        let old = Header {
            version: FORMAT_VERSION_1,
            descriptor: None,
            ..h
        };
        assert_eq!(old.encode().len(), HEADER_LEN);
        assert_eq!(Header::decode(&old.encode()), Ok(old));
    }

    #[test]
    fn unknown_versions_are_refused() {
        let mut bytes = Header {
            version: 3,
            descriptor: None,
            ..sample()
        }
        .encode();
        assert_eq!(Header::decode(&bytes), Err("unknown format version"));
        bytes[8] = 2;
        assert_eq!(Header::decode(&bytes), Err("shorter than its descriptor"));
    }

    #[test]
    fn fingerprints_differ_per_key() {
        let a = Tagger::new(Some(&OperatorKey::new(vec![1u8; 32]).unwrap()));
        let b = Tagger::new(Some(&OperatorKey::new(vec![2u8; 32]).unwrap()));
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), Tagger::Blake3.fingerprint());
    }
}
