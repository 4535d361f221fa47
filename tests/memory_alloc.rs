//! A hit allocates nothing, counted by a global allocator that tallies allocation calls.

use kcache::memory::{MemoryCache, Options};

#[test]
fn hits_allocate_nothing() {
    let cache: MemoryCache<Vec<u8>, u64> = MemoryCache::new(
        Options {
            max_entries: Some(1_000),
            ..Options::default()
        },
        |_| Ok(()),
    );
    let keys: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_le_bytes().repeat(8)).collect();
    let misses = allocation_counter::measure(|| {
        for (i, key) in keys.iter().enumerate() {
            cache
                .find_or_build(key.as_slice(), Some(0), || Ok((i as u64, 1)))
                .unwrap();
        }
    });
    assert!(misses.count_total >= 100, "the counter sees the inserts");

    let mut sum = 0;
    let hits = allocation_counter::measure(|| {
        for _ in 0..10 {
            for key in &keys {
                let lease = cache
                    .find_or_build(key.as_slice(), Some(0), || unreachable!("all hits"))
                    .unwrap();
                sum += *lease;
                let again = cache.get(key.as_slice()).unwrap();
                sum += *again;
            }
        }
    });
    assert_eq!(sum, 2 * 10 * (0..100).sum::<u64>());
    assert_eq!(
        hits.count_total, 0,
        "hits allocated {} times",
        hits.count_total
    );
    assert_eq!(cache.stats().hits, 2_000);
}
