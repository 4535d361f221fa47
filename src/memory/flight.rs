//! Single-flight: the rendezvous between the one thread building a key and the lookups of the
//! same key that arrive meanwhile.

use std::sync::Arc;

use super::entry::Entry;
use super::sync::{Condvar, Mutex, ThreadId, current_thread};
use crate::Error;
use crate::ffi::process;

pub(super) type Outcome<K, V> = Result<Arc<Entry<K, V>>, Error>;

pub(super) struct Flight<K, V> {
    /// Lets a lookup from inside the build itself fail fast instead of waiting for itself.
    builder: ThreadId,
    /// The fork generation ([`process::fork_generation`]) of the process whose thread builds.
    generation: u64,
    outcome: Mutex<Option<Outcome<K, V>>>,
    done: Condvar,
}

impl<K, V> Flight<K, V> {
    pub(super) fn new() -> Self {
        Self {
            builder: current_thread(),
            generation: process::fork_generation(),
            outcome: Mutex::new(None),
            done: Condvar::default(),
        }
    }

    pub(super) fn is_builder(&self) -> bool {
        self.builder == current_thread()
    }

    /// Whether a lookup may wait for this flight: its builder is a thread of this process, or
    /// the caller itself (which then gets [`Error::Reentrant`]). A flight a parent process's
    /// thread was running when this process forked has no builder here (only the forking
    /// thread lives on in a child), and waiting for it would never end.
    pub(super) fn can_finish_here(&self) -> bool {
        self.generation == process::fork_generation() || self.is_builder()
    }

    pub(super) fn finish(&self, outcome: Outcome<K, V>) {
        *self.outcome.lock() = Some(outcome);
        self.done.notify_all();
    }

    /// Blocks until the builder finishes and returns its outcome, shared: the same entry, or a
    /// clone of the same error.
    pub(super) fn wait(&self) -> Outcome<K, V> {
        let mut outcome = self.outcome.lock();
        loop {
            if let Some(result) = outcome.as_ref() {
                return result.clone();
            }
            outcome = self.done.wait(outcome);
        }
    }
}
