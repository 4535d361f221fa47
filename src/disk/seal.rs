//! What makes a payload an entry, and what a read checks: the header and tag written under
//! the operator key, and their verification. One `Sealer` serves the directory and every
//! store behind it, so an entry is sealed once the same way wherever it goes and is trusted
//! nowhere more than in the directory.

use std::time::Duration;

use super::format::{self, Expect, FORMAT_VERSION, Header, TAG_LEN, Tagger};
use super::{Descriptor, ENTRY_SUFFIX, Entry, OperatorKey};
use crate::key::{Key, hex};

/// Seals and verifies the entries of one operator key and key schema.
pub(crate) struct Sealer {
    tagger: Tagger,
    schema: u32,
    fingerprint_hex: String,
}

impl Sealer {
    pub(crate) fn new(key: Option<&OperatorKey>, schema: u32) -> Sealer {
        let tagger = Tagger::new(key);
        Sealer {
            fingerprint_hex: hex(&tagger.fingerprint()),
            tagger,
            schema,
        }
    }

    pub(crate) fn tagger(&self) -> &Tagger {
        &self.tagger
    }

    pub(crate) fn schema(&self) -> u32 {
        self.schema
    }

    /// The name of the entry for `key`, in the directory and in every store:
    /// `<fingerprint hex 16>-<key hex 64>.kce`.
    pub(crate) fn entry_name(&self, key: &Key) -> String {
        format!("{}-{}{ENTRY_SUFFIX}", self.fingerprint_hex, key.to_hex())
    }

    /// The header and tag that make `payload` the entry for `key`.
    pub(crate) fn seal(
        &self,
        key: &Key,
        payload: &[u8],
        build_time: Duration,
        descriptor: &Descriptor,
    ) -> (Vec<u8>, [u8; TAG_LEN]) {
        let header = Header {
            version: FORMAT_VERSION,
            algorithm: self.tagger.algorithm(),
            schema: self.schema,
            fingerprint: self.tagger.fingerprint(),
            key: *key,
            payload_len: payload.len() as u64,
            build_nanos: u64::try_from(build_time.as_nanos()).unwrap_or(u64::MAX),
            descriptor: Some(descriptor.clone()),
        }
        .encode();
        let tag = self.tagger.tag(&[&header, payload]);
        (header, tag)
    }

    /// The whole entry for `key`: header, `payload`, tag.
    pub(crate) fn sealed(
        &self,
        key: &Key,
        payload: &[u8],
        build_time: Duration,
        descriptor: &Descriptor,
    ) -> Vec<u8> {
        let (header, tag) = self.seal(key, payload, build_time, descriptor);
        [&header[..], payload, &tag].concat()
    }

    /// `bytes` as the verified entry for `key`, or why they are refused: the check of every
    /// read, from the directory or from a store behind it.
    pub(crate) fn verify(&self, key: &Key, bytes: Vec<u8>) -> Result<Entry, &'static str> {
        let expect = Expect {
            tagger: &self.tagger,
            schema: self.schema,
            key,
        };
        let header = format::verify(&bytes, &expect)?;
        Ok(Entry {
            payload_start: header.encoded_len(),
            build_time: Duration::from_nanos(header.build_nanos),
            descriptor: header.descriptor,
            bytes,
        })
    }
}
