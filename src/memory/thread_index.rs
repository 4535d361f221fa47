//! A small number for each live thread, handed to another thread only after its holder has
//! exited, so that per-thread slots can be a plain array indexed by it: at any moment at most
//! one live thread holds a given index.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// The next index never handed out.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Indices of exited threads, smallest first, so that the live threads' indices stay small.
/// The lock also orders an exited thread's last writes to its slots before the next holder's.
static FREE: Mutex<BinaryHeap<Reverse<usize>>> = Mutex::new(BinaryHeap::new());

struct Registration(usize);

impl Registration {
    fn new() -> Self {
        let reused = FREE.lock().unwrap_or_else(PoisonError::into_inner).pop();
        Self(reused.map_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed), |Reverse(i)| i))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        FREE.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Reverse(self.0));
    }
}

thread_local! {
    static INDEX: Registration = Registration::new();
}

/// This thread's index; `None` while its thread-local storage is being torn down (the index
/// may already belong to another thread).
#[inline]
pub(super) fn current() -> Option<usize> {
    INDEX.try_with(|r| r.0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn live_threads_hold_distinct_indices() {
        let all_alive = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let all_alive = Arc::clone(&all_alive);
                std::thread::spawn(move || {
                    let first = current().unwrap();
                    // Hold the index until every thread has one.
                    all_alive.wait();
                    assert_eq!(current(), Some(first), "an index changed during its thread");
                    first
                })
            })
            .collect();
        let mut indices: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(
            indices.len(),
            8,
            "two live threads shared an index: {indices:?}"
        );
    }
}
