//! Whether the holder of a lock a waiter polls is still worth waiting for, from its beat
//! ([`super::heartbeat`]): a holder whose beat changes is alive, however long it builds; one
//! whose beat has not changed for the liveness window has stopped running, and the waiter
//! takes its lock over.
//!
//! A waiter also remembers the holders it gave up on, by token, so that one stuck holder
//! costs a process one wait, not one per entry it holds (a process holds up to 32 entries
//! back, see `writer`):
//! - a holder that stopped, with its last count: its other lock files carry that count (or
//!   less), and are taken over at once; a beat past it means the holder runs again, and it is
//!   forgotten;
//! - a holder that kept beating until the lock timeout (its build hangs in a driver, say):
//!   its other entries are built here without waiting.
//!
//! Each give-up is logged once per holder, at `warn`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::heartbeat::{BEAT, Beat};
use crate::log::{self, Level};

/// Default of [`PersistenceConfig::lock_liveness`](crate::PersistenceConfig::lock_liveness): many beats,
/// so that a holder descheduled for a while on a loaded machine is not taken for stopped
/// (which would cost a build more, nothing worse), and short beside the lock timeout.
pub const DEFAULT_LOCK_LIVENESS: Duration = Duration::from_secs(5);

/// The shortest liveness window: five beats.
pub const MIN_LOCK_LIVENESS: Duration = BEAT.saturating_mul(5);

/// Holders remembered at most; the oldest is forgotten first (and costs a wait again).
const REMEMBERED: usize = 16;

/// What a waiter makes of its holder's beat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Alive, or too soon to tell: wait on.
    Wait,
    /// Stopped running: take the lock over.
    Stopped,
    /// Given up on at a lock timeout already: build without waiting.
    GivenUp,
}

/// One waiter's view of its holder.
pub(super) struct Watch {
    seen: Option<Beat>,
    since: Instant,
}

impl Watch {
    pub(super) fn new() -> Watch {
        Watch {
            seen: None,
            since: Instant::now(),
        }
    }

    /// The verdict on a holder whose lock file now says `beat`, after `window` without a
    /// change. A lock file without a beat (its holder runs a kcache without heartbeats) is
    /// waited for up to the lock timeout only.
    pub(super) fn judge(&mut self, beat: Option<Beat>, window: Duration, dir: &Path) -> Verdict {
        let now = Instant::now();
        let Some(beat) = beat else {
            return Verdict::Wait;
        };
        if self.seen != Some(beat) {
            self.seen = Some(beat);
            self.since = now;
            return match recall(beat) {
                Recalled::Stopped => Verdict::Stopped,
                Recalled::TimedOut => Verdict::GivenUp,
                Recalled::Nothing => Verdict::Wait,
            };
        }
        if now.duration_since(self.since) < window {
            return Verdict::Wait;
        }
        if remember(beat, Cause::Stopped) {
            log::log(Level::Warn, || {
                format!(
                    "{}: a process holding entry locks has shown no sign of life for {:?} \
                     (stopped, or gone while a process it forked keeps its locks): taking its \
                     entries over",
                    dir.display(),
                    window
                )
            });
        }
        Verdict::Stopped
    }

    /// Says that the wait reached the lock timeout: the holder is given up on, if it beats.
    pub(super) fn timed_out(&self, timeout: Duration, dir: &Path) {
        // A holder without a beat is not remembered: it is warned about once per process.
        static UNBEATING: AtomicBool = AtomicBool::new(false);
        let first = match self.seen {
            Some(beat) => remember(beat, Cause::TimedOut),
            None => !UNBEATING.swap(true, Ordering::Relaxed),
        };
        if first {
            log::log(Level::Warn, || {
                format!(
                    "{}: waited the lock timeout ({timeout:?}) for a process building an entry: \
                     building here, and not waiting for that process's other entries",
                    dir.display()
                )
            });
        }
    }
}

/// Says that a lock was taken over from a holder that died holding it (its lock file last
/// said `beat`): logged once per holder.
pub(super) fn died(beat: Option<Beat>, dir: &Path) {
    // A holder without a beat is warned about once per process.
    static UNBEATING: AtomicBool = AtomicBool::new(false);
    let first = match beat {
        Some(beat) => remember(beat, Cause::Died),
        None => !UNBEATING.swap(true, Ordering::Relaxed),
    };
    if first {
        log::log(Level::Warn, || {
            format!(
                "{}: a process died while it built an entry: taking its build over",
                dir.display()
            )
        });
    }
}

/// Why a holder was given up on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// Stopped at this count.
    Stopped,
    TimedOut,
    /// Its locks are released (by the kernel): remembered only so as to be logged once.
    Died,
}

enum Recalled {
    Nothing,
    Stopped,
    TimedOut,
}

struct GivenUp {
    beat: Beat,
    cause: Cause,
}

/// The holders given up on, newest last. Only tried for a while, never waited on: a forked
/// child whose parent forked while a thread held it reads nothing (and waits as if it
/// remembered nothing).
static GIVEN_UP: Mutex<Vec<GivenUp>> = Mutex::new(Vec::new());

const TRY_FOR: Duration = Duration::from_millis(50);

/// Remembers `beat`'s holder as given up on for `cause`; whether it is new (to be logged).
fn remember(beat: Beat, cause: Cause) -> bool {
    let Some(mut given_up) = GIVEN_UP.try_lock_for(TRY_FOR) else {
        return true;
    };
    if let Some(known) = given_up.iter_mut().find(|g| g.beat.token == beat.token) {
        known.beat = beat;
        known.cause = cause;
        return false;
    }
    if given_up.len() == REMEMBERED {
        given_up.remove(0);
    }
    given_up.push(GivenUp { beat, cause });
    true
}

/// What is remembered of `beat`'s holder. A holder remembered as stopped whose count moved
/// on runs again: it is forgotten.
fn recall(beat: Beat) -> Recalled {
    let Some(mut given_up) = GIVEN_UP.try_lock_for(TRY_FOR) else {
        return Recalled::Nothing;
    };
    let Some(at) = given_up.iter().position(|g| g.beat.token == beat.token) else {
        return Recalled::Nothing;
    };
    match given_up[at].cause {
        Cause::TimedOut => Recalled::TimedOut,
        Cause::Died => Recalled::Nothing,
        Cause::Stopped if beat.count <= given_up[at].beat.count => Recalled::Stopped,
        Cause::Stopped => {
            given_up.remove(at);
            Recalled::Nothing
        }
    }
}
