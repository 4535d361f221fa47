//! What the OpenCL layer adds to a call: `clGetProgramBuildInfo`, which it intercepts (a look-up
//! of the program among those it serves), and `clGetDeviceInfo`, which it passes through (its
//! table holds the loader's own entry), each through the layer's dispatch table and straight to
//! the ICD loader, on PoCL. The intercepted query goes to a program the layer served; the
//! direct one to a program the driver built from the same source, so that both reach a built
//! program. The layer is the one cargo built next to this bench
//! (`cargo build --release -p kcache-opencl-layer` first); its cache is the environment's
//! (`KCACHE_DIR`, …).

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use kcache_testkit::needs;
use kcache_testkit::opencl::Context;
use kcache_testkit::opencl_layer::LayerTable;

const SOURCE: &str = "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }";

fn layer_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's own path");
    // target/<profile>/deps/<bench> -> target/<profile>/
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    dir.join("libkcache_opencl_layer.so")
}

fn layer(c: &mut Criterion) {
    // `cargo build --workspace` builds the layer, `cargo test --all-targets` alone does not:
    // without it, or without a device, this says so and measures nothing.
    let built = needs::file(
        layer_path(),
        "run cargo build --workspace; scripts/test does",
    );
    let Some(path) = needs::met(built) else {
        return;
    };
    let Some(context) = Context::for_test() else {
        return;
    };
    let table = LayerTable::load(&path).expect("the layer's table");
    assert!(
        table.passes_device_info_through(),
        "clGetDeviceInfo goes straight to the loader"
    );
    let program = table.build(&context, SOURCE).expect("a served build");
    assert_eq!(
        table.build_status(true, &program, &context),
        0,
        "CL_BUILD_SUCCESS"
    );
    // The same question straight to the loader, about a program the driver built.
    let plain = context
        .build_uncached(&[SOURCE], "")
        .expect("a driver build");
    assert_eq!(table.build_status(false, &plain, &context), 0);

    let mut group = c.benchmark_group("opencl_layer");
    group.bench_function("clGetProgramBuildInfo, straight to the loader", |b| {
        b.iter(|| black_box(table.build_status(false, &plain, &context)))
    });
    group.bench_function(
        "clGetProgramBuildInfo, through the layer (intercepted)",
        |b| b.iter(|| black_box(table.build_status(true, &program, &context))),
    );
    group.bench_function("clGetDeviceInfo, straight to the loader", |b| {
        b.iter(|| black_box(table.compute_units(false, &context)))
    });
    group.bench_function("clGetDeviceInfo, through the layer (passed through)", |b| {
        b.iter(|| black_box(table.compute_units(true, &context)))
    });
    group.finish();
}

criterion_group!(benches, layer);
criterion_main!(benches);
