//! Hit and miss counters that hits can afford. A shared atomic counter costs a locked
//! read-modify-write per hit, the single largest item of the hit path when measured; here each
//! thread counts into the slot of its index (`thread_index.rs`) with a plain load and store,
//! and `stats()` adds the slots up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::thread_index;

/// Threads with an index below this count into a slot of their own; the rest share one with
/// atomic additions. Each slot is two cache lines wide, so a cache spends 8 KiB on them.
const SLOTS: usize = 64;

#[derive(Default)]
#[repr(align(128))]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
}

pub(super) struct Tally {
    /// Behind an `Arc` so that the process's metrics can add them up while the cache lives.
    all: Arc<AllCounts>,
}

/// Every count of one tally.
pub(super) struct AllCounts {
    /// Slot `i` is written only by the live thread of index `i`; kept after the thread exits
    /// so that no count is lost, and taken over by the next thread given that index.
    slots: [Counts; SLOTS],
    /// Threads past the slots, and counts made while a thread's storage is torn down.
    shared: Counts,
}

impl Tally {
    pub(super) fn new() -> Self {
        Self {
            all: Arc::new(AllCounts {
                slots: std::array::from_fn(|_| Counts::default()),
                shared: Counts::default(),
            }),
        }
    }

    /// The counts, shared with the cache's metrics source (`metrics.rs`).
    pub(super) fn counts(&self) -> &Arc<AllCounts> {
        &self.all
    }

    #[inline]
    pub(super) fn hit(&self) {
        self.count(|c| &c.hits);
    }

    pub(super) fn miss(&self) {
        self.count(|c| &c.misses);
    }

    #[inline]
    fn count(&self, field: impl Fn(&Counts) -> &AtomicU64) {
        match thread_index::current().and_then(|i| self.all.slots.get(i)) {
            Some(mine) => {
                // Only this thread writes its slot: a plain load and store cannot lose a count.
                let counter = field(mine);
                counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            None => {
                field(&self.all.shared).fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl AllCounts {
    /// (hits, misses) so far.
    pub(super) fn totals(&self) -> (u64, u64) {
        let load = |c: &Counts| {
            (
                c.hits.load(Ordering::Relaxed),
                c.misses.load(Ordering::Relaxed),
            )
        };
        self.slots
            .iter()
            .map(load)
            .fold(load(&self.shared), |(h, m), (dh, dm)| (h + dh, m + dm))
    }
}
