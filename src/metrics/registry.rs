//! The process-wide list of live caches that [`super::render`] reads. A cache registers once,
//! when it is created, with a weak reference: the list never keeps a cache alive, and one
//! that is gone is skipped by the next render and pruned by the next registration. Lookups
//! never touch the list.

use std::sync::{Mutex, PoisonError, Weak};

use super::Totals;

/// A cache's figures, added to the process's totals when metrics are rendered.
pub(crate) trait Source: Send + Sync {
    fn add_to(&self, totals: &mut Totals);
}

static SOURCES: Mutex<Vec<Weak<dyn Source>>> = Mutex::new(Vec::new());

/// Lists `source` until its last strong reference is dropped.
pub(crate) fn register(source: Weak<dyn Source>) {
    let mut sources = SOURCES.lock().unwrap_or_else(PoisonError::into_inner);
    sources.retain(|s| s.strong_count() > 0);
    sources.push(source);
}

/// The totals of every live source.
pub(crate) fn collect() -> Totals {
    let live: Vec<_> = SOURCES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    // Read outside the lock: a cache created or dropped meanwhile does not wait for a render.
    let mut totals = Totals::default();
    for source in &live {
        source.add_to(&mut totals);
    }
    totals
}
