//! Collection of what reads never clean up: temporaries of crashed writers, lock files of
//! processes that died building, entries of other key schemas, entries of retired operator
//! keys, entries of format 1 (which do not say what they hold), and corrupt entries nobody
//! asked for since.
//! Only names of kcache's own patterns are considered; anything else is left alone. Whatever
//! is at one of them but should not be (a directory, a link, a FIFO) is removed, a directory
//! with everything in it, never following a link; what cannot be removed (a tree deeper than
//! [`MAX_REMOVE_DEPTH`](super::dir::MAX_REMOVE_DEPTH), a permission error) is counted in
//! `undeletable` and the sweep goes on.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime};

use super::evict::{Index, Unlinked, lstat_at};
use super::listing::{Check, EntryInfo};
use super::{Fingerprint, Inner, Persistence, is_temp_name, lock, parse_entry_name};
use crate::error::{Error, Result};

/// Default age after which a temporary file is taken for a crashed writer's leftover. Far
/// longer than any write takes, so `gc` never pulls a file from under a live writer.
pub const DEFAULT_TEMP_MAX_AGE: Duration = Duration::from_secs(15 * 60);

crate::stats::statistics! {
    /// What one `gc` run removed, by reason, and how many entries it kept.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct GcReport {
        event temp_files,
        event stale_schema,
        event stale_fingerprint,
        event corrupt,
        event kept,
        event bytes_freed,
        /// Lock files nobody held (left by processes that died building), and anything but a
        /// regular file at a lock file's name (a directory with everything in it); held ones are
        /// kept.
        event lock_files,
        /// Entries of format 1: reads accept them, but they carry no descriptor, so `gc` removes
        /// them and the next build writes them again with one.
        event old_format,
        /// Files and directories that should have gone but could not be removed (a directory
        /// tree too deep, a permission error, …): left in place.
        event undeletable,
    }
}

enum Verdict {
    Keep,
    OldFormat,
    StaleSchema,
    StaleFingerprint,
    Corrupt,
}

impl Persistence {
    /// Sweeps the directory. Entries whose key fingerprint is neither this cache's nor in
    /// `retain` are removed (after a key rotation, pass the fingerprints still in use by
    /// other processes, or nothing). Entries of this cache's key are fully verified; entries
    /// of retained foreign keys can only be checked for structure; no file is read past
    /// [`Persistence::max_entry_size`]. Anything at an entry name but a regular file is corrupt
    /// (removed, a directory with everything in it; what cannot be is counted in
    /// `undeletable`). Temporary files older than `temp_older_than` are removed, and lock
    /// files nobody holds, and anything but a regular file at a lock file's name.
    /// Entries of format 1 that would be kept are removed (`old_format`): they do not say what
    /// they hold.
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
                if age >= temp_older_than {
                    remove(inner, name, &meta, &mut report, |r| &mut r.temp_files);
                }
                continue;
            }
            if lock::entry_of_lock(name).is_some() {
                if lock::remove_idle(inner, name) {
                    report.lock_files += 1;
                } else if let Ok(meta) = lstat_at(&inner.dir, name) {
                    // No lock can be taken on a directory or a link planted there: gone too.
                    if !meta.is_file() {
                        remove(inner, name, &meta, &mut report, |r| &mut r.lock_files);
                    }
                }
                continue;
            }
            let Some((fingerprint, key)) = parse_entry_name(name) else {
                continue;
            };
            let Ok(meta) = lstat_at(&inner.dir, name) else {
                continue;
            };
            let listed = EntryInfo::new(name, fingerprint, key, &meta);
            let counter: fn(&mut GcReport) -> &mut u64 = match classify(self, &listed, retain) {
                Verdict::Keep => {
                    report.kept += 1;
                    continue;
                }
                Verdict::OldFormat => |r| &mut r.old_format,
                Verdict::StaleSchema => |r| &mut r.stale_schema,
                Verdict::StaleFingerprint => |r| &mut r.stale_fingerprint,
                Verdict::Corrupt => |r| &mut r.corrupt,
            };
            remove(inner, name, &meta, &mut report, counter);
        }
        Ok(report)
    }

    /// The distinct key fingerprints of the entries in the directory, in ascending byte order:
    /// one per operator key generation that has written entries (all zero for unkeyed
    /// entries).
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

/// Removes what `meta` describes at `name` (unless a writer replaced it since) and counts it
/// under `counter`, or as undeletable.
fn remove(
    inner: &Inner,
    name: &str,
    meta: &Metadata,
    report: &mut GcReport,
    counter: fn(&mut GcReport) -> &mut u64,
) {
    match Index::unlink(inner, name, Some(meta.ino())) {
        Ok(Unlinked::Removed) => {
            *counter(report) += 1;
            if meta.is_file() {
                report.bytes_freed += meta.len();
            }
        }
        Ok(Unlinked::Gone | Unlinked::Replaced) => {}
        Err(_) => report.undeletable += 1,
    }
}

/// Judges a listed entry: another key generation not retained is stale unread; the rest is
/// checked as [`Persistence::check`] does (fully for this cache's key, structure only for
/// retained ones), and a file that changed since it was listed is left to the next run.
fn classify(cache: &Persistence, entry: &EntryInfo, retain: &[Fingerprint]) -> Verdict {
    let inner = &cache.inner;
    if entry.fingerprint != inner.sealer.tagger().fingerprint()
        && !retain.contains(&entry.fingerprint)
    {
        return Verdict::StaleFingerprint;
    }
    match cache.check(entry) {
        Check::Gone => Verdict::Keep,
        Check::StaleSchema(_) => Verdict::StaleSchema,
        Check::OtherKey(header) if header.schema != inner.sealer.schema() => Verdict::StaleSchema,
        Check::Verified(header) | Check::OtherKey(header) if header.descriptor.is_none() => {
            Verdict::OldFormat
        }
        Check::Verified(_) | Check::OtherKey(_) => Verdict::Keep,
        Check::Corrupt(_) => Verdict::Corrupt,
    }
}
