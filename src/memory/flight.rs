//! Single-flight: the rendezvous between the one thread building a key and the lookups of the
//! same key that arrive meanwhile. Sharing a build never changes a caller's outcome: each
//! waiter is judged against its own window (see `MemoryCache::join`).

use std::sync::Arc;

use super::entry::Entry;
use super::sync::{Condvar, Mutex, ThreadId, current_thread};
use crate::Error;
use crate::ffi::process;

/// How a build ended, as its waiters see it.
pub(super) enum Ending<K, V> {
    /// The value was installed. `evicted[i]` says whether the device named by the waiter holding
    /// ticket `i` was evicted between that waiter's arrival and the install: the entry is not
    /// recorded against that device, and that waiter gets [`Error::DeviceDestroyed`].
    Installed {
        entry: Arc<Entry<K, V>>,
        evicted: Vec<bool>,
    },
    /// The build failed or panicked: the same key fails the same way for every caller.
    Failed(Error),
    /// The builder's own window was doomed (its device evicted, or the borrowing cache cleared)
    /// and its value destroyed. A waiter whose window was not doomed looks the key up again.
    Doomed,
}

/// What one waiter takes from an [`Ending`].
pub(super) enum Verdict<K, V> {
    Value(Arc<Entry<K, V>>),
    /// The waiter's own device was evicted before the install.
    Evicted,
    Failed(Error),
    Doomed,
}

pub(super) struct Flight<K, V> {
    /// Lets a lookup from inside the build itself fail fast instead of waiting for itself.
    builder: ThreadId,
    /// The fork generation ([`process::fork_generation`]) of the process whose thread builds.
    generation: u64,
    ending: Mutex<Option<Ending<K, V>>>,
    done: Condvar,
}

impl<K, V> Flight<K, V> {
    pub(super) fn new() -> Self {
        Self {
            builder: current_thread(),
            generation: process::fork_generation(),
            ending: Mutex::new(None),
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

    pub(super) fn finish(&self, ending: Ending<K, V>) {
        *self.ending.lock() = Some(ending);
        self.done.notify_all();
    }

    /// Blocks until the builder finishes and returns what it means for the waiter holding
    /// `ticket` (`None` for a waiter that named no device).
    pub(super) fn wait(&self, ticket: Option<usize>) -> Verdict<K, V> {
        let mut ending = self.ending.lock();
        loop {
            match ending.as_ref() {
                Some(Ending::Installed { evicted, .. }) if ticket.is_some_and(|i| evicted[i]) => {
                    return Verdict::Evicted;
                }
                Some(Ending::Installed { entry, .. }) => return Verdict::Value(Arc::clone(entry)),
                Some(Ending::Failed(error)) => return Verdict::Failed(error.clone()),
                Some(Ending::Doomed) => return Verdict::Doomed,
                None => ending = self.done.wait(ending),
            }
        }
    }
}
