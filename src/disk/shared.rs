//! The disk tier's side of the remote tier (`crate::remote`): entries go to the remote sealed
//! exactly as on disk, and come back verified exactly as a disk read is, so the remote is
//! trusted no more than the directory.

use std::sync::Arc;
use std::time::Duration;

use super::{DiskCache, Entry, Inner, store};
use crate::key::Key;
use crate::log;
use crate::remote::RemoteStats;

impl DiskCache {
    /// The remote tier's counters since `open` or the last reset; `None` without a remote.
    pub fn remote_stats(&self) -> Option<RemoteStats> {
        self.inner.remote.as_ref().map(|r| r.stats())
    }

    /// The verified entry for `key` from the remote tier, if it has one; it is then written to
    /// the disk on the background writer, so that the next process on this node reads it there.
    pub(crate) fn fetch_remote(&self, key: &Key) -> Option<Entry> {
        let inner = &self.inner;
        let remote = inner.remote.as_ref()?;
        let name = inner.entry_name(key);
        let entry = remote.fetch(&name, |bytes| {
            store::verified(inner, key, bytes).map_err(str::to_owned)
        })?;
        let backfill = entry.clone();
        let writer = Arc::clone(inner);
        let key = *key;
        inner.writer.submit(move || {
            let written = store::put(&writer, &key, backfill.payload(), backfill.build_time());
            if let Err(e) = written {
                log::info(|| format!("disk copy of remote entry {name} failed: {e}"));
            }
        });
        Some(entry)
    }
}

/// Writes a built value's entry, just published on disk, to the remote tier too.
pub(super) fn share(inner: &Inner, key: &Key, payload: &[u8], build_time: Duration) {
    let Some(remote) = &inner.remote else {
        return;
    };
    let (header, tag) = store::seal(inner, key, payload, build_time);
    remote.store(
        &inner.entry_name(key),
        &[&header[..], payload, &tag].concat(),
    );
}
