//! Build durations in fixed buckets, counted with atomics: recording one takes a few relaxed
//! additions, and only builds record (never a hit).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::text::Buckets;

/// Upper bounds of the buckets, in seconds: from a cached-binary load (under a millisecond) to
/// a large kernel's compile (a minute).
pub const BUILD_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// Observations per bucket (not cumulative: each falls in one), their number and their sum in
/// nanoseconds.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUILD_BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(i) = BUILD_BUCKETS.iter().position(|&bound| seconds <= bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Adds this histogram's observations to `into` (per-bucket counts, not cumulative).
    pub(crate) fn add_to(&self, into: &mut Tally) {
        for (sum, bucket) in into.buckets.iter_mut().zip(&self.buckets) {
            *sum += bucket.load(Ordering::Relaxed);
        }
        into.count += self.count.load(Ordering::Relaxed);
        into.sum_ns += self.sum_ns.load(Ordering::Relaxed);
    }
}

/// Histograms added up, per bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    buckets: [u64; BUILD_BUCKETS.len()],
    count: u64,
    sum_ns: u64,
}

impl Tally {
    /// The cumulative form the text format wants.
    pub(crate) fn buckets(&self) -> Buckets {
        let mut below = 0;
        Buckets {
            cumulative: BUILD_BUCKETS
                .iter()
                .zip(self.buckets)
                .map(|(&bound, n)| {
                    below += n;
                    (bound, below)
                })
                .collect(),
            count: self.count,
            sum: self.sum_ns as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_accumulate() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(300));
        h.observe(Duration::from_secs(120));
        let mut tally = Tally::default();
        h.add_to(&mut tally);
        h.add_to(&mut tally);
        let b = tally.buckets();
        assert_eq!(b.count, 8);
        assert_eq!(b.cumulative[0], (0.001, 4));
        assert_eq!(b.cumulative[6], (0.25, 4));
        assert_eq!(b.cumulative[7], (0.5, 6));
        assert_eq!(b.cumulative[11], (60.0, 6));
        assert!((b.sum - 2.0 * 120.3015).abs() < 1e-9);
    }
}
