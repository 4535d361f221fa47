//! Cross-process single-flight: one lock file per entry, so that of N processes missing the
//! same entry at once, one builds it and the others wait for it and read it.
//!
//! The lock is an `flock` on `.<entry name>.lock` in the cache directory, opened through the
//! directory descriptor with `O_NOFOLLOW`. The kernel releases it when its holder exits or
//! dies, so there are no PID files and no guessing whether a holder is alive (PIDs mean
//! nothing across PID namespaces sharing a directory). The leader holds it from before its
//! build until the entry is published (by the background writer), then unlinks the file and
//! closes it. A process that had to wait, once it holds the lock, finds one of:
//! - the entry: it reads it;
//! - a mark the leader left in the file before letting go (its build or its write failed):
//!   nothing will come, so it builds itself, without the lock;
//! - neither, the file still linked: the leader died; it takes over, holding the lock;
//! - neither, the file unlinked: the leader finished but the entry is already gone (evicted);
//!   it starts over.
//!
//! A waiter also marks the file as wanted ([`WANTED`], the file's second byte): a leader may hold
//! an entry back until someone needs it (see `write_back`), and this is how it learns that
//! someone does. A leader that takes over keeps that mark for its own waiters.
//!
//! Waiting polls a non-blocking `flock` (`flock` has no timeout), with a backoff capped at
//! [`MAX_POLL`], until the directory's lock timeout; past it the waiter builds itself, so a
//! hung leader costs the others that long and no more. A directory whose filesystem cannot
//! lock is used without locks, with one warning per process.
//!
//! A held lock is not proof that anyone still works on the entry: a process forked by the
//! leader keeps the leader's descriptors, and so its lock, unless its fork hook closed them
//! (`crate::ffi::lock_fds`), and a leader may be stopped. So each poll also looks for what
//! would end the wait whoever holds the lock: the entry (read it), the leader's failure mark
//! (build), the file unlinked or replaced (the leader let go of it: open the name again), and
//! the leader's heartbeat ([`heartbeat`]): a leader whose beat has stood still for the
//! liveness window has stopped running, and the waiter takes its build over by unlinking its
//! file and locking a new one, which the other waiters then find. A leader that beats keeps
//! its waiters up to the lock timeout, however long it builds. What a process gave up on
//! once, it does not wait for again ([`liveness`]): a stuck leader costs a process one wait,
//! however many of its entries the process needs.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use super::evict::lstat_at;
use super::liveness::{self, Verdict, Watch};
use super::{Inner, budget, bump, heartbeat, unwritable};
use crate::ffi::lock_fds::TrackedFd;
use crate::key::Key;
use crate::log;
use crate::log::Warning;

/// Default of [`PersistenceConfig::lock_timeout`](crate::PersistenceConfig::lock_timeout): longer than
/// nearly every kernel build (milliseconds to tens of seconds), so that followers wait for a
/// slow leader rather than compiling beside it, and short enough that a leader stuck in a
/// driver costs its followers two minutes, not their run.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest sleep between two attempts at a held lock: how late, at most, a waiter learns
/// that the leader is done.
const MAX_POLL: Duration = Duration::from_millis(10);

/// Attempts to claim a lock file that keeps being unlinked under the waiter (each time the
/// leader published an entry that was evicted at once) before building without it.
const MAX_ATTEMPTS: u32 = 8;

/// The mark a leader leaves when no entry will come: its build or its write failed. The lock
/// file's first byte.
const ABANDONED: u8 = b'F';

/// The mark a waiter leaves: another process wants the entry now. The lock file's second byte.
const WANTED: u8 = b'W';

const LOCK_SUFFIX: &str = ".lock";

/// The bytes of a lock file: the two marks, then its holder's beat.
const RECORD_LEN: u64 = heartbeat::OFFSET + heartbeat::LEN as u64;

/// The lock files this process holds, by name, with the process that took each (a forked
/// child inherits the table, not the locks). A lookup that finds its entry's lock held by its
/// own process waits for it as for another's (the holder publishes what it held back once it
/// sees the wait), but that is no wait for another process, and is not counted as one.
#[derive(Default)]
pub(super) struct OwnLocks(Mutex<HashMap<String, u32>>);

impl OwnLocks {
    fn set(&self, name: &str, held: bool) {
        let mut names = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if held {
            names.insert(name.to_owned(), std::process::id());
        } else {
            names.remove(name);
        }
    }

    /// The table, held across a fork (the disk tier's `ForkLocked`), which would otherwise
    /// leave a child a lock held by a thread it does not have.
    pub(super) fn lock_for_fork(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ours(&self, name: &str) -> bool {
        let names = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        names.get(name) == Some(&std::process::id())
    }
}

/// The lock file of the entry `entry_name`.
pub(super) fn lock_name(entry_name: &str) -> String {
    format!(".{entry_name}{LOCK_SUFFIX}")
}

/// Whether `name` is a lock file's name, and of which entry.
pub(super) fn entry_of_lock(name: &str) -> Option<&str> {
    let entry = name.strip_prefix('.')?.strip_suffix(LOCK_SUFFIX)?;
    super::parse_entry_name(entry).map(|_| entry)
}

/// What a miss should do, as [`super::Disk::claim`] decides.
pub(crate) enum Claim {
    /// Build and publish; other processes wait on the lock until it is dropped (after the
    /// write) or [`KeyLock::abandon`]ed.
    Leader(KeyLock),
    /// The entry is there now (another process published it while this one waited, or just
    /// before): read it.
    Published,
    /// Build without the lock: the leader failed, the wait timed out, or the directory cannot
    /// lock.
    Alone,
}

/// A held per-entry lock. Dropping it unlinks the lock file and releases the lock; waiters
/// then find the entry, or, if there is none and no mark, start over.
///
/// In a forked child, the parent's locks are inert: their descriptors were closed at the fork
/// (`crate::ffi::lock_fds`), and dropping one, or asking it anything, touches neither the
/// lock nor its file, which are the parent's.
pub(crate) struct KeyLock {
    inner: Arc<Inner>,
    file: TrackedFd,
    name: String,
}

impl KeyLock {
    /// This lock, which this process has just taken, once its file's record bytes are
    /// allocated: marking and beating it then need no space, so a full filesystem cannot
    /// leave a waiter waiting the lock timeout for a mark that could not be written. `None`
    /// (the file unlinked and let go) when they cannot be: the directory takes no writes, so no
    /// entry would come of the lock anyway.
    fn reserved(self) -> Option<KeyLock> {
        let fd = self.file.get()?;
        if let Err(e) = reserve(fd) {
            unwritable::note(&self.inner, &e.into());
            log::debug(|| {
                format!(
                    "disk lock: {}: cannot be written ({e}): building without it",
                    self.name
                )
            });
            return None;
        }
        self.inner.held.set(&self.name, true);
        Some(self)
    }

    /// Whether a process has waited for this lock since it was taken (or, after a takeover,
    /// since the flight began).
    pub(crate) fn wanted(&self) -> bool {
        let mut marks = [0u8; 2];
        self.file.get().is_some_and(|fd| {
            rustix::io::pread(fd, &mut marks, 0).is_ok_and(|n| n == 2 && marks[1] == WANTED)
        })
    }

    /// Tells the waiting processes that no entry will come, so that they build themselves
    /// instead of taking over one after another.
    pub(crate) fn abandon(&self) {
        // If the mark cannot be written, a waiter takes over and builds: one build more, no
        // harm.
        if let Some(fd) = self.file.get() {
            let _ = rustix::io::pwrite(fd, &[ABANDONED], 0);
        }
    }
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        // Unlinked while held, so that no lock file outlives its flight; `claim` checks after
        // locking that its file is still the linked one, so nobody locks a stale inode.
        let Some(fd) = self.file.get() else {
            return;
        };
        self.inner.held.set(&self.name, false);
        if is_linked(&self.inner, fd, &self.name) {
            let _ = rustix::fs::unlinkat(&self.inner.dir, self.name.as_str(), AtFlags::empty());
        }
    }
}

/// Whether `name` in the directory is the file `fd` has open.
fn is_linked(inner: &Inner, fd: BorrowedFd<'_>, name: &str) -> bool {
    let (Ok(open), Ok(linked)) = (rustix::fs::fstat(fd), lstat_at(&inner.dir, name)) else {
        return false;
    };
    open.st_ino == linked.ino() && open.st_dev == linked.dev()
}

fn entry_exists(inner: &Inner, entry_name: &str) -> bool {
    lstat_at(&inner.dir, entry_name).is_ok_and(|m| m.is_file())
}

/// Extends the lock file `fd` to [`RECORD_LEN`] bytes with zeros, keeping what it holds.
fn reserve(fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
    let len = rustix::fs::fstat(fd)?.st_size as u64;
    if len >= RECORD_LEN {
        return Ok(());
    }
    let zeros = [0u8; RECORD_LEN as usize];
    let missing = &zeros[..(RECORD_LEN - len) as usize];
    match rustix::io::pwrite(fd, missing, len)? {
        n if n == missing.len() => Ok(()),
        _ => Err(Errno::NOSPC),
    }
}

/// Whether the lock file `fd` carries the leader's mark that no entry will come.
fn abandoned(fd: BorrowedFd<'_>) -> bool {
    let mut mark = [0u8; 1];
    rustix::io::pread(fd, &mut mark, 0).is_ok_and(|n| n == 1 && mark[0] == ABANDONED)
}

/// Opens the lock file `name` (created private with `OFlags::CREATE`): never through a symbolic
/// link, and without blocking on a FIFO planted at its name.
fn open(inner: &Inner, name: &str, create: OFlags) -> rustix::io::Result<TrackedFd> {
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | create;
    rustix::fs::openat(&inner.dir, name, flags, Mode::from_raw_mode(0o600)).map(TrackedFd::new)
}

/// How a wait for a lock ended.
enum Acquired {
    /// Locked, at once (`false`) or after waiting for another holder (`true`).
    Held(TrackedFd, bool),
    /// The entry is there, though the lock is still held (only `claim` looks).
    Published,
    /// The holder left the mark that no entry will come, and is letting go (only `claim`
    /// looks).
    Abandoned,
    /// The file waited on is not the one at the name any more: its holder let go of it, or
    /// this process took it over from a holder that stopped (`took_over`). Open the name again.
    Again {
        took_over: bool,
    },
    /// The holder is one this process waited the lock timeout for already.
    GivenUp,
    TimedOut,
    /// The lock file cannot be opened or locked here.
    Unavailable,
}

/// Opens the lock file and locks it, waiting until `deadline` (`None`: no end), or less when
/// the wait's reason ends first: the entry `entry` appears, the holder marks that no entry
/// will come, lets go of the file, or stops beating ([`liveness`]). Each of those is looked
/// at every poll, whoever holds the lock: a process forked by the holder may keep the
/// holder's descriptor, and so its lock, long after the holder is done.
fn acquire(inner: &Inner, name: &str, entry: Option<&str>, deadline: Option<Instant>) -> Acquired {
    let file = match open(inner, name, OFlags::CREATE) {
        Ok(file) => file,
        Err(e) => {
            log::debug(|| format!("disk lock: cannot open {name} ({e}): going on without it"));
            return Acquired::Unavailable;
        }
    };
    // Opened by this thread, so never a forked child's copy.
    let Some(fd) = file.get() else {
        return Acquired::Unavailable;
    };
    let mut waited = false;
    // A lookup that has waited its lock timeout for other entries already tries once, and
    // judges no holder for it.
    let spent = deadline.is_some_and(|deadline| deadline <= Instant::now());
    let mut pause = Duration::from_micros(250);
    let mut watch = Watch::new();
    loop {
        match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Acquired::Held(file, waited),
            Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {
                if !waited {
                    // A leader that does not see it publishes at flush, or when a later waiter
                    // marks it: this waiter then waits longer, for nothing worse.
                    let _ = rustix::io::pwrite(fd, &[WANTED], 1);
                }
            }
            Err(e) => {
                crate::log::warn_once(Warning::NoLocks, || {
                    format!(
                        "{} cannot be locked ({e}): processes sharing it may build the same \
                         kernel at once",
                        inner.path.display()
                    )
                });
                return Acquired::Unavailable;
            }
        }
        waited = true;
        if let Some(entry) = entry {
            if entry_exists(inner, entry) {
                return Acquired::Published;
            }
            if abandoned(fd) {
                return Acquired::Abandoned;
            }
        }
        if !is_linked(inner, fd, name) {
            return Acquired::Again { took_over: false };
        }
        match watch.judge(heartbeat::read(fd), inner.lock_liveness, &inner.path) {
            Verdict::Wait => {}
            Verdict::Stopped => {
                take_over(inner, fd, name);
                return Acquired::Again { took_over: true };
            }
            Verdict::GivenUp => return Acquired::GivenUp,
        }
        let now = Instant::now();
        let left = deadline.map(|deadline| deadline.saturating_duration_since(now));
        if left.is_some_and(|left| left.is_zero()) {
            if !inner.lock_timeout.is_zero() && !spent {
                watch.timed_out(inner.lock_timeout, &inner.path);
            }
            return Acquired::TimedOut;
        }
        std::thread::sleep(left.map_or(pause, |left| pause.min(left)));
        pause = (pause * 2).min(MAX_POLL);
    }
}

/// Takes the lock file `fd` over from a holder that stopped: unlinks it, so that the next
/// open makes a new one, which this process locks, and which the others waiting find. The
/// stopped holder, should it run again, finds its file unlinked and leaves the new one alone.
fn take_over(inner: &Inner, fd: BorrowedFd<'_>, name: &str) {
    // Another waiter may take the same file over at the same moment, and unlink the new file
    // of the first: then both build, one build more, as when the wait times out.
    if is_linked(inner, fd, name) {
        let _ = rustix::fs::unlinkat(&inner.dir, name, AtFlags::empty());
    }
}

/// Decides what a lookup that missed `key` does (see the module's description).
pub(super) fn claim(inner: &Arc<Inner>, key: &Key) -> Claim {
    let entry = inner.entry_name(key);
    let name = lock_name(&entry);
    let started = Instant::now();
    let _waiting = budget::waiting(started);
    let left = budget::left(inner.lock_timeout);
    let deadline = started.checked_add(left);
    let c = &inner.counters;
    // A wait for this process's own flight is no wait for another process.
    let ours = inner.held.ours(&name);
    let mut counted_wait = ours;
    let mut count_wait = || {
        if !std::mem::replace(&mut counted_wait, true) {
            bump(&c.lock_waits, 1);
        }
    };
    let mut took_over = false;
    for _ in 0..MAX_ATTEMPTS {
        let (file, waited) = match acquire(inner, &name, Some(&entry), deadline) {
            Acquired::Held(file, waited) => (file, waited),
            Acquired::Published => {
                count_wait();
                wrote_it(&entry, started, ours);
                return Claim::Published;
            }
            Acquired::Abandoned => {
                count_wait();
                failed(&entry, started);
                return Claim::Alone;
            }
            Acquired::Again { took_over: stole } => {
                count_wait();
                took_over |= stole;
                continue;
            }
            Acquired::GivenUp => {
                log::debug(|| {
                    format!(
                        "disk lock: {entry}: held by a process this one waited the lock timeout \
                         for already: building here too"
                    )
                });
                return Claim::Alone;
            }
            Acquired::TimedOut if left.is_zero() && !inner.lock_timeout.is_zero() => {
                log::debug(|| {
                    format!(
                        "disk lock: {entry}: held, and this lookup has waited its lock timeout \
                         for other entries already: building here too"
                    )
                });
                return Claim::Alone;
            }
            Acquired::TimedOut => {
                bump(&c.lock_timeouts, 1);
                timed_out(inner, &entry, "building here too");
                return Claim::Alone;
            }
            Acquired::Unavailable => return Claim::Alone,
        };
        if waited {
            count_wait();
        }
        // Held from here: whatever this returns other than `Leader` drops it, which unlinks a
        // file that is still linked (this process may have created it) before unlocking.
        let held = KeyLock {
            inner: Arc::clone(inner),
            file,
            name: name.clone(),
        };
        let Some(fd) = held.file.get() else {
            return Claim::Alone;
        };
        // Published just before this process locked, or while it waited.
        if entry_exists(inner, &entry) {
            if waited {
                wrote_it(&entry, started, ours);
            }
            return Claim::Published;
        }
        let abandoned = abandoned(fd);
        if waited && abandoned {
            failed(&entry, started);
            return Claim::Alone;
        }
        if !is_linked(inner, fd, &name) {
            // The leader let go of a file it unlinked, and its entry is gone already.
            continue;
        }
        // A stale mark this process cannot clear would send its own waiters away. The wanted
        // mark stays: the processes that left it still wait.
        if abandoned && rustix::io::pwrite(fd, &[0], 0).is_err() {
            return Claim::Alone;
        }
        if waited {
            // Locked after waiting, yet no entry and no mark: the leader died.
            liveness::died(heartbeat::read(fd), &inner.path);
            log::debug(|| {
                format!("disk lock: {entry}: the process building it died: taking over its build")
            });
        } else if took_over {
            log::debug(|| {
                format!(
                    "disk lock: {entry}: the process building it stopped: taking over its build"
                )
            });
        }
        if waited || took_over {
            bump(&c.lock_takeovers, 1);
        }
        let Some(held) = held.reserved() else {
            return Claim::Alone;
        };
        heartbeat::start(&held.file);
        return Claim::Leader(held);
    }
    log::debug(|| format!("disk lock: {entry}: kept vanishing: building without it"));
    Claim::Alone
}

/// Says that the entry a wait was for has been written by the process it waited for (`ours`:
/// this one, building it for another of its caches or contexts).
fn wrote_it(entry: &str, started: Instant, ours: bool) {
    let whom = if ours {
        "this process's own build of it"
    } else {
        "another process"
    };
    log::debug(|| {
        format!(
            "disk lock: {entry}: waited {:?} for {whom}, which wrote it",
            started.elapsed()
        )
    });
}

/// Says that the process a wait was for failed to build or write the entry.
fn failed(entry: &str, started: Instant) {
    log::debug(|| {
        format!(
            "disk lock: {entry}: the process building it failed after {:?}: building here",
            started.elapsed()
        )
    });
}

/// Says that a wait for `entry`'s lock reached the timeout, and what this process does now.
fn timed_out(inner: &Inner, entry: &str, then: &str) {
    log::debug(|| {
        format!(
            "disk lock: {entry}: timed out after {:?} waiting for another process: {then}",
            inner.lock_timeout
        )
    });
}

/// The lock of `key`'s entry for a read-modify-write of it (a merge), waiting up to the lock
/// timeout; `None` when it timed out or the directory cannot lock (the caller goes on without
/// it, as before locks existed).
pub(super) fn exclusive(inner: &Arc<Inner>, key: &Key) -> Option<KeyLock> {
    let entry = inner.entry_name(key);
    let name = lock_name(&entry);
    let started = Instant::now();
    let _waiting = budget::waiting(started);
    let deadline = started.checked_add(budget::left(inner.lock_timeout));
    for _ in 0..MAX_ATTEMPTS {
        match acquire(inner, &name, None, deadline) {
            Acquired::Held(file, waited) => {
                if waited {
                    bump(&inner.counters.lock_waits, 1);
                }
                if file.get().is_some_and(|fd| is_linked(inner, fd, &name)) {
                    let held = KeyLock {
                        inner: Arc::clone(inner),
                        file,
                        name,
                    }
                    .reserved()?;
                    heartbeat::start(&held.file);
                    return Some(held);
                }
            }
            Acquired::Again { .. } => {}
            Acquired::TimedOut => {
                bump(&inner.counters.lock_timeouts, 1);
                timed_out(inner, &entry, "writing without the lock");
                return None;
            }
            Acquired::Published
            | Acquired::Abandoned
            | Acquired::GivenUp
            | Acquired::Unavailable => return None,
        }
    }
    None
}

/// Removes a lock file nobody holds (a leader that died leaves its file behind); a held one is
/// left alone. Returns whether it was removed.
pub(super) fn remove_idle(inner: &Inner, name: &str) -> bool {
    let Ok(file) = open(inner, name, OFlags::empty()) else {
        return false;
    };
    let Some(fd) = file.get() else {
        return false;
    };
    if rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive).is_err() {
        return false;
    }
    // Unlinked while held: a process that locks this inode afterwards sees it unlinked and
    // opens a new file.
    is_linked(inner, fd, name) && rustix::fs::unlinkat(&inner.dir, name, AtFlags::empty()).is_ok()
}
