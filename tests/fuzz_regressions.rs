//! Inputs found by the fuzz targets (`fuzz/`, `docs/fuzzing.md`), kept as plain tests so that
//! `cargo test` guards the fixes without a nightly toolchain. Each test names its target.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kcache::DestroyError;
use kcache::memory::{Eviction, MAX_ENTRY_WEIGHT, MemoryCache, Options};
use kcache_testkit::memory::touch;

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
    touch(&cache, b"a", 1, 3);
    touch(&cache, b"b", 2, 3);
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

/// memory_ops (a case its weights cannot reach): weights near `u64::MAX` made the total weight
/// overflow (a panic under overflow checks, a wrapped total that stopped the weight cap
/// otherwise). Each entry now counts as at most `MAX_ENTRY_WEIGHT`.
#[test]
fn huge_weights_neither_overflow_nor_disable_the_cap() {
    let cache: MemoryCache<Vec<u8>, u64> = MemoryCache::new(
        Options {
            max_weight: Some(10),
            eviction: Eviction::Clock,
            ..Options::default()
        },
        |_| Ok(()),
    );
    let huge = cache
        .find_or_build(b"huge".as_slice(), None, || Ok((1, u64::MAX - 1)))
        .unwrap();
    assert_eq!(huge.weight(), MAX_ENTRY_WEIGHT);
    assert_eq!(cache.stats().weight, MAX_ENTRY_WEIGHT);
    drop(huge);
    // The next install finds the total over the cap and evicts the heavy entry.
    touch(&cache, b"small", 2, 5);
    let stats = cache.stats();
    assert_eq!((stats.weight, stats.capacity_evictions), (5, 1));
    assert_eq!(cache.len(), 1);
}
