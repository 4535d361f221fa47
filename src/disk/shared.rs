//! The disk tier's side of the remote tier (`crate::remote`): entries go to the remote sealed
//! exactly as on disk, and come back verified exactly as a disk read is, so the remote is
//! trusted no more than the directory.

use std::sync::Arc;
use std::time::Duration;

use super::{Descriptor, Entry, Inner, KeyLock, Persistence, store};
use crate::key::Key;
use crate::log;
use crate::remote::{Flight, RemoteStats};

impl Persistence {
    /// The remote tier's counters since `open` or the last reset; `None` without a remote.
    pub fn remote_stats(&self) -> Option<RemoteStats> {
        self.inner.remote.as_ref().map(|r| r.stats())
    }

    /// The verified entry for `key` from the remote tier, if it has one.
    pub(crate) fn fetch_remote(&self, key: &Key) -> Option<Entry> {
        let inner = &self.inner;
        let remote = inner.remote.as_ref()?;
        remote.fetch(&inner.entry_name(key), |bytes| {
            inner.sealer.verify(key, bytes).map_err(str::to_owned)
        })
    }

    /// Whether entries written here go to a remote tier too (there is one, not read-only).
    pub(crate) fn shares(&self) -> bool {
        self.inner.remote.as_ref().is_some_and(|r| r.writes())
    }

    /// Writes `payload`, already the disk's entry for `key`, to the remote tier on the
    /// background writer, as a built value's entry is (Vulkan's pipeline-cache data, which is
    /// written to disk by its own read-merge-write).
    pub(crate) fn share_later(
        &self,
        key: &Key,
        payload: Vec<u8>,
        build_time: Duration,
        descriptor: Descriptor,
    ) {
        let inner = Arc::clone(&self.inner);
        let key = *key;
        self.inner
            .writer
            .submit(move || share(&inner, &key, &payload, build_time, &descriptor));
    }

    /// After a miss everywhere: lead the build of `key` for every node sharing the remote, or
    /// get the entry another node built meanwhile, or build without a lease (see
    /// `remote::lease`). Without a remote tier: build.
    pub(crate) fn remote_flight(&self, key: &Key) -> Flight<Entry> {
        let inner = &self.inner;
        let Some(remote) = &inner.remote else {
            return Flight::Build;
        };
        remote.flight(&inner.entry_name(key), |bytes| {
            inner.sealer.verify(key, bytes).map_err(str::to_owned)
        })
    }

    /// Writes a remote entry that was loaded to the disk on the background writer, so that
    /// the next process of this node reads it there, then releases `lock` (the processes of
    /// this node waiting for it then read the entry).
    pub(crate) fn backfill(&self, key: &Key, entry: Entry, lock: Option<KeyLock>) {
        let inner = Arc::clone(&self.inner);
        let key = *key;
        self.inner.writer.submit(move || {
            let descriptor = entry.descriptor().cloned().unwrap_or_default();
            let written = store::put(
                &inner,
                &key,
                entry.payload(),
                entry.build_time(),
                &descriptor,
            );
            if let Err(e) = written {
                log::info(|| format!("disk copy of a remote entry failed: {e}"));
                if let Some(lock) = &lock {
                    lock.abandon();
                }
            }
            drop(lock);
        });
    }
}

/// Writes a built value's entry, just published on disk, to the remote tier too.
pub(super) fn share(
    inner: &Inner,
    key: &Key,
    payload: &[u8],
    build_time: Duration,
    descriptor: &Descriptor,
) {
    let Some(remote) = &inner.remote else {
        return;
    };
    remote.store(
        &inner.entry_name(key),
        &inner.sealer.sealed(key, payload, build_time, descriptor),
    );
}
