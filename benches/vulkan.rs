//! What a compute pipeline costs to get, on the machine's Vulkan driver (lavapipe in CI):
//!
//! - `vkCreateComputePipelines`: what a caller without a cache does for every pipeline
//!   (shader module, layouts, pipeline, no pipeline cache);
//! - `kcache memory hit`: a lookup with a prepared `PipelineSpec` that finds the pipeline;
//! - `kcache spec + memory hit`: the same, validating and digesting the description again
//!   each time (for callers that do not keep the `PipelineSpec`).
//!
//! The closing table gives the ratios from one back-to-back run, so machine speed cancels out.
//! The disk tier is not measured: lavapipe's `vkGetPipelineCacheData` holds only the header,
//! so a warm start cannot be faster on it; that needs a driver that serializes pipelines.

#[path = "../tests/vulkan_common/mod.rs"]
mod vulkan_common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use kcache::backend::vulkan::{PipelineSpec, VulkanCache, VulkanDevice};
use kcache_testkit::vulkan::TestGpu;
use vulkan_common::{cache, spec, vulkan};

struct Setup {
    gpu: Arc<TestGpu>,
    cache: VulkanCache,
    device: VulkanDevice,
    spec: PipelineSpec,
}

fn setup() -> Setup {
    let vulkan = vulkan();
    let gpu = Arc::new(TestGpu::unvalidated().expect("a Vulkan device"));
    let cache = cache(vulkan);
    let device = cache.register_owned_device(gpu.clone()).unwrap();
    let spec = spec(3);
    drop(cache.find_or_build(&device, &spec).unwrap());
    Setup {
        gpu,
        cache,
        device,
        spec,
    }
}

fn hit(s: &Setup) {
    black_box(
        s.cache
            .find_or_build(&s.device, &s.spec)
            .unwrap()
            .pipeline(),
    );
}

fn spec_and_hit(s: &Setup) {
    black_box(
        s.cache
            .find_or_build(&s.device, &spec(3))
            .unwrap()
            .pipeline(),
    );
}

fn create(s: &Setup) {
    s.gpu.create_pipeline_uncached(&s.spec).unwrap();
}

fn pipelines(c: &mut Criterion) {
    let s = setup();
    let mut group = c.benchmark_group("vulkan");
    group.bench_function("vkCreateComputePipelines", |b| b.iter(|| create(&s)));
    group.bench_function("kcache memory hit", |b| b.iter(|| hit(&s)));
    group.bench_function("kcache spec + memory hit", |b| b.iter(|| spec_and_hit(&s)));
    group.finish();
    s.cache.unregister_device(&s.device).unwrap();
}

fn per_call(iters: u32, f: impl Fn()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed() / iters
}

fn ratio_table() {
    let s = setup();
    println!("vulkan pipeline lookup ({}):", s.gpu.name());
    let create = per_call(200, || create(&s));
    let hit = per_call(1_000_000, || hit(&s));
    let spec_hit = per_call(100_000, || spec_and_hit(&s));
    println!("  vkCreateComputePipelines   {create:>12.2?}");
    println!(
        "  kcache spec + memory hit   {spec_hit:>12.2?}   {:>8.0}x faster",
        create.as_secs_f64() / spec_hit.as_secs_f64()
    );
    println!(
        "  kcache memory hit          {hit:>12.2?}   {:>8.0}x faster",
        create.as_secs_f64() / hit.as_secs_f64()
    );
    s.cache.unregister_device(&s.device).unwrap();
}

criterion_group!(benches, pipelines);

fn main() {
    // Without a device or `glslangValidator` (`cargo test --all-targets` on a bare machine),
    // this says so and measures nothing.
    if TestGpu::unvalidated_for_test().is_none() {
        return;
    }
    // `KCACHE_BENCH_OPS=<n>`: only `n` memory hits, for an instruction counter
    // (`scripts/hit-compare`).
    if let Ok(ops) = std::env::var("KCACHE_BENCH_OPS") {
        let s = setup();
        (0..ops.parse::<u32>().unwrap()).for_each(|_| hit(&s));
        s.cache.unregister_device(&s.device).unwrap();
        return;
    }
    kcache_testkit::bench::main(benches, ratio_table);
}
