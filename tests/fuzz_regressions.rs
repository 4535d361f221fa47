//! Inputs found by the fuzz targets (`fuzz/`, `docs/fuzzing.md`), kept as plain tests so that
//! `cargo test` guards the fixes without a nightly toolchain. Each test names its target.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kcache::DestroyError;
use kcache::memory::{Eviction, MemoryCache, Options};

/// memory_ops: a capacity sweep that evicts several values whose destroys fail must pass every
/// failure to `on_destroy_error` (README, "Destroy errors"), not only the first one. Found as
/// an install over `max_weight` evicting two failing entries and the hook seeing one error.
#[test]
fn capacity_eviction_reports_every_destroy_failure() {
    let hooked = Arc::new(AtomicU64::new(0));
    let hook = Arc::clone(&hooked);
    let cache: MemoryCache<Vec<u8>, u64> = MemoryCache::new(
        Options {
            max_weight: Some(10),
            eviction: Eviction::Clock,
            on_destroy_error: Some(Arc::new(move |_: &DestroyError| {
                hook.fetch_add(1, Ordering::Relaxed);
            })),
            ..Options::default()
        },
        |value| Err(DestroyError::new(7, format!("value {value}"))),
    );
    drop(
        cache
            .find_or_build(b"a".as_slice(), None, || Ok((1, 3)))
            .unwrap(),
    );
    drop(
        cache
            .find_or_build(b"b".as_slice(), None, || Ok((2, 3)))
            .unwrap(),
    );
    // Heavier than the whole cap: admitted alone, so both others are evicted and destroyed.
    let heavy = cache
        .find_or_build(b"c".as_slice(), None, || Ok((3, 100)))
        .unwrap();
    let stats = cache.stats();
    assert_eq!(stats.capacity_evictions, 2);
    assert_eq!(stats.destroys, 2);
    assert_eq!(stats.destroy_errors, 2);
    assert_eq!(
        hooked.load(Ordering::Relaxed),
        2,
        "every failure reaches the hook"
    );
    assert_eq!(cache.len(), 1);
    drop(heavy);
}
