//! `kcache::metrics::render` after known lookups through the OpenCL backend on PoCL, a
//! memory cache of the Rust API and the CUDA backend on the test driver library, read back by a real Prometheus parser: every counter equals
//! what the test did, and caches drop out when they are freed. One test, because the metrics
//! are the whole process's.

use std::path::Path;
use std::sync::Arc;

use kcache::backend::cuda::{CudaCache, CudaOptions};
use kcache::backend::opencl::{OpenClCache, OpenClOptions};
use kcache::memory::{MemoryCache, Options};
use kcache::metrics;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::cuda::{FakeDriver, SAXPY_PTX};
use kcache_testkit::memory::touch;
use kcache_testkit::opencl::Context;
use kcache_testkit::prometheus::{Parsed, Parser};

const SAXPY: &str = "// metrics\n__kernel void saxpy(__global float *y, __global const float *x, \
                     float a) {\n size_t i = get_global_id(0);\n y[i] = a * x[i] + y[i];\n}\n";

fn scrape(parser: &Parser) -> Parsed {
    parser.parse(&metrics::render())
}

fn lookups(p: &Parsed, tier: &str, result: &str) -> f64 {
    p.value(&format!(
        "kcache_lookups_total{{result=\"{result}\",tier=\"{tier}\"}}"
    ))
}

/// The lookups of both tiers: memory hits and misses, disk hits and misses.
fn tier_lookups(p: &Parsed) -> [f64; 4] {
    [
        lookups(p, "memory", "hit"),
        lookups(p, "memory", "miss"),
        lookups(p, "disk", "hit"),
        lookups(p, "disk", "miss"),
    ]
}

fn of_backend(p: &Parsed, name: &str, backend: &str) -> f64 {
    p.value(&format!("{name}{{backend=\"{backend}\"}}"))
}

fn builds(p: &Parsed, backend: &str, result: &str) -> f64 {
    p.value(&format!(
        "kcache_builds_total{{backend=\"{backend}\",result=\"{result}\"}}"
    ))
}

/// An OpenCL cache on the disk tier in `dir`, and that disk tier.
fn opencl_cache(dir: &Path) -> (OpenClCache, Arc<Persistence>) {
    let disk = Arc::new(Persistence::open(PersistenceConfig::in_dir(dir)).unwrap());
    disk.wait_scan();
    let cache = OpenClCache::new(OpenClOptions {
        persistence: Some(Arc::clone(&disk)),
        ..OpenClOptions::default()
    })
    .unwrap();
    (cache, disk)
}

fn lookup(cache: &OpenClCache, context: &Context) {
    let lease = cache
        .find_or_build(context.context(), context.device(), &[SAXPY], "")
        .unwrap();
    drop(lease);
}

#[test]
fn every_counter_equals_what_the_lookups_did() {
    let Some(parser) = Parser::for_test() else {
        return;
    };
    let p = scrape(&parser);
    assert_eq!(p.value("kcache_build_info{version=\"0.1.0\"}"), 1.0);
    assert_eq!(of_backend(&p, "kcache_caches", "opencl"), 0.0);
    assert_eq!(p.value("kcache_disk_tiers{}"), 0.0);
    assert_eq!(lookups(&p, "memory", "hit"), 0.0);
    assert_eq!(
        p.types
            .get("kcache_build_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );

    // A cold process: one build written to disk, then two memory hits.
    let dir = tempfile::tempdir().unwrap();
    let Some(context) = Context::for_test() else {
        return;
    };
    let (cold, cold_disk) = opencl_cache(dir.path());
    for _ in 0..3 {
        lookup(&cold, &context);
    }
    cold.flush();
    let p = scrape(&parser);
    assert_eq!(of_backend(&p, "kcache_caches", "opencl"), 1.0);
    assert_eq!(tier_lookups(&p), [2.0, 1.0, 0.0, 1.0]);
    assert_eq!(lookups(&p, "memory", "wait"), 0.0);
    assert_eq!(builds(&p, "opencl", "ok"), 1.0);
    assert_eq!(builds(&p, "opencl", "failed"), 0.0);
    assert_eq!(of_backend(&p, "kcache_loads_total", "opencl"), 0.0);
    assert_eq!(
        of_backend(&p, "kcache_build_duration_seconds_count", "opencl"),
        1.0
    );
    let inf = "kcache_build_duration_seconds_bucket{backend=\"opencl\",le=\"+Inf\"}";
    assert_eq!(p.value(inf), 1.0);
    assert!(of_backend(&p, "kcache_build_duration_seconds_sum", "opencl") > 0.0);
    assert_eq!(p.value("kcache_disk_writes_total{result=\"ok\"}"), 1.0);
    assert_eq!(p.value("kcache_disk_writes_total{result=\"failed\"}"), 0.0);
    assert_eq!(p.value("kcache_entries{tier=\"memory\"}"), 1.0);
    assert_eq!(p.value("kcache_entries{tier=\"disk\"}"), 1.0);
    let file_size = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".kce"))
        .map(|e| e.metadata().unwrap().len())
        .sum::<u64>();
    assert_eq!(p.value("kcache_disk_bytes{}"), file_size as f64);
    assert_eq!(p.value("kcache_disk_tiers{}"), 1.0);
    assert_eq!(p.value("kcache_integrity_rejects_total{}"), 0.0);

    // A second process on the same directory (a fresh cache): it loads the binary, builds
    // nothing. Both caches are alive: their counters add up.
    let (warm, warm_disk) = opencl_cache(dir.path());
    lookup(&warm, &context);
    // A memory cache of the Rust API, one build and one hit.
    let plain: MemoryCache<Vec<u8>, u32> = MemoryCache::new(Options::default(), |_| Ok(()));
    for _ in 0..2 {
        touch(&plain, b"k", 7, 1);
    }
    let p = scrape(&parser);
    assert_eq!(of_backend(&p, "kcache_caches", "opencl"), 2.0);
    assert_eq!(of_backend(&p, "kcache_caches", "rust"), 1.0);
    assert_eq!(tier_lookups(&p), [3.0, 3.0, 1.0, 1.0]);
    assert_eq!(builds(&p, "opencl", "ok"), 1.0, "a load is not a build");
    assert_eq!(of_backend(&p, "kcache_loads_total", "opencl"), 1.0);
    assert_eq!(of_backend(&p, "kcache_loads_total", "rust"), 0.0);
    assert_eq!(builds(&p, "rust", "ok"), 1.0);
    assert_eq!(
        of_backend(&p, "kcache_build_duration_seconds_count", "rust"),
        1.0
    );
    assert_eq!(p.value("kcache_entries{tier=\"memory\"}"), 3.0);
    // Two disk tiers on one directory: each counts its entry.
    assert_eq!(p.value("kcache_entries{tier=\"disk\"}"), 2.0);
    assert_eq!(p.value("kcache_disk_tiers{}"), 2.0);

    // Freed caches drop out.
    drop((cold, cold_disk, plain));
    let p = scrape(&parser);
    assert_eq!(of_backend(&p, "kcache_caches", "opencl"), 1.0);
    assert_eq!(of_backend(&p, "kcache_caches", "rust"), 0.0);
    assert_eq!(tier_lookups(&p), [0.0, 1.0, 1.0, 0.0]);
    assert_eq!(builds(&p, "opencl", "ok"), 0.0);
    assert_eq!(p.value("kcache_disk_tiers{}"), 1.0);
    drop((warm, warm_disk));

    // The CUDA backend (on the test driver library): one build, one hit, under its own label.
    let fake = FakeDriver::new();
    let cuda = CudaCache::new(CudaOptions {
        driver: Some(fake.driver()),
        ..CudaOptions::default()
    })
    .unwrap();
    let raw = fake.create_context(0);
    // SAFETY: the test driver created the context; the cache is dropped before the driver.
    let context = unsafe { kcache::backend::cuda::Context::from_raw(raw) };
    for _ in 0..2 {
        drop(
            cuda.find_or_build_ptx(context, SAXPY_PTX.as_bytes(), &[])
                .unwrap(),
        );
    }
    let p = scrape(&parser);
    assert_eq!(of_backend(&p, "kcache_caches", "cuda"), 1.0);
    assert_eq!(of_backend(&p, "kcache_caches", "opencl"), 0.0);
    assert_eq!(builds(&p, "cuda", "ok"), 1.0);
    assert_eq!(lookups(&p, "memory", "hit"), 1.0);
    assert_eq!(lookups(&p, "memory", "miss"), 1.0);
    assert_eq!(p.value("kcache_disk_tiers{}"), 0.0);
    drop(cuda);
}
