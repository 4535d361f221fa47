//! A small number for each live thread, handed to another thread only after its holder has
//! exited, so that per-thread slots can be a plain array indexed by it: at any moment at most
//! one live thread holds a given index.
//!
//! Taking and returning an index is a compare-and-swap and a store on a table of flags, never a
//! lock: a thread starts or exits at any moment, and a lock it held when another thread forked
//! would stay held in the child, where every thread's first index would then wait for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Indices below this are handed out again once their thread exits; past it, each thread gets
/// a fresh one (more than this many threads alive at once).
const REUSED: usize = 256;

/// Which of the reused indices a live thread holds. A forked child keeps its parent's flags:
/// the indices of the parent's other threads, which the child does not have, stay taken.
static TAKEN: [AtomicBool; REUSED] = [const { AtomicBool::new(false) }; REUSED];

/// The next index past [`REUSED`] never handed out.
static NEXT: AtomicUsize = AtomicUsize::new(REUSED);

struct Registration(usize);

impl Registration {
    /// The smallest free index, so that the live threads' indices stay small. Taking it
    /// (acquire) orders its previous holder's last writes to its slots before this thread's.
    fn new() -> Self {
        let free = TAKEN.iter().position(|taken| {
            !taken.load(Ordering::Relaxed)
                && taken
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        });
        Self(free.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed)))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(taken) = TAKEN.get(self.0) {
            taken.store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static INDEX: Registration = Registration::new();
}

/// This thread's index; `None` while its thread-local storage is being torn down (the index
/// may already belong to another thread).
#[inline]
pub(crate) fn current() -> Option<usize> {
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
