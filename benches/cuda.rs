//! The CUDA adapter's memory hit (`CudaCache::find_or_build_ptx` on a cached module) against
//! its peer, a `Mutex<HashMap>` lookup of the same key bytes (context address + PTX), as a
//! runtime without kcache would write it.
//!
//! No GPU is available in CI: the driver here is the test library `c-tests/cuda/fake_cuda.c`,
//! which stands in for `libcuda.so.1`. A hit makes no driver call, so what is measured is
//! kcache's own cost. The GPU figures (JIT, CUDA's cache, kcache's disk and memory hits) come
//! from `scripts/gpu-check`. The closing table (with `--bench`) gives the ratio from one run.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use kcache::backend::cuda::{CUcontext, Context, CudaCache, CudaOptions};
use kcache_testkit::cuda::{FakeDriver, PrimaryContext, SAXPY_PTX};

struct Setup {
    // Kept alive for the cache's driver.
    _fake: FakeDriver,
    cache: CudaCache,
    context: Option<Context>,
    peer: Mutex<HashMap<Vec<u8>, usize>>,
}

fn setup() -> Setup {
    let fake = FakeDriver::new();
    let driver = fake.driver();
    let cache = CudaCache::new(CudaOptions {
        driver: Some(Arc::clone(&driver)),
        ..CudaOptions::default()
    })
    .unwrap();
    // Never released: the context outlives every cache of the run.
    PrimaryContext::bind(&driver, driver.device(0).unwrap()).unwrap();
    let context = cache.current_context().unwrap();
    let raw: CUcontext = context.unwrap().raw();
    let module = cache
        .find_or_build_ptx(context, SAXPY_PTX.as_bytes(), &[])
        .unwrap()
        .raw();
    let mut peer = HashMap::new();
    peer.insert(peer_key(raw), module as usize);
    Setup {
        _fake: fake,
        cache,
        context,
        peer: Mutex::new(peer),
    }
}

fn peer_key(context: CUcontext) -> Vec<u8> {
    let mut key = (context as usize).to_le_bytes().to_vec();
    key.extend_from_slice(SAXPY_PTX.as_bytes());
    key
}

fn kcache_hit(s: &Setup) -> usize {
    let lease = s
        .cache
        .find_or_build_ptx(s.context, black_box(SAXPY_PTX.as_bytes()), &[]);
    lease.unwrap().raw() as usize
}

fn peer_hit(s: &Setup, buf: &mut Vec<u8>) -> usize {
    let context = s.context.unwrap().raw();
    buf.clear();
    buf.extend_from_slice(&(context as usize).to_le_bytes());
    buf.extend_from_slice(black_box(SAXPY_PTX.as_bytes()));
    *s.peer.lock().unwrap().get(buf.as_slice()).unwrap()
}

fn hits(c: &mut Criterion) {
    let s = setup();
    let mut group = c.benchmark_group("cuda memory hit");
    group.bench_function("kcache find_or_build_ptx", |b| b.iter(|| kcache_hit(&s)));
    let mut buf = Vec::new();
    group.bench_function("Mutex<HashMap> get", |b| b.iter(|| peer_hit(&s, &mut buf)));
    group.finish();
}

criterion_group!(benches, hits);

fn time(rounds: u32, mut f: impl FnMut() -> usize) -> Duration {
    let start = Instant::now();
    for _ in 0..rounds {
        black_box(f());
    }
    start.elapsed() / rounds
}

fn ratios() {
    let s = setup();
    let rounds = 200_000;
    let mut buf = Vec::new();
    // Warm both paths first so neither pays for first-touch costs.
    time(rounds / 10, || kcache_hit(&s));
    time(rounds / 10, || peer_hit(&s, &mut buf));
    let kcache = time(rounds, || kcache_hit(&s));
    let peer = time(rounds, || peer_hit(&s, &mut buf));
    println!(
        "\nCUDA memory hit, {} bytes of PTX, one thread:",
        SAXPY_PTX.len()
    );
    println!("  kcache find_or_build_ptx  {:>8.1?}", kcache);
    println!("  Mutex<HashMap> get        {:>8.1?}", peer);
    println!(
        "  kcache / peer             {:>8.2}x",
        kcache.as_secs_f64() / peer.as_secs_f64()
    );
}

fn main() {
    // `KCACHE_BENCH_OPS=<n>`: only `n` memory hits, for an instruction counter
    // (`scripts/hit-compare`).
    if let Ok(ops) = std::env::var("KCACHE_BENCH_OPS") {
        let s = setup();
        (0..ops.parse::<u32>().unwrap()).for_each(|_| {
            black_box(kcache_hit(&s));
        });
        return;
    }
    kcache_testkit::bench::main(benches, ratios);
}
