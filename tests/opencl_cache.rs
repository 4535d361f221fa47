//! The OpenCL program cache against a real OpenCL implementation (PoCL in CI): every program
//! handed out is run and its output checked.

use std::sync::{Arc, Barrier};

use kcache::Error;
use kcache::backend::opencl::runtime::{self, Context, KernelArg};
use kcache::backend::opencl::sys::Api;
use kcache::backend::opencl::{OpenClCache, OpenClStats};

mod opencl_common;
use opencl_common::{cache_with_disk, memory_only_cache, poison_disk_entry};

/// `y = a * x + y`, tagged so that each test compiles a program no other test shares.
fn saxpy(tag: &str) -> String {
    format!(
        "// {tag}\n__kernel void saxpy(__global float *y, __global const float *x, float a) {{\n\
         size_t i = get_global_id(0);\n y[i] = a * x[i] + y[i];\n}}\n"
    )
}

fn check_saxpy(context: &Context, program: kcache::backend::opencl::sys::cl_program) {
    let n = 64;
    let mut y: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut x: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
    context
        .run_kernel(
            program,
            "saxpy",
            &mut [
                KernelArg::Floats(&mut y),
                KernelArg::Floats(&mut x),
                KernelArg::Float(0.5),
            ],
            n,
        )
        .unwrap();
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, 2.0 * i as f32, "element {i}");
    }
}

fn stats(cache: &OpenClCache) -> OpenClStats {
    cache.stats()
}

#[test]
fn cold_then_memory_hit_then_disk_hit_in_a_fresh_cache() {
    let dir = tempfile::tempdir().unwrap();
    let context = Context::first_device().unwrap();
    let source = saxpy("cold-memory-disk");

    let cache = cache_with_disk(dir.path());
    let cold = cache
        .get_or_build(context.raw(), context.device(), &[&source], "")
        .unwrap();
    check_saxpy(&context, cold.value().raw());
    let s = stats(&cache);
    assert_eq!((s.source_builds, s.binary_loads, s.disk_misses), (1, 0, 1));
    assert_eq!((s.memory.misses, s.memory.builds, s.memory.hits), (1, 1, 0));

    let hit = cache
        .get_or_build(context.raw(), context.device(), &[&source], "")
        .unwrap();
    assert_eq!(hit.value().raw(), cold.value().raw());
    check_saxpy(&context, hit.value().raw());
    let s = stats(&cache);
    assert_eq!((s.source_builds, s.memory.hits, s.memory.builds), (1, 1, 1));
    drop((cold, hit));
    drop(cache);

    // A new cache on the same directory stands for a new process: memory is empty.
    let fresh = cache_with_disk(dir.path());
    let from_disk = fresh
        .get_or_build(context.raw(), context.device(), &[&source], "")
        .unwrap();
    check_saxpy(&context, from_disk.value().raw());
    let s = stats(&fresh);
    assert_eq!((s.source_builds, s.binary_loads, s.disk_hits), (0, 1, 1));
    assert_eq!(s.binaries_rejected, 0);

    // The disk key leaves the context out: another context on the device reuses the binary,
    // while the memory tier keeps programs per context.
    let other = Context::new(context.device()).unwrap();
    let in_other = fresh
        .get_or_build(other.raw(), other.device(), &[&source], "")
        .unwrap();
    assert_ne!(in_other.value().raw(), from_disk.value().raw());
    check_saxpy(&other, in_other.value().raw());
    let s = stats(&fresh);
    assert_eq!((s.source_builds, s.binary_loads, s.disk_hits), (0, 2, 2));
    assert_eq!(fresh.len(), 2);
}

#[test]
fn options_and_source_split_are_part_of_the_key_the_way_the_driver_sees_them() {
    let context = Context::first_device().unwrap();
    let cache = memory_only_cache();
    let source = saxpy("options");
    let (head, tail) = source.split_at(source.len() / 2);
    let whole = cache
        .get_or_build(context.raw(), context.device(), &[&source], "")
        .unwrap();
    // The driver concatenates source strings: the same text in two pieces is the same program.
    let split = cache
        .get_or_build(context.raw(), context.device(), &[head, tail], "")
        .unwrap();
    assert_eq!(whole.value().raw(), split.value().raw());
    let optimised = cache
        .get_or_build(
            context.raw(),
            context.device(),
            &[&source],
            "-cl-fast-relaxed-math",
        )
        .unwrap();
    assert_ne!(optimised.value().raw(), whole.value().raw());
    check_saxpy(&context, optimised.value().raw());
    assert_eq!(stats(&cache).source_builds, 2);
}

#[test]
fn a_binary_the_driver_rejects_is_dropped_and_the_source_built() {
    let dir = tempfile::tempdir().unwrap();
    let context = Context::first_device().unwrap();
    let source = saxpy("rejected-binary");
    poison_disk_entry(dir.path(), &context, &[&source], "");

    let cache = cache_with_disk(dir.path());
    let lease = cache
        .get_or_build(context.raw(), context.device(), &[&source], "")
        .unwrap();
    check_saxpy(&context, lease.value().raw());
    let s = stats(&cache);
    assert_eq!(
        (s.disk_hits, s.binaries_rejected, s.source_builds),
        (1, 1, 1)
    );
    assert_eq!(s.binary_loads, 0);
    drop(lease);
    drop(cache);

    // The rebuilt binary replaced the rejected one.
    let fresh = cache_with_disk(dir.path());
    let lease = fresh
        .get_or_build(context.raw(), context.device(), &[&source], "")
        .unwrap();
    check_saxpy(&context, lease.value().raw());
    let s = stats(&fresh);
    assert_eq!(
        (s.binary_loads, s.binaries_rejected, s.source_builds),
        (1, 0, 0)
    );
}

#[test]
fn a_build_failure_carries_the_compiler_log_and_is_not_cached() {
    let context = Context::first_device().unwrap();
    let cache = memory_only_cache();
    let broken = "__kernel void broken(__global float *y) { y[0] = undeclared_thing; }";
    for attempt in 1..=2u64 {
        let error = cache
            .get_or_build(context.raw(), context.device(), &[broken], "")
            .unwrap_err();
        let Error::Build(build) = error else {
            panic!("expected a build error, got {error:?}")
        };
        assert_eq!(build.code, -11, "CL_BUILD_PROGRAM_FAILURE");
        assert!(
            build.message.contains("undeclared_thing"),
            "the log names the culprit: {}",
            build.message
        );
        let s = stats(&cache);
        assert_eq!(s.memory.build_failures, attempt);
        assert_eq!(s.memory.entries, 0);
    }
}

fn reference_count(program: kcache::backend::opencl::sys::cl_program) -> u32 {
    runtime::program_reference_count(Api::get().unwrap(), program).unwrap()
}

/// Builds `count` programs in `context`, each with one extra reference held by the test so
/// that the count can be read after the cache lets go.
fn build_and_pin(
    cache: &OpenClCache,
    context: &Context,
    tag: &str,
    count: usize,
) -> Vec<kcache::backend::opencl::sys::cl_program> {
    let api = Api::get().unwrap();
    (0..count)
        .map(|i| {
            let lease = cache
                .get_or_build(
                    context.raw(),
                    context.device(),
                    &[&saxpy(&format!("{tag}-{i}"))],
                    "",
                )
                .unwrap();
            let program = lease.value().raw();
            runtime::retain_program(api, program).unwrap();
            assert_eq!(reference_count(program), 2);
            program
        })
        .collect()
}

fn release_pins(programs: Vec<kcache::backend::opencl::sys::cl_program>) {
    for program in programs {
        runtime::release_program(Api::get().unwrap(), program);
    }
}

#[test]
fn evicting_a_context_releases_each_of_its_programs_once() {
    let cache = memory_only_cache();
    let first = Context::first_device().unwrap();
    let second = Context::new(first.device()).unwrap();
    let evicted = build_and_pin(&cache, &first, "evict-context-a", 2);
    let kept = build_and_pin(&cache, &second, "evict-context-b", 1);

    assert_eq!(cache.evict_context(first.raw()).unwrap(), 2);
    for &program in &evicted {
        assert_eq!(reference_count(program), 1, "released exactly once");
    }
    assert_eq!(reference_count(kept[0]), 2, "other contexts keep theirs");
    let s = stats(&cache);
    assert_eq!((s.memory.destroys, s.memory.device_evictions), (2, 2));
    assert_eq!(cache.len(), 1);
    // A second eviction has nothing left to release.
    assert_eq!(cache.evict_context(first.raw()).unwrap(), 0);
    assert_eq!(stats(&cache).memory.destroys, 2);

    // The context still works with the cache afterwards.
    let again = cache
        .get_or_build(
            first.raw(),
            first.device(),
            &[&saxpy("evict-context-a-0")],
            "",
        )
        .unwrap();
    check_saxpy(&first, again.value().raw());
    release_pins(evicted);
    release_pins(kept);
}

#[test]
fn evicting_a_device_releases_its_programs_in_every_context_once() {
    let cache = memory_only_cache();
    let first = Context::first_device().unwrap();
    let second = Context::new(first.device()).unwrap();
    let mut pinned = build_and_pin(&cache, &first, "evict-device-a", 2);
    pinned.extend(build_and_pin(&cache, &second, "evict-device-b", 1));

    // A lease held across the eviction keeps its program alive until it is released.
    let held = cache
        .get_or_build(
            first.raw(),
            first.device(),
            &[&saxpy("evict-device-a-0")],
            "",
        )
        .unwrap();
    assert_eq!(cache.evict_device(first.device()).unwrap(), 3);
    assert_eq!(cache.len(), 0);
    assert_eq!(reference_count(pinned[0]), 2, "still leased");
    check_saxpy(&first, held.value().raw());
    for &program in &pinned[1..] {
        assert_eq!(reference_count(program), 1);
    }
    drop(held);
    assert_eq!(
        reference_count(pinned[0]),
        1,
        "released with the last lease"
    );
    assert_eq!(stats(&cache).memory.destroys, 3);
    release_pins(pinned);
}

#[test]
fn eight_threads_on_one_cold_key_run_one_build() {
    let cache = Arc::new(memory_only_cache());
    let context = Arc::new(Context::first_device().unwrap());
    let source = saxpy("eight-threads");
    let barrier = Arc::new(Barrier::new(8));
    let programs: Vec<usize> = (0..8)
        .map(|_| {
            let (cache, context, barrier, source) = (
                Arc::clone(&cache),
                Arc::clone(&context),
                Arc::clone(&barrier),
                source.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                let lease = cache
                    .get_or_build(context.raw(), context.device(), &[&source], "")
                    .unwrap();
                check_saxpy(&context, lease.value().raw());
                lease.value().raw() as usize
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert!(programs.iter().all(|p| *p == programs[0]));
    let s = stats(&cache);
    assert_eq!(s.source_builds, 1, "one clBuildProgram");
    assert_eq!(s.memory.builds, 1);
    assert_eq!(s.memory.misses, 1);
    assert_eq!(s.memory.waits + s.memory.hits, 7);
}

#[test]
fn null_handles_are_invalid_arguments() {
    let cache = memory_only_cache();
    let error = cache
        .get_or_build(std::ptr::null_mut(), std::ptr::null_mut(), &["x"], "")
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)));
}
