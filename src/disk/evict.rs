//! The size cap and the file-count cap. An in-memory index of entry files, ordered by recency,
//! answers "how big is the directory", "how many entries does it hold" and "which entry was
//! used least recently" without a scan.
//!
//! Recency is the file's mtime: a write sets it, and a read that finds it older than
//! [`TOUCH_GRANULARITY`] sets it to now. Being in the file rather than in this index, it is
//! shared by every process using the directory. The index is seeded by a scan on a background
//! thread after `open`, rescanned the same way once this process has written a quarter of
//! either cap (so other processes' writes are counted too), and otherwise updated in place by
//! `put`, `remove` and reads. Before an entry is evicted its mtime is checked again, so an
//! entry another process read since is kept.
//!
//! Every change this process makes to the directory's entry names (the rename that publishes
//! a write, every unlink) happens under the index's lock together with the index update, so
//! the index never disagrees with what this process did: with no other process writing, it is
//! exact whenever no call is in flight. Only those single metadata calls are serialized; the
//! data of a write and of a read, and the fsyncs, happen outside the lock.
//!
//! A forked child inherits the index but not a scan running in its parent: the first wait for
//! the scan, or the next rescan, starts the child's own. Nor does it inherit the index's lock
//! held: every section that holds it is one that a fork waits for ([`process::unforked`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::Metadata;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::dir::remove_any;
use super::{Inner, Usage, bump, parse_entry_name};
use crate::ffi::process;
use crate::log;

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
    /// The fork generation ([`process::fork_generation`]) of the process whose thread scans.
    scanned_in: u64,
    /// Bumped when a scan starts; entries recorded during a scan carry the new value and
    /// survive the scan's replacement of the map.
    epoch: u64,
    files: HashMap<String, Tracked>,
    order: BTreeSet<(u64, String)>,
    total: u64,
    written_since_scan: u64,
    files_written_since_scan: u64,
    /// Names removed while a scan runs: the scan may have listed them before they went.
    removed_during_scan: HashSet<String>,
}

struct Tracked {
    size: u64,
    recency: u64,
    epoch: u64,
}

impl State {
    /// A scan runs in this process: not only in the parent this process was forked from.
    fn scan_running(&self) -> bool {
        self.scanning && self.scanned_in == process::fork_generation()
    }

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

/// What [`Index::unlink`] found at the name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unlinked {
    /// Removed (a file, or a directory and everything in it).
    Removed,
    /// Nothing there any more.
    Gone,
    /// Another file than the expected one: a writer replaced it meanwhile; left alone.
    Replaced,
}

impl Index {
    /// The index's state. No code panics while holding it.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the index knows of the directory, and whether the opening scan has finished.
    pub(super) fn known_usage(&self) -> (Usage, bool) {
        let _unforked = process::unforked();
        let s = self.state();
        let usage = Usage {
            entries: s.files.len() as u64,
            bytes: s.total,
        };
        (usage, s.seeded)
    }
}

/// How long a wait for the opening scan holds its section at a time: a fork waits this long,
/// at most, for a waiter.
const SEEDED_RECHECK: Duration = Duration::from_millis(5);

/// Waits for the scan that seeds the index; starts it in a forked child whose parent was
/// scanning (the scan's thread stayed in the parent).
///
/// The lock and the condition variable are the standard library's, held and waited on only
/// inside [`process::unforked`] sections, a short wait at a time: a fork then never leaves a
/// child the lock held, nor a waiter of its parent's on the condition (parking_lot's, whose
/// waiters sit in a table the whole process shares, would: the child's notification went to a
/// parent's thread that is not in the child, and the child's writer waited forever; seen: one
/// run in forty of the fork test).
pub(super) fn wait_seeded(inner: &Arc<Inner>) {
    loop {
        {
            let _unforked = process::unforked();
            let s = inner.index.state();
            if s.seeded {
                return;
            }
            if s.scan_running() {
                let (s, _) = inner
                    .index
                    .seeded
                    .wait_timeout(s, SEEDED_RECHECK)
                    .unwrap_or_else(PoisonError::into_inner);
                if s.seeded {
                    return;
                }
                continue;
            }
        }
        start_scan(inner);
    }
}

impl Index {
    /// Publishes a written temporary file `temp` (described by `meta`) under `name`: first
    /// evicts what the cap requires to make room for it, then renames it into place and
    /// records it, so the directory stays within the cap at every moment.
    ///
    /// A write waits for the opening scan: before it the index does not know what the
    /// directory holds, so it could neither tell whether the cap allows the entry nor choose
    /// what to evict. The scan takes milliseconds even for a full cache, and the entry's
    /// bytes are already written while it runs.
    ///
    /// A directory found at `name` (which no rename of a file can replace) is stepped
    /// around: moved aside to a temporary's name, so that the entry takes its place whatever
    /// the directory holds, then removed with everything in it (what cannot be is left to
    /// `gc`, as a crashed writer's temporary). It counts as an integrity reject.
    pub(super) fn publish(
        inner: &Arc<Inner>,
        temp: &str,
        name: &str,
        meta: &Metadata,
    ) -> io::Result<()> {
        let index = &inner.index;
        let mut aside = None;
        // Waited for before the section (an index once seeded stays so): a fork need not
        // wait for the scan.
        wait_seeded(inner);
        let rescan = {
            let _unforked = process::unforked();
            let mut s = index.state();
            let size = meta.len();
            evict_over_cap(inner, &mut s, Some((name, size)));
            match rustix::fs::renameat(&inner.dir, temp, &inner.dir, name) {
                Ok(()) => {}
                Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                    let moved = super::store::temp_name(name);
                    rustix::fs::renameat(&inner.dir, name, &inner.dir, moved.as_str())?;
                    bump(&inner.counters.integrity_rejects, 1);
                    aside = Some(moved);
                    rustix::fs::renameat(&inner.dir, temp, &inner.dir, name)?;
                }
                Err(e) => return Err(e.into()),
            }
            let recency = meta.modified().map_or(0, nanos_since_epoch);
            s.insert(name.to_owned(), size, recency);
            s.written_since_scan += size;
            s.files_written_since_scan += 1;
            !s.scan_running()
                && (s.written_since_scan > inner.max_size / 4
                    || s.files_written_since_scan > inner.max_files / 4)
        };
        // Outside the lock: a planted tree may be large.
        if let Some(moved) = aside
            && let Err(e) = remove_any(&inner.dir, &moved)
        {
            log::debug(|| format!("{name}: cannot remove the directory moved aside: {e}"));
        }
        if rescan {
            start_scan(inner);
        }
        Ok(())
    }

    /// A read refreshed the mtime of `name`.
    pub(super) fn touch(&self, name: &str, recency: u64) {
        let _unforked = process::unforked();
        let mut s = self.state();
        if let Some(size) = s.files.get(name).map(|t| t.size) {
            s.insert(name.to_owned(), size, recency);
        }
    }

    /// Removes what is at `name` and stops counting it: a file, or a directory with
    /// everything in it. With `expected` (an inode number), only if the name still holds
    /// that inode, so a file a writer put there since is kept.
    pub(super) fn unlink(inner: &Inner, name: &str, expected: Option<u64>) -> io::Result<Unlinked> {
        let _unforked = process::unforked();
        let mut s = inner.index.state();
        let outcome = match expected {
            None => remove_name(inner, name),
            Some(ino) => match lstat_at(&inner.dir, name) {
                Ok(meta) if meta.ino() != ino => return Ok(Unlinked::Replaced),
                Ok(_) => remove_name(inner, name),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Unlinked::Gone),
                Err(e) => Err(e),
            },
        }?;
        s.unlinked(name);
        Ok(outcome)
    }
}

/// Unlinks `name`, or removes it with everything in it when it is a directory.
fn remove_name(inner: &Inner, name: &str) -> io::Result<Unlinked> {
    match remove_any(&inner.dir, name) {
        Ok(()) => Ok(Unlinked::Removed),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Unlinked::Gone),
        Err(e) => Err(e),
    }
}

/// Evicts least recently used entries until the total fits the size cap and the count the
/// file-count cap, with room for `incoming` (a name about to be written and its size; the
/// name itself is replaced, not evicted). Each victim costs one `lstat` and one `unlink`: no
/// scan.
fn evict_over_cap(inner: &Inner, s: &mut State, incoming: Option<(&str, u64)>) {
    let (keep, size) = incoming.unwrap_or(("", 0));
    loop {
        let replaced = s.files.get(keep).map(|t| t.size);
        let bytes = s.total - replaced.unwrap_or(0) + size;
        // The incoming entry takes a new name unless it replaces one already counted.
        let added = u64::from(incoming.is_some() && replaced.is_none());
        let files = s.files.len() as u64 + added;
        if bytes <= inner.max_size && files <= inner.max_files {
            break;
        }
        let Some((recency, name)) = s.order.iter().find(|(_, n)| n != keep).cloned() else {
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
                match rustix::fs::unlinkat(&inner.dir, name.as_str(), AtFlags::empty()) {
                    Ok(()) => bump(&inner.counters.evictions, 1),
                    Err(Errno::NOENT) => {}
                    Err(_) => {
                        // Still there and still counted: the cap cannot be met by this
                        // entry, and retrying it would only spin.
                        bump(&inner.counters.io_errors, 1);
                        break;
                    }
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
        let _unforked = process::unforked();
        let mut s = inner.index.state();
        if s.scan_running() {
            return;
        }
        s.scanning = true;
        s.scanned_in = process::fork_generation();
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
            if let Ok(meta) = lstat_at(&inner.dir, name)
                && meta.is_file()
            {
                let recency = meta.modified().map_or(0, nanos_since_epoch);
                found.push((name.to_owned(), meta.len(), recency));
            }
        }
    }
    let _unforked = process::unforked();
    let mut s = inner.index.state();
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
    s.files_written_since_scan = 0;
    evict_over_cap(inner, &mut s, None);
    drop(s);
    inner.index.seeded.notify_all();
}
