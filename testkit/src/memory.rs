//! Short forms for driving a `MemoryCache` keyed by bytes, as the memory tier's tests do.

use kcache::memory::MemoryCache;

/// Looks `key` up (no device), building `value` of `weight` on a miss, and releases the lease
/// at once: for a test that counts lookups or fills the cache, not one that holds a value.
pub fn touch<V: Send + Sync + 'static>(
    cache: &MemoryCache<Vec<u8>, V>,
    key: &[u8],
    value: V,
    weight: u64,
) {
    drop(
        cache
            .find_or_build(key, None, || Ok((value, weight)))
            .unwrap(),
    );
}
