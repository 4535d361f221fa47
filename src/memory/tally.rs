//! Hit and miss counters that hits can afford. A shared atomic counter costs a locked
//! read-modify-write per hit, the single largest item of the hit path when measured; here each
//! thread counts into a slot of its own with a plain load and store, and `stats()` adds the
//! slots up.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Every tally's identity, so that a thread can tell its slots apart.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's slot in each tally it has counted into.
    static SLOTS: RefCell<Vec<(u64, Arc<Counts>)>> = const { RefCell::new(Vec::new()) };
}

#[derive(Default)]
#[repr(align(128))]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
}

pub(super) struct Tally {
    id: u64,
    /// Behind an `Arc` so that the process's metrics can add them up while the cache lives;
    /// a count touches only `id` and the thread's own slot, never this pointer.
    all: Arc<AllCounts>,
}

/// Every count of one tally.
#[derive(Default)]
pub(super) struct AllCounts {
    /// Every thread's slot, kept after the thread exits so that no count is lost.
    slots: Mutex<Vec<Arc<Counts>>>,
    /// For the rare count made while this thread's slots are being torn down.
    shared: Counts,
}

impl Tally {
    pub(super) fn new() -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            all: Arc::default(),
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
        let counted = SLOTS.try_with(|slots| {
            let slots = slots.borrow();
            let mine = slots.iter().find(|(id, _)| *id == self.id);
            if let Some((_, counts)) = mine {
                // Only this thread writes its slot: a plain load and store cannot lose a count.
                let counter = field(counts);
                counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            mine.is_some()
        });
        match counted {
            Ok(true) => {}
            Ok(false) => self.register(field),
            Err(_) => {
                field(&self.all.shared).fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// This thread's first count in this tally: give it a slot.
    #[cold]
    #[inline(never)]
    fn register(&self, field: impl Fn(&Counts) -> &AtomicU64) {
        let counts = Arc::new(Counts::default());
        field(&counts).store(1, Ordering::Relaxed);
        self.all
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&counts));
        SLOTS.with_borrow_mut(|slots| {
            // Forget slots of tallies that are gone (their cache was dropped).
            slots.retain(|(_, c)| Arc::strong_count(c) > 1);
            slots.push((self.id, counts));
        });
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
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots
            .iter()
            .map(|c| load(c))
            .fold(load(&self.shared), |(h, m), (dh, dm)| (h + dh, m + dm))
    }
}
