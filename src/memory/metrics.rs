//! A memory tier's part in the process's metrics (`crate::metrics`): the counters it keeps
//! anyway (builds and loads among them, counted here), by backend, and its builds' durations.

use std::sync::Arc;
use std::time::Duration;

use super::Stats;
use super::shared::{Counters, bump};
use super::sync::{AtomicU64, Ordering};
use super::tally::AllCounts;
use crate::metrics::{Backend, Histogram, Source, Totals};

/// What making a value on a miss involved, for the counters and the build metrics: a load from
/// another tier is not a build.
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
    durations: Histogram,
}

impl MemorySource {
    pub(super) fn new(backend: Backend, counters: Arc<Counters>, hits: Arc<AllCounts>) -> Self {
        MemorySource {
            backend,
            counters,
            hits,
            durations: Histogram::default(),
        }
    }

    /// Records what a miss made: `took` is the whole call's duration, `ok` whether it gave a
    /// value (counted in `builds` or `loads`). Failures are counted in `build_failures` by the
    /// caller (loads never fail: a refused load is followed by a build).
    pub(super) fn made(&self, made: Made, took: Duration, ok: bool) {
        let took = match made {
            Made::Built => took,
            Made::BuiltIn(build) => build,
            Made::Loaded => {
                if ok {
                    bump(&self.counters.loads);
                }
                return;
            }
        };
        if ok {
            bump(&self.counters.builds);
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
        loads: load(&c.loads),
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
        backend.builds += stats.builds;
        backend.loads += stats.loads;
        backend.build_failures += stats.build_failures;
        self.durations.add_to(&mut backend.durations);
    }
}
