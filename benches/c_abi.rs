//! A hit through the C ABI (`kc_cache_find_or_build`, `kc_lease_value` and `kc_lease_release`,
//! as a C caller makes them) against the same hit through the Rust API (`MemoryCache::find_or_build` + dropping the
//! lease), on the same cache type, keys and values. Criterion measures each; the closing line
//! prints their ratio from back-to-back runs, so machine speed cancels out.

use std::ffi::c_void;
use std::hint::black_box;
use std::ptr;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use kcache::ffi::RawValue;
use kcache::memory::{MemoryCache, Options};
use kcache_testkit::ffi::CCache;

const KEYS: usize = 1_000;
const OPS: usize = 1_000_000;

fn keys() -> Vec<Vec<u8>> {
    (0..KEYS)
        .map(|i| format!("kernel-{i:08}-sm90").into_bytes())
        .collect()
}

/// The two ways in, filled with the same keys.
struct Caches {
    c: CCache,
    rust: MemoryCache<Vec<u8>, RawValue>,
}

impl Caches {
    fn new(keys: &[Vec<u8>]) -> Self {
        let c = CCache::new().unwrap();
        let rust = MemoryCache::new(Options::default(), |_| Ok(()));
        let caches = Caches { c, rust };
        for key in keys {
            let value = key.as_ptr().cast_mut().cast::<c_void>();
            caches
                .rust
                .find_or_build(key.as_slice(), None, || Ok((RawValue(value), 0)))
                .unwrap();
            assert_eq!(caches.c_hit(key, value), value);
        }
        caches
    }

    fn c_hit(&self, key: &[u8], ctx: *mut c_void) -> *mut c_void {
        self.c.find_or_build(key, RawValue(ctx)).0
    }

    fn rust_hit(&self, key: &[u8]) -> *mut c_void {
        let lease = self
            .rust
            .find_or_build(key, None, || unreachable!("all hits"))
            .unwrap();
        lease.0
    }
}

fn hits(c: &mut Criterion) {
    let keys = keys();
    let caches = Caches::new(&keys);
    let mut group = c.benchmark_group("hit");
    let mut i = 0;
    group.bench_function("rust find_or_build+drop", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(caches.rust_hit(black_box(&keys[i])))
        })
    });
    group.bench_function("c_abi kc_cache_find_or_build+kc_lease_release", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(caches.c_hit(black_box(&keys[i]), ptr::null_mut()))
        })
    });
    group.finish();
}

criterion_group!(benches, hits);

fn time(ops: usize, mut hit: impl FnMut(usize)) -> Duration {
    let began = Instant::now();
    for i in 0..ops {
        hit(i % KEYS);
    }
    began.elapsed()
}

/// Nanoseconds per hit for each way in, best of seven alternating runs.
fn ratio() {
    let keys = keys();
    let caches = Caches::new(&keys);
    let (mut rust, mut c) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..7 {
        let r = time(OPS, |i| {
            black_box(caches.rust_hit(black_box(&keys[i])));
        });
        let k = time(OPS, |i| {
            black_box(caches.c_hit(black_box(&keys[i]), ptr::null_mut()));
        });
        rust = rust.min(r.as_nanos() as f64 / OPS as f64);
        c = c.min(k.as_nanos() as f64 / OPS as f64);
    }
    println!(
        "\nhit, {KEYS} keys, 1 thread, best of 7 x {OPS}: Rust API {rust:.1} ns, C ABI {c:.1} ns, \
         C ABI / Rust API = {:.2}x (target <= 1.30x)",
        c / rust
    );
}

/// `KCACHE_BENCH_PEER=rust|c KCACHE_BENCH_OPS=<n>`: only `n` hits one way in, for an
/// instruction counter (`scripts/hit-cost`).
fn one_way(name: &str, ops: usize) {
    let keys = keys();
    let caches = Caches::new(&keys);
    let took = match name {
        "rust" => time(ops, |i| {
            black_box(caches.rust_hit(black_box(&keys[i])));
        }),
        "c" => time(ops, |i| {
            black_box(caches.c_hit(black_box(&keys[i]), ptr::null_mut()));
        }),
        other => panic!("KCACHE_BENCH_PEER={other:?}: not a way in (rust, c)"),
    };
    println!(
        "{name}: {ops} hits, {:.1} ns each",
        took.as_nanos() as f64 / ops as f64
    );
}

fn main() {
    kcache_testkit::bench::main_with_peers(OPS, one_way, benches, ratio);
}
