//! Which entries go when a cap is exceeded: CLOCK (second chance), an approximation of LRU
//! that keeps hits free of any shared lock, made cost-aware. Entries join the back of a queue
//! when installed; the hand takes from the front and evicts an entry with no chances left, else
//! takes one chance and sends it round again. A hit restores an entry's chances; an entry
//! whose build was expensive starts with more and regains more (see `Entry::chances`), so a
//! kernel that took a second to compile outlives one that took a microsecond and was used as
//! recently. When every build is cheap (or the cache is not cost-aware) this is plain CLOCK.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use super::entry::{Entry, MAX_CHANCES};
use super::sync::Ordering;

pub(super) struct Clock<K, V> {
    // Weak, so that the queue never delays a destroy: only the table and leases own entries.
    queue: VecDeque<Weak<Entry<K, V>>>,
}

/// What a sweep chose. Every `Arc` the sweep touched is handed back to the caller, so that
/// none is dropped (and possibly destroyed) while the policy lock is held.
pub(super) struct Sweep<K, V> {
    pub(super) victims: Vec<Arc<Entry<K, V>>>,
    pub(super) touched: Vec<Arc<Entry<K, V>>>,
}

impl<K, V> Clock<K, V> {
    pub(super) fn new() -> Self {
        Self {
            queue: VecDeque::new(),
        }
    }

    pub(super) fn clear(&mut self) {
        self.queue.clear();
    }

    /// Adds `newest`, then picks victims until `over(entries, weight)` is false for the
    /// projected totals. `newest` itself is never picked: an oversized entry is admitted alone.
    pub(super) fn admit(
        &mut self,
        newest: &Arc<Entry<K, V>>,
        mut entries: u64,
        mut weight: u64,
        over: impl Fn(u64, u64) -> bool,
    ) -> Sweep<K, V> {
        let mut sweep = Sweep {
            victims: Vec::new(),
            touched: Vec::new(),
        };
        if self.queue.len() > 2 * entries as usize + 32 {
            self.queue.retain(|weak| weak.strong_count() > 0);
        }
        self.queue.push_back(Arc::downgrade(newest));
        // An entry holds at most MAX_CHANCES; that many passes over the queue plus one more
        // use every chance up, so this bounds the sweep.
        let mut budget = (MAX_CHANCES as usize + 1) * self.queue.len() + 1;
        while over(entries, weight) && budget > 0 {
            budget -= 1;
            let Some(weak) = self.queue.pop_front() else {
                break;
            };
            let Some(entry) = weak.upgrade() else {
                continue;
            };
            if !entry.linked.load(Ordering::Acquire) {
                sweep.touched.push(entry);
                continue;
            }
            let chances = entry.chances.load(Ordering::Relaxed);
            if Arc::ptr_eq(&entry, newest) || chances > 0 {
                entry
                    .chances
                    .store(chances.saturating_sub(1), Ordering::Relaxed);
                self.queue.push_back(weak);
                sweep.touched.push(entry);
                continue;
            }
            entries = entries.saturating_sub(1);
            weight = weight.saturating_sub(entry.weight());
            sweep.victims.push(entry);
        }
        sweep
    }
}
