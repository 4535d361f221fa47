//! A memory tier's part in the process's metrics (`crate::metrics`): the counters it keeps
//! anyway, and the builds it ran, by backend, with their durations.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};
use std::time::Duration;

use super::Stats;
use super::shared::Counters;
use super::sync::{AtomicU64, Ordering};
use super::tally::AllCounts;
use crate::metrics::{Backend, Histogram, Source, Totals};

/// What making a value on a miss involved, for the build metrics: a load from another tier is
/// not a build.
pub(crate) enum Made {
    /// The whole call was a build.
    Built,
    /// A build that took this long, after other work (a disk read, a wait for another
    /// process).
    BuiltIn(Duration),
    /// Nothing was built: the value was loaded.
    Loaded,
}

/// Registered in the process-wide list while its cache lives.
pub(super) struct MemorySource {
    backend: Backend,
    counters: Arc<Counters>,
    hits: Arc<AllCounts>,
    /// Builds that returned a value (`Counters::builds` also counts loads).
    builds: StdAtomicU64,
    durations: Histogram,
}

impl MemorySource {
    pub(super) fn new(backend: Backend, counters: Arc<Counters>, hits: Arc<AllCounts>) -> Self {
        MemorySource {
            backend,
            counters,
            hits,
            builds: StdAtomicU64::new(0),
            durations: Histogram::default(),
        }
    }

    /// Records what a miss made: `took` is the whole call's duration, `ok` whether it gave a
    /// value. Failures are `Counters::build_failures` already (loads never fail: a refused
    /// load is followed by a build).
    pub(super) fn made(&self, made: Made, took: Duration, ok: bool) {
        let took = match made {
            Made::Built => took,
            Made::BuiltIn(build) => build,
            Made::Loaded => return,
        };
        if ok {
            self.builds.fetch_add(1, StdOrdering::Relaxed);
        }
        self.durations.observe(took);
    }
}

/// The counters of a memory tier; `leases` is left at zero (counting them walks the table).
pub(super) fn stats(counters: &Counters, hits: &AllCounts) -> Stats {
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let c = counters;
    let mut stats = Stats {
        builds: load(&c.builds),
        build_failures: load(&c.build_failures),
        waits: load(&c.waits),
        discarded: load(&c.discarded),
        capacity_evictions: load(&c.capacity_evictions),
        device_evictions: load(&c.device_evictions),
        clears: load(&c.clears),
        destroys: load(&c.destroys),
        destroy_errors: load(&c.destroy_errors),
        entries: load(&c.entries),
        weight: load(&c.weight),
        ..Stats::default()
    };
    (stats.hits, stats.misses) = hits.totals();
    stats
}

impl Source for MemorySource {
    fn add_to(&self, totals: &mut Totals) {
        let stats = stats(&self.counters, &self.hits);
        totals.memory += stats;
        let backend = totals.backend(self.backend);
        backend.caches += 1;
        backend.builds += self.builds.load(StdOrdering::Relaxed);
        backend.build_failures += stats.build_failures;
        self.durations.add_to(&mut backend.durations);
    }
}
