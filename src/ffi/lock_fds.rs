//! The disk tier's lock-file descriptors, by number, for the two places that must reach them
//! without a lock or an allocation: a forked child's first moments, where every inherited one
//! is closed, and the heartbeat thread, which writes to those that hold a lock.
//!
//! A table of atomic slots, one per open descriptor. A forked child keeps its parent's open
//! file descriptions, and an `flock` belongs to the description: a child that kept them would
//! hold its parent's entry locks until it exits. The fork hook closes them instead, so the
//! parent's locks are its own. What a child still holds of its parent's [`TrackedFd`]s (in
//! queued work, on the forking thread's stack) is then inert: it reads and writes nothing,
//! and dropping it closes nothing, since the number may name a file the child opened since.
//!
//! A descriptor opened while another thread forks, before it is in the table, stays open in
//! the child: the table narrows that window to a few instructions, it cannot close it.

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use super::process;

/// Descriptors tracked at once; beyond that, one is left out of the table (a forked child
/// keeps it, as before kcache closed them).
const SLOTS: usize = 256;

/// A slot's value: `FREE`, or the descriptor's number with the flags below.
const FREE: i64 = -1;
/// The descriptor holds a lock: the heartbeat writes to it.
const LOCKED: i64 = 1 << 32;
/// The heartbeat is writing to it: its owner waits before closing it.
const BUSY: i64 = 1 << 33;
const NUMBER: i64 = (1 << 32) - 1;

static SLOT: [AtomicI64; SLOTS] = [const { AtomicI64::new(FREE) }; SLOTS];

/// A lock file's descriptor, in the table while it is open.
pub(crate) struct TrackedFd {
    fd: ManuallyDrop<OwnedFd>,
    /// `None`: the table was full.
    slot: Option<usize>,
    /// The process generation ([`process::fork_generation`]) that opened it.
    generation: u64,
}

impl TrackedFd {
    pub(crate) fn new(fd: OwnedFd) -> TrackedFd {
        static HOOKED: AtomicBool = AtomicBool::new(false);
        process::once_without_waiting(&HOOKED, || process::on_fork_child(close_inherited));
        let generation = process::fork_generation();
        let number = i64::from(fd.as_raw_fd());
        let slot = SLOT.iter().position(|slot| {
            slot.compare_exchange(FREE, number, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        TrackedFd {
            fd: ManuallyDrop::new(fd),
            slot,
            generation,
        }
    }

    /// The descriptor, unless this is a forked child's copy (closed by the fork hook, or not
    /// the child's to use).
    pub(crate) fn get(&self) -> Option<BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        (!self.inherited()).then(|| self.fd.as_fd())
    }

    /// Whether this process is a child forked since the descriptor was opened.
    pub(crate) fn inherited(&self) -> bool {
        process::fork_generation() != self.generation
    }

    /// Says that the descriptor holds a lock from now on: [`for_each_locked`] visits it.
    pub(crate) fn set_locked(&self) {
        if let (Some(slot), false) = (self.slot, self.inherited()) {
            SLOT[slot].fetch_or(LOCKED, Ordering::AcqRel);
        }
    }
}

impl Drop for TrackedFd {
    fn drop(&mut self) {
        if self.inherited() {
            if self.slot.is_none() {
                // Not in the table, so not closed at fork: this copy is the child's to close.
                // SAFETY: dropped once, here, and never used after.
                unsafe { ManuallyDrop::drop(&mut self.fd) };
            }
            // Otherwise closed by the fork hook already; its number may be another file's now.
            return;
        }
        if let Some(slot) = self.slot {
            // Out of the table before it is closed, once the heartbeat is not writing to it: the
            // number must never be written to after it may name another file.
            let slot = &SLOT[slot];
            loop {
                let value = slot.load(Ordering::Acquire);
                if value & BUSY != 0 {
                    std::thread::yield_now();
                } else if slot
                    .compare_exchange(value, FREE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    break;
                }
            }
        }
        // SAFETY: dropped once, here, and never used after.
        unsafe { ManuallyDrop::drop(&mut self.fd) };
    }
}

/// Runs `visit` on each descriptor that holds a lock, while its owner cannot close it;
/// returns how many there were.
pub(crate) fn for_each_locked(mut visit: impl FnMut(BorrowedFd<'_>)) -> usize {
    let mut visited = 0;
    for slot in &SLOT {
        let value = slot.load(Ordering::Acquire);
        if value == FREE || value & LOCKED == 0 || value & BUSY != 0 {
            continue;
        }
        if slot
            .compare_exchange(value, value | BUSY, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            // Its owner is letting it go, or it is another descriptor now: the next round.
            continue;
        }
        // SAFETY: the slot is BUSY, so its owner waits in `TrackedFd::drop` and the number
        // stays its open descriptor until the flag is cleared below.
        visit(unsafe { BorrowedFd::borrow_raw((value & NUMBER) as i32) });
        slot.fetch_and(!BUSY, Ordering::AcqRel);
        visited += 1;
    }
    visited
}

/// The fork hook: closes every tracked descriptor in the child and empties the table. Only
/// atomics and `close`, which are async-signal-safe.
extern "C" fn close_inherited() {
    for slot in &SLOT {
        let value = slot.swap(FREE, Ordering::AcqRel);
        if value != FREE {
            // SAFETY: the number was an open descriptor of the parent when it forked (owners
            // leave the table before closing), so it is the child's copy; the child's
            // `TrackedFd`s never close or use it (`inherited`).
            unsafe { libc::close((value & NUMBER) as i32) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_null() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn only_locked_descriptors_are_visited_and_dropped_ones_leave() {
        let count = |fd: &TrackedFd| {
            let number = fd.get().unwrap().as_raw_fd();
            let mut seen = 0;
            for_each_locked(|b| seen += usize::from(b.as_raw_fd() == number));
            seen
        };
        let fd = TrackedFd::new(open_null());
        assert!(fd.slot.is_some());
        assert_eq!(count(&fd), 0, "not locked yet");
        fd.set_locked();
        assert_eq!(count(&fd), 1);
        let slot = fd.slot.unwrap();
        drop(fd);
        assert_eq!(SLOT[slot].load(Ordering::Acquire), FREE);
    }
}
