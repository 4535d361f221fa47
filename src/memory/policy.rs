//! Which entries go when a cap is exceeded: CLOCK (second chance), an approximation of LRU
//! that keeps hits free of any shared lock. Entries join the back of a queue when installed; the
//! hand takes from the front, and an entry hit since the hand last passed it gets another round.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use super::entry::Entry;
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
        // Two passes over the queue clear every second-chance bit, so this bounds the sweep.
        let mut budget = 2 * self.queue.len() + 1;
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
            if Arc::ptr_eq(&entry, newest) || entry.referenced.swap(false, Ordering::Relaxed) {
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
