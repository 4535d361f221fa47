//! The entry format (`docs/disk-format.md` is the prose version).
//!
//! ```text
//! offset  size  field
//!      0     8  magic            89 4B 43 41 43 48 45 0A  ("\x89KCACHE\n")
//!      8     2  format version   u16 little-endian, currently 1
//!     10     1  tag algorithm    1 = BLAKE3 checksum, 2 = HMAC-SHA256
//!     11     1  reserved         0
//!     12     4  key schema       u32 little-endian
//!     16     8  key-id fingerprint (all zero for BLAKE3 entries)
//!     24    32  full key
//!     56     8  payload length   u64 little-endian
//!     64     8  build time       u64 little-endian, nanoseconds
//!     72     n  payload
//!   72+n    32  tag over bytes [0, 72+n)
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::config::OperatorKey;
use crate::key::{KEY_LEN, Key};

pub const MAGIC: [u8; 8] = *b"\x89KCACHE\n";
pub const FORMAT_VERSION: u16 = 1;
pub const HEADER_LEN: usize = 72;
pub const TAG_LEN: usize = 32;
/// Bytes an entry adds to its payload.
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub algorithm: u8,
    pub schema: u32,
    pub fingerprint: Fingerprint,
    pub key: Key,
    pub payload_len: u64,
    pub build_nanos: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&self.version.to_le_bytes());
        h[10] = self.algorithm;
        h[12..16].copy_from_slice(&self.schema.to_le_bytes());
        h[16..24].copy_from_slice(&self.fingerprint);
        h[24..56].copy_from_slice(self.key.as_bytes());
        h[56..64].copy_from_slice(&self.payload_len.to_le_bytes());
        h[64..72].copy_from_slice(&self.build_nanos.to_le_bytes());
        h
    }

    /// Parses the fixed header; `None` when the magic or reserved byte is wrong.
    pub fn decode(bytes: &[u8]) -> Option<Header> {
        let h: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
        if h[0..8] != MAGIC || h[11] != 0 {
            return None;
        }
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(&h[24..56]);
        let mut fingerprint = [0u8; 8];
        fingerprint.copy_from_slice(&h[16..24]);
        Some(Header {
            version: u16::from_le_bytes([h[8], h[9]]),
            algorithm: h[10],
            schema: u32::from_le_bytes(h[12..16].try_into().ok()?),
            fingerprint,
            key: Key::from_bytes(key),
            payload_len: u64::from_le_bytes(h[56..64].try_into().ok()?),
            build_nanos: u64::from_le_bytes(h[64..72].try_into().ok()?),
        })
    }
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
    let header = Header::decode(bytes).ok_or("bad magic")?;
    if header.version != FORMAT_VERSION {
        return Err("unknown format version");
    }
    if header.algorithm != expect.tagger.algorithm() {
        return Err("tag algorithm differs from the configured one");
    }
    if header.fingerprint != expect.tagger.fingerprint() {
        return Err("written under another operator key");
    }
    if header.payload_len != (bytes.len() - HEADER_LEN - TAG_LEN) as u64 {
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

    #[test]
    fn header_round_trip() {
        let h = Header {
            version: FORMAT_VERSION,
            algorithm: ALG_HMAC_SHA256,
            schema: 7,
            fingerprint: [1, 2, 3, 4, 5, 6, 7, 8],
            key: Key::from_bytes([9; 32]),
            payload_len: 1234,
            build_nanos: 5678,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
    }

    #[test]
    fn fingerprints_differ_per_key() {
        let a = Tagger::new(Some(&OperatorKey::new(vec![1u8; 32]).unwrap()));
        let b = Tagger::new(Some(&OperatorKey::new(vec![2u8; 32]).unwrap()));
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), Tagger::Blake3.fingerprint());
    }
}
