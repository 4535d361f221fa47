//! `kcache inspect`: one entry, named by file name or key, and its header.

use std::time::{Duration, SystemTime};

use kcache::Persistence;
use kcache::disk::format::ALG_BLAKE3;
use kcache::disk::{Check, EntryInfo};
use serde::Serialize;

use super::ls::{EntryJson, entry_json};
use super::{SCHEMA, Target, hex};
use crate::{Failure, report};

#[derive(Serialize)]
struct InspectJson {
    schema: u32,
    #[serde(flatten)]
    entry: EntryJson,
    header: Option<HeaderJson>,
}

#[derive(Serialize)]
struct HeaderJson {
    format_version: u16,
    tag: &'static str,
    key_schema: u32,
    fingerprint: String,
    key: String,
    payload_len: u64,
    build_time_ns: u64,
}

/// Finds the entry `spec` names: an entry file name, or a key (or a unique prefix of one) in
/// hex, of any key generation.
fn find_entry(cache: &Persistence, spec: &str) -> Result<EntryInfo, Failure> {
    if spec.ends_with(".kce") {
        return cache.entry(spec)?.ok_or_else(|| {
            Failure::usage(format!("no entry {spec} in {}", cache.path().display()))
        });
    }
    let prefix = spec.to_ascii_lowercase();
    if prefix.is_empty() || prefix.len() > 64 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Failure::usage(format!(
            "{spec:?} is neither an entry file name nor a key in hex"
        )));
    }
    let mut found: Vec<EntryInfo> = cache
        .entries()?
        .into_iter()
        .filter(|e| e.key.to_hex().starts_with(&prefix))
        .collect();
    match found.len() {
        0 => Err(Failure::usage(format!(
            "no entry whose key starts with {prefix} in {}",
            cache.path().display()
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(Failure::usage(format!(
            "{prefix} names {} entries; give more of the key or a file name: {}",
            found.len(),
            found
                .iter()
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `kcache inspect`: exit status 1 when the entry is corrupt.
pub fn inspect(target: &Target, spec: &str, json: bool) -> Result<u8, Failure> {
    let (cache, _) = target.open()?;
    let entry = find_entry(&cache, spec)?;
    let check = cache.check(&entry);
    if check == Check::Gone {
        return Err(Failure::usage(format!(
            "{} was removed or replaced while read",
            entry.name
        )));
    }
    let header = match &check {
        Check::Verified(h) | Check::StaleSchema(h) | Check::OtherKey(h) => Some(HeaderJson {
            format_version: h.version,
            tag: if h.algorithm == ALG_BLAKE3 {
                "blake3"
            } else {
                "hmac-sha256"
            },
            key_schema: h.schema,
            fingerprint: hex(&h.fingerprint),
            key: h.key.to_hex(),
            payload_len: h.payload_len,
            build_time_ns: h.build_nanos,
        }),
        Check::Corrupt(_) | Check::Gone => None,
    };
    let status = u8::from(matches!(check, Check::Corrupt(_)));
    let out = InspectJson {
        schema: SCHEMA,
        entry: entry_json(&cache, &entry, &check),
        header,
    };
    if json {
        report::json(&out);
        return Ok(status);
    }
    let verdict = match &check {
        Check::Verified(_) => "verified: tag checked with this process's key".to_owned(),
        Check::StaleSchema(_) => {
            "verified, but written under another key schema: unreachable, gc removes it".into()
        }
        Check::OtherKey(_) => {
            "another key generation: structure checked, tag not (this process lacks its key)".into()
        }
        Check::Corrupt(reason) => format!("corrupt: {reason}"),
        Check::Gone => unreachable!("returned above"),
    };
    use report::printable;
    out!("file:           {}", printable(&entry.name));
    out!("size:           {}", report::size_and_bytes(entry.size));
    out!(
        "last used:      {} (written or read)",
        report::time(entry.modified, SystemTime::now())
    );
    out!("status:         {verdict}");
    out!("backend:        {}", printable(&out.entry.backend));
    if let (Some(device), Some(name)) = (&out.entry.device, &out.entry.entry_name) {
        out!("device:         {}", printable(device));
        out!("name:           {}", printable(name));
    }
    if let Some(h) = &out.header {
        out!("format version: {}", h.format_version);
        out!("tag:            {}", h.tag);
        out!("key schema:     {}", h.key_schema);
        out!("fingerprint:    {}", h.fingerprint);
        out!("key:            {}", h.key);
        out!("payload:        {}", report::size_and_bytes(h.payload_len));
        out!(
            "build time:     {}",
            report::duration(Duration::from_nanos(h.build_time_ns))
        );
    }
    Ok(status)
}
