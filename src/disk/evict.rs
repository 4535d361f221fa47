//! The size cap. An in-memory index of entry files, ordered by recency, answers "how big is
//! the directory" and "which entry was used least recently" without a scan.
//!
//! Recency is the file's mtime: a write sets it, and a read that finds it older than
//! [`TOUCH_GRANULARITY`] sets it to now. Being in the file rather than in this index, it is
//! shared by every process using the directory. The index is seeded by a scan on a background
//! thread after `open`, rescanned the same way once this process has written a quarter of
//! the cap (so other processes' writes are counted too), and otherwise updated in place by
//! `put`, `remove` and reads. Before an entry is evicted its mtime is checked again, so an
//! entry another process read since is kept.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::Metadata;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use rustix::fs::{AtFlags, Mode, OFlags};

use super::{Inner, Usage, bump, parse_entry_name};

/// A read refreshes an entry's mtime only when it is older than this: one metadata write a
/// minute per hot entry, not one per read.
pub const TOUCH_GRANULARITY: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct Index {
    state: Mutex<State>,
    seeded: Condvar,
}

#[derive(Default)]
struct State {
    seeded: bool,
    scanning: bool,
    /// Bumped when a scan starts; entries recorded during a scan carry the new value and
    /// survive the scan's replacement of the map.
    epoch: u64,
    files: HashMap<String, Tracked>,
    order: BTreeSet<(u64, String)>,
    total: u64,
    written_since_scan: u64,
    /// Names removed while a scan runs: the scan may have listed them before they went.
    removed_during_scan: HashSet<String>,
}

struct Tracked {
    size: u64,
    recency: u64,
    epoch: u64,
}

impl State {
    fn insert(&mut self, name: String, size: u64, recency: u64) {
        self.remove(&name);
        if self.scanning {
            self.removed_during_scan.remove(&name);
        }
        self.order.insert((recency, name.clone()));
        self.total += size;
        let epoch = self.epoch;
        self.files.insert(
            name,
            Tracked {
                size,
                recency,
                epoch,
            },
        );
    }

    fn remove(&mut self, name: &str) {
        if let Some(t) = self.files.remove(name) {
            self.order.remove(&(t.recency, name.to_owned()));
            self.total -= t.size;
        }
    }

    /// The file is gone from the directory, not just from the index.
    fn unlinked(&mut self, name: &str) {
        self.remove(name);
        if self.scanning {
            self.removed_during_scan.insert(name.to_owned());
        }
    }
}

pub(super) fn nanos_since_epoch(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `lstat` relative to the directory descriptor.
pub(super) fn lstat_at(dir: &OwnedFd, name: &str) -> io::Result<Metadata> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    std::fs::File::from(fd).metadata()
}

impl Index {
    pub(super) fn known_usage(&self) -> Usage {
        let s = self.state.lock();
        Usage {
            entries: s.files.len() as u64,
            bytes: s.total,
        }
    }

    pub(super) fn wait_seeded(&self) {
        let mut s = self.state.lock();
        while !s.seeded {
            self.seeded.wait(&mut s);
        }
    }

    /// A put replaced or created `name`; evicts what the cap requires.
    pub(super) fn record(inner: &Arc<Inner>, name: String, meta: &Metadata) {
        let index = &inner.index;
        let rescan = {
            let mut s = index.state.lock();
            let recency = meta.modified().map_or(0, nanos_since_epoch);
            s.insert(name, meta.len(), recency);
            s.written_since_scan += meta.len();
            if s.seeded {
                evict_over_cap(inner, &mut s);
            }
            s.seeded && !s.scanning && s.written_since_scan > inner.max_size / 4
        };
        if rescan {
            start_scan(inner);
        }
    }

    pub(super) fn touch(&self, name: &str, recency: u64) {
        let mut s = self.state.lock();
        if let Some(size) = s.files.get(name).map(|t| t.size) {
            s.insert(name.to_owned(), size, recency);
        }
    }

    pub(super) fn forget(&self, name: &str) {
        self.state.lock().unlinked(name);
    }
}

/// Evicts least recently used entries until the total fits the cap. Each victim costs one
/// `lstat` and one `unlink`: no scan.
fn evict_over_cap(inner: &Inner, s: &mut State) {
    while s.total > inner.max_size {
        let Some((recency, name)) = s.order.first().cloned() else {
            break;
        };
        match lstat_at(&inner.dir, &name) {
            Ok(meta) if meta.is_file() => {
                let actual = meta.modified().map_or(0, nanos_since_epoch);
                if actual > recency {
                    // Read (or rewritten) by another process since we last looked.
                    s.insert(name, meta.len(), actual);
                    continue;
                }
                if rustix::fs::unlinkat(&inner.dir, name.as_str(), AtFlags::empty()).is_ok() {
                    bump(&inner.counters.evictions, 1);
                }
            }
            // Gone, or no longer a regular file: only stop counting it.
            _ => {}
        }
        s.unlinked(&name);
    }
}

/// Starts a scan of the directory on a background thread unless one is running.
pub(super) fn start_scan(inner: &Arc<Inner>) {
    let epoch = {
        let mut s = inner.index.state.lock();
        if s.scanning {
            return;
        }
        s.scanning = true;
        s.epoch += 1;
        s.epoch
    };
    let background = Arc::clone(inner);
    let spawned = std::thread::Builder::new()
        .name("kcache-disk-scan".into())
        .spawn(move || scan(&background, epoch));
    if spawned.is_err() {
        // No thread to be had: pay for the scan here rather than never enforcing the cap.
        scan(inner, epoch);
    }
}

fn scan(inner: &Inner, epoch: u64) {
    let mut found = Vec::new();
    if let Ok(dir) = rustix::fs::Dir::read_from(&inner.dir) {
        for entry in dir.flatten() {
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if parse_entry_name(name).is_none() {
                continue;
            }
            if let Ok(meta) = lstat_at(&inner.dir, name) {
                if meta.is_file() {
                    let recency = meta.modified().map_or(0, nanos_since_epoch);
                    found.push((name.to_owned(), meta.len(), recency));
                }
            }
        }
    }
    let mut s = inner.index.state.lock();
    let recent: Vec<(String, u64, u64)> = s
        .files
        .iter()
        .filter(|(_, t)| t.epoch == epoch)
        .map(|(n, t)| (n.clone(), t.size, t.recency))
        .collect();
    let removed = std::mem::take(&mut s.removed_during_scan);
    s.scanning = false;
    s.files.clear();
    s.order.clear();
    s.total = 0;
    let listed = found
        .into_iter()
        .filter(|(name, _, _)| !removed.contains(name));
    for (name, size, recency) in listed.chain(recent) {
        s.insert(name, size, recency);
    }
    s.seeded = true;
    s.written_since_scan = 0;
    evict_over_cap(inner, &mut s);
    drop(s);
    inner.index.seeded.notify_all();
}
