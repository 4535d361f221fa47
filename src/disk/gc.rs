//! Collection of what reads never clean up: temporaries of crashed writers, entries of other
//! key schemas, entries of retired operator keys, and corrupt entries nobody asked for since.
//! Only names of kcache's own two patterns are considered; anything else is left alone.

use std::fs::File;
use std::io::Read;
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, Mode, OFlags};

use super::evict::lstat_at;
use super::format::{self, Expect, FORMAT_VERSION, HEADER_LEN, Header, OVERHEAD};
use super::{DiskCache, Fingerprint, Inner, is_temp_name, parse_entry_name};
use crate::error::{Error, Result};
use crate::key::Key;

/// Default age after which a temporary file is taken for a crashed writer's leftover. Far
/// longer than any write takes, so `gc` never pulls a file from under a live writer.
pub const DEFAULT_TEMP_MAX_AGE: Duration = Duration::from_secs(15 * 60);

/// What one `gc` run removed, by reason, and how many entries it kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub temp_files: u64,
    pub stale_schema: u64,
    pub stale_fingerprint: u64,
    pub corrupt: u64,
    pub kept: u64,
    pub bytes_freed: u64,
}

enum Verdict {
    Keep,
    StaleSchema,
    StaleFingerprint,
    Corrupt,
}

impl DiskCache {
    /// Sweeps the directory. Entries whose key fingerprint is neither this cache's nor in
    /// `retain` are removed (after a key rotation, pass the fingerprints still in use by
    /// other processes, or nothing). Entries of this cache's key are fully verified; entries
    /// of retained foreign keys can only be checked for structure. Temporary files older than
    /// `temp_older_than` are removed.
    pub fn gc(&self, retain: &[Fingerprint], temp_older_than: Duration) -> Result<GcReport> {
        let inner = &self.inner;
        let dir = rustix::fs::Dir::read_from(&inner.dir)
            .map_err(|e| Error::Io(format!("cannot list {}: {e}", inner.path.display())))?;
        let mut report = GcReport::default();
        let now = SystemTime::now();
        for entry in dir.flatten() {
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if is_temp_name(name) {
                let Ok(meta) = lstat_at(&inner.dir, name) else {
                    continue;
                };
                let age = meta
                    .modified()
                    .map_or(Duration::MAX, |m| now.duration_since(m).unwrap_or_default());
                if age >= temp_older_than && unlink(inner, name) {
                    report.temp_files += 1;
                    report.bytes_freed += meta.len();
                }
                continue;
            }
            let Some((fingerprint, key)) = parse_entry_name(name) else {
                continue;
            };
            let size = lstat_at(&inner.dir, name).map_or(0, |m| m.len());
            let counter = match classify(inner, name, fingerprint, &key, retain) {
                Verdict::Keep => {
                    report.kept += 1;
                    continue;
                }
                Verdict::StaleSchema => &mut report.stale_schema,
                Verdict::StaleFingerprint => &mut report.stale_fingerprint,
                Verdict::Corrupt => &mut report.corrupt,
            };
            if unlink(inner, name) {
                *counter += 1;
                report.bytes_freed += size;
            }
        }
        Ok(report)
    }

    /// The distinct key fingerprints of the entries in the directory: one per operator key
    /// generation that has written entries (all zero for unkeyed entries).
    pub fn fingerprints(&self) -> Result<Vec<Fingerprint>> {
        let inner = &self.inner;
        let dir = rustix::fs::Dir::read_from(&inner.dir)
            .map_err(|e| Error::Io(format!("cannot list {}: {e}", inner.path.display())))?;
        let mut found: Vec<Fingerprint> = dir
            .flatten()
            .filter_map(|e| parse_entry_name(e.file_name().to_str().ok()?).map(|(fp, _)| fp))
            .collect();
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }
}

fn unlink(inner: &Inner, name: &str) -> bool {
    inner.index.forget(name);
    rustix::fs::unlinkat(&inner.dir, name, AtFlags::empty()).is_ok()
}

fn classify(
    inner: &Inner,
    name: &str,
    fingerprint: Fingerprint,
    key: &Key,
    retain: &[Fingerprint],
) -> Verdict {
    let active = inner.tagger.fingerprint();
    if fingerprint != active && !retain.contains(&fingerprint) {
        return Verdict::StaleFingerprint;
    }
    let Ok(fd) = rustix::fs::openat(
        &inner.dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        // A symlink (ELOOP) is not an entry; an entry removed meanwhile is gone anyway.
        return Verdict::Corrupt;
    };
    let mut file = File::from(fd);
    let Ok(meta) = file.metadata() else {
        return Verdict::Keep;
    };
    if !meta.is_file() || meta.len() < OVERHEAD {
        return Verdict::Corrupt;
    }
    let mut head = [0u8; HEADER_LEN];
    if file.read_exact(&mut head).is_err() {
        return Verdict::Corrupt;
    }
    let Some(header) = Header::decode(&head) else {
        return Verdict::Corrupt;
    };
    if header.version != FORMAT_VERSION
        || header.fingerprint != fingerprint
        || header.key != *key
        || header.payload_len.checked_add(OVERHEAD) != Some(meta.len())
    {
        return Verdict::Corrupt;
    }
    if header.schema != inner.schema {
        return Verdict::StaleSchema;
    }
    if fingerprint != active {
        return Verdict::Keep;
    }
    if meta.len() > inner.max_size {
        // Unreadable under the current cap, so only taking space.
        return Verdict::Corrupt;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    bytes.extend_from_slice(&head);
    if file.read_to_end(&mut bytes).is_err() {
        return Verdict::Corrupt;
    }
    let expect = Expect {
        tagger: &inner.tagger,
        schema: inner.schema,
        key,
    };
    match format::verify(&bytes, &expect) {
        Ok(_) => Verdict::Keep,
        Err(_) => Verdict::Corrupt,
    }
}
