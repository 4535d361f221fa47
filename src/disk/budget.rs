//! One lookup's lock waits, together: a lookup that needs several entries (a build that looks
//! other keys up on its thread, as a pipeline's build looks up its shaders) waits for other
//! processes' locks one lock timeout at most in total, however many keys, rather than one per
//! key held by a holder that makes no progress.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    /// What the lookup running on this thread (its outermost one) has waited for locks so
    /// far; `None` outside any lookup.
    static WAITED: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// The lookup on this thread, until dropped: the outermost one starts the count, the lookups
/// nested in it (its build's) share it.
pub(crate) struct Lookup {
    outermost: bool,
}

/// Opens a [`Lookup`] on this thread.
pub(crate) fn one_lookup() -> Lookup {
    let outermost = WAITED.get().is_none();
    if outermost {
        WAITED.set(Some(Duration::ZERO));
    }
    Lookup { outermost }
}

impl Drop for Lookup {
    fn drop(&mut self) {
        if self.outermost {
            WAITED.set(None);
        }
    }
}

/// How long a wait that starts now may last under `timeout`: what the lookup has not yet
/// waited of it.
pub(super) fn left(timeout: Duration) -> Duration {
    timeout.saturating_sub(WAITED.get().unwrap_or_default())
}

/// A wait, counted against the lookup when dropped.
pub(super) struct Waiting(Instant);

pub(super) fn waiting(started: Instant) -> Waiting {
    Waiting(started)
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(waited) = WAITED.get() {
            WAITED.set(Some(waited.saturating_add(self.0.elapsed())));
        }
    }
}
