//! Proof of life in the lock files this process holds, so that a waiter can tell a holder
//! that is still building (however long) from one that will never finish: stopped
//! (`SIGSTOP`, a frozen cgroup), or gone while a process it forked keeps its lock's
//! descriptor.
//!
//! A lock file's bytes [`OFFSET`].. hold its holder's *beat*: a token drawn once per process
//! (again in each forked child) and a count. One thread per process, running while the
//! process holds a lock, writes the count, one more each round, into every lock file the
//! process holds, every [`BEAT`]. A holder's beat stops changing when its process stops
//! running; that is all a waiter looks at ([`super::liveness`]): no clock is compared across
//! processes.
//!
//! The thread runs on no lock and touches only atomics and its own descriptors' table
//! (`crate::ffi::lock_fds`), so a fork at any moment leaves the child nothing to wait for;
//! the child starts its own thread when it takes a lock.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::ffi::lock_fds::{self, TrackedFd};
use crate::ffi::process;

/// How often a holder's beat changes.
pub(super) const BEAT: Duration = Duration::from_millis(200);

/// Where the beat starts in a lock file: after the marks (`lock`'s `ABANDONED`, `WANTED`).
pub(super) const OFFSET: u64 = 2;

/// The bytes of a beat: the holder's token, then its count, little-endian.
pub(super) const LEN: usize = 16;

/// What a lock file says of its holder's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Beat {
    pub token: u64,
    pub count: u64,
}

/// The beat in the lock file `fd`; `None` before its first holder wrote one (a holder of a
/// kcache without heartbeats writes none).
pub(super) fn read(fd: BorrowedFd<'_>) -> Option<Beat> {
    let mut bytes = [0u8; LEN];
    match rustix::io::pread(fd, &mut bytes, OFFSET) {
        Ok(LEN) => {
            let (token, count) = bytes.split_at(8);
            let token = u64::from_le_bytes(token.try_into().expect("8 bytes"));
            let count = u64::from_le_bytes(count.try_into().expect("8 bytes"));
            (token != 0).then_some(Beat { token, count })
        }
        _ => None,
    }
}

/// Starts beating into `file`, whose lock this process holds, until it is dropped: one beat
/// now, then one every [`BEAT`].
pub(super) fn start(file: &TrackedFd) {
    let Some(fd) = file.get() else {
        return;
    };
    write(fd, COUNT.load(Ordering::Relaxed));
    file.set_locked();
    ensure_thread();
}

/// Beats written so far in this process (the count of the last round).
static COUNT: AtomicU64 = AtomicU64::new(0);

/// The generation (plus one) whose beat thread runs; 0: none.
static RUNNING: AtomicU64 = AtomicU64::new(0);

fn write(fd: BorrowedFd<'_>, count: u64) {
    let mut bytes = [0u8; LEN];
    bytes[..8].copy_from_slice(&token().to_le_bytes());
    bytes[8..].copy_from_slice(&count.to_le_bytes());
    // A beat that cannot be written makes a waiter give up on this holder after its liveness
    // window: one build more, never a wrong value.
    let _ = rustix::io::pwrite(fd, &bytes, OFFSET);
}

fn ensure_thread() {
    let running = process::fork_generation() + 1;
    if RUNNING.swap(running, Ordering::AcqRel) == running {
        return;
    }
    let started = std::thread::Builder::new()
        .name("kcache-heartbeat".into())
        .spawn(move || beat_while_held(running));
    if started.is_err() {
        // Waiters give this process's locks up after their liveness window.
        RUNNING.store(0, Ordering::Release);
    }
}

/// The thread: a round every [`BEAT`] until this process holds no lock.
fn beat_while_held(running: u64) {
    loop {
        std::thread::sleep(BEAT);
        let count = COUNT.fetch_add(1, Ordering::Relaxed) + 1;
        if lock_fds::for_each_locked(|fd| write(fd, count)) > 0 {
            continue;
        }
        // None held: stop, unless a lock was taken as this thread was stopping and its
        // `ensure_thread` saw it still running.
        if RUNNING
            .compare_exchange(running, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        if lock_fds::for_each_locked(|_| ()) == 0
            || RUNNING
                .compare_exchange(0, running, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
    }
}

/// This process's token: drawn at its first beat, and again in a forked child, which holds
/// none of its parent's locks.
fn token() -> u64 {
    static TOKEN: AtomicU64 = AtomicU64::new(0);
    static DRAWN_IN: AtomicU64 = AtomicU64::new(0);
    let generation = process::fork_generation() + 1;
    if DRAWN_IN.load(Ordering::Acquire) == generation {
        return TOKEN.load(Ordering::Relaxed);
    }
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(&generation.to_le_bytes());
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    let bytes = h.finalize();
    // Never 0, which reads as "no beat".
    let token = u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes")) | 1;
    // Two threads drawing at once may each write a beat with their own token: a waiter takes
    // the change for a sign of life, which it is.
    TOKEN.store(token, Ordering::Relaxed);
    DRAWN_IN.store(generation, Ordering::Release);
    token
}
