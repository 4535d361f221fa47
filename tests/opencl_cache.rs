//! The OpenCL program cache against a real OpenCL implementation (PoCL in CI): every program
//! handed out is run and its output checked.

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::{Arc, Barrier};

use kcache::Error;
use kcache::backend::opencl::{
    CL_BUILD_PROGRAM_FAILURE, OpenClCache, OpenClOptions, OpenClStats, Program, ProgramLease,
    program_disk_key,
};
use kcache::disk::DiskStats;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::{Context, KernelArg, reference_count, run_kernel};
use tempfile::TempDir;

mod opencl_common;
use opencl_common::{cache_with_disk, memory_only_cache, poison_disk_entry};

/// `y = a * x + y`, tagged so that each test compiles a program no other test shares.
fn saxpy(tag: &str) -> String {
    format!(
        "// {tag}\n__kernel void saxpy(__global float *y, __global const float *x, float a) {{\n\
         size_t i = get_global_id(0);\n y[i] = a * x[i] + y[i];\n}}\n"
    )
}

fn check_saxpy(context: &Context, program: &Program) {
    let n = 64;
    let mut y: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
    let mut args = [
        KernelArg::Floats(&mut y),
        KernelArg::Input(&x),
        KernelArg::Float(0.5),
    ];
    run_kernel(context, program, "saxpy", &mut args, n).unwrap();
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, 2.0 * i as f32, "element {i}");
    }
}

/// Looks `sources` up with `options` in `context`'s context and device.
fn find(
    cache: &OpenClCache,
    context: &Context,
    sources: &[&str],
    options: &str,
) -> kcache::Result<ProgramLease> {
    cache.find_or_build(context.context(), context.device(), sources, options)
}

/// Looks `source` up without options in `context`'s context and device, and runs the program.
fn checked_lease(cache: &OpenClCache, context: &Context, source: &str) -> ProgramLease {
    let lease = find(cache, context, &[source], "").unwrap();
    check_saxpy(context, lease.value());
    lease
}

/// A directory for the disk tier, removed on drop, a context on the first device, and the saxpy
/// source tagged `tag`.
/// `None` when there is no OpenCL device (the test skipped).
fn disk_setup(tag: &str) -> Option<(TempDir, Context, String)> {
    let dir = tempfile::tempdir().unwrap();
    Some((dir, Context::for_test()?, saxpy(tag)))
}

fn stats(cache: &OpenClCache) -> OpenClStats {
    cache.stats()
}

/// Opens a cache on the disk tier in `dir` (to the cache, a new process), looks `source` up in
/// it and runs the program, and returns the cache's counters.
fn lookup_in_fresh_cache(dir: &Path, context: &Context, source: &str) -> OpenClStats {
    let cache = cache_with_disk(dir);
    drop(checked_lease(&cache, context, source));
    cache.flush();
    stats(&cache)
}

#[test]
fn cold_then_memory_hit_then_disk_hit_in_a_fresh_cache() {
    let Some((dir, context, source)) = disk_setup("cold-memory-disk") else {
        return;
    };

    let cache = cache_with_disk(dir.path());
    let cold = checked_lease(&cache, &context, &source);
    let s = stats(&cache);
    assert_eq!((s.source_builds, s.binary_loads, s.disk_misses), (1, 0, 1));
    assert_eq!((s.memory.misses, s.memory.builds, s.memory.hits), (1, 1, 0));

    let hit = find(&cache, &context, &[&source], "").unwrap();
    assert_eq!(hit.value().raw(), cold.value().raw());
    check_saxpy(&context, hit.value());
    let s = stats(&cache);
    assert_eq!((s.source_builds, s.memory.hits, s.memory.builds), (1, 1, 1));
    drop((cold, hit));
    drop(cache);

    // A new cache on the same directory stands for a new process: memory is empty.
    let fresh = cache_with_disk(dir.path());
    let from_disk = checked_lease(&fresh, &context, &source);
    let s = stats(&fresh);
    assert_eq!((s.source_builds, s.binary_loads, s.disk_hits), (0, 1, 1));
    assert_eq!(s.binaries_rejected, 0);
    assert_eq!(
        (s.memory.builds, s.memory.loads),
        (0, 1),
        "a load is not a build"
    );

    // The disk key leaves the context out: another context on the device reuses the binary,
    // while the memory tier keeps programs per context.
    let other = Context::new(context.device()).unwrap();
    let in_other = find(&fresh, &other, &[&source], "").unwrap();
    assert_ne!(in_other.value().raw(), from_disk.value().raw());
    check_saxpy(&other, in_other.value());
    let s = stats(&fresh);
    assert_eq!((s.source_builds, s.binary_loads, s.disk_hits), (0, 2, 2));
    assert_eq!(fresh.len(), 2);
}

#[test]
fn options_and_source_split_are_part_of_the_key_the_way_the_driver_sees_them() {
    let Some(context) = Context::for_test() else {
        return;
    };
    let cache = memory_only_cache();
    let source = saxpy("options");
    let (head, tail) = source.split_at(source.len() / 2);
    let whole = find(&cache, &context, &[&source], "").unwrap();
    // The driver concatenates source strings: the same text in two pieces is the same program.
    let split = find(&cache, &context, &[head, tail], "").unwrap();
    assert_eq!(whole.value().raw(), split.value().raw());
    let optimised = find(&cache, &context, &[&source], "-cl-fast-relaxed-math").unwrap();
    assert_ne!(optimised.value().raw(), whole.value().raw());
    check_saxpy(&context, optimised.value());
    assert_eq!(stats(&cache).source_builds, 2);
}

#[test]
fn a_binary_the_driver_rejects_is_dropped_and_the_source_built() {
    let Some((dir, context, source)) = disk_setup("rejected-binary") else {
        return;
    };
    poison_disk_entry(dir.path(), &context, &[&source], "");

    let s = lookup_in_fresh_cache(dir.path(), &context, &source);
    assert_eq!(
        (s.disk_hits, s.binaries_rejected, s.source_builds),
        (1, 1, 1)
    );
    assert_eq!(s.binary_loads, 0);

    // The rebuilt binary replaced the rejected one.
    let s = lookup_in_fresh_cache(dir.path(), &context, &source);
    assert_eq!(
        (s.binary_loads, s.binaries_rejected, s.source_builds),
        (1, 0, 0)
    );
}

#[test]
fn a_build_failure_carries_the_compiler_log_and_is_not_cached() {
    let Some(context) = Context::for_test() else {
        return;
    };
    let cache = memory_only_cache();
    let broken = "__kernel void broken(__global float *y) { y[0] = undeclared_thing; }";
    for attempt in 1..=2u64 {
        let error = find(&cache, &context, &[broken], "").unwrap_err();
        let Error::Build(build) = error else {
            panic!("expected a build error, got {error:?}")
        };
        assert_eq!(build.code, CL_BUILD_PROGRAM_FAILURE);
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

/// Builds `count` programs in `context`, each with one extra reference held by the test, so
/// that the driver's count shows when the cache lets go of its own.
fn build_and_pin(cache: &OpenClCache, context: &Context, tag: &str, count: usize) -> Vec<Program> {
    (0..count)
        .map(|i| {
            let lease = find(cache, context, &[&saxpy(&format!("{tag}-{i}"))], "").unwrap();
            let pin = lease.value().retain().unwrap();
            assert_eq!(reference_count(&pin).unwrap(), 2);
            pin
        })
        .collect()
}

fn count(program: &Program) -> u32 {
    reference_count(program).unwrap()
}

#[test]
fn evicting_a_context_releases_each_of_its_programs_once() {
    let cache = memory_only_cache();
    let Some(first) = Context::for_test() else {
        return;
    };
    let second = Context::new(first.device()).unwrap();
    let evicted = build_and_pin(&cache, &first, "evict-context-a", 2);
    let kept = build_and_pin(&cache, &second, "evict-context-b", 1);

    assert_eq!(cache.evict_context(first.context().raw()).unwrap(), 2);
    for program in &evicted {
        assert_eq!(count(program), 1, "released exactly once");
    }
    assert_eq!(count(&kept[0]), 2, "other contexts keep theirs");
    let s = stats(&cache);
    assert_eq!((s.memory.destroys, s.memory.device_evictions), (2, 2));
    assert_eq!(cache.len(), 1);
    // A second eviction has nothing left to release.
    assert_eq!(cache.evict_context(first.context().raw()).unwrap(), 0);
    assert_eq!(stats(&cache).memory.destroys, 2);

    // The context still works with the cache afterwards: a new program, built again.
    let again = find(&cache, &first, &[&saxpy("evict-context-a-0")], "").unwrap();
    assert_ne!(again.value().raw(), evicted[0].raw());
    check_saxpy(&first, again.value());
    assert_eq!(stats(&cache).source_builds, 4);
}

#[test]
fn evicting_a_device_releases_its_programs_in_every_context_once() {
    let cache = memory_only_cache();
    let Some(first) = Context::for_test() else {
        return;
    };
    let second = Context::new(first.device()).unwrap();
    let mut pinned = build_and_pin(&cache, &first, "evict-device-a", 2);
    pinned.extend(build_and_pin(&cache, &second, "evict-device-b", 1));

    // A lease held across the eviction keeps its program alive until it is released.
    let held = find(&cache, &first, &[&saxpy("evict-device-a-0")], "").unwrap();
    assert_eq!(cache.evict_device(first.device()).unwrap(), 3);
    assert_eq!(cache.len(), 0);
    assert_eq!(count(&pinned[0]), 2, "still leased");
    check_saxpy(&first, held.value());
    for program in &pinned[1..] {
        assert_eq!(count(program), 1);
    }
    drop(held);
    assert_eq!(count(&pinned[0]), 1, "released with the last lease");
    assert_eq!(stats(&cache).memory.destroys, 3);
}

#[test]
fn eight_threads_on_one_cold_key_run_one_build() {
    let cache = Arc::new(memory_only_cache());
    let Some(context) = Context::for_test() else {
        return;
    };
    let context = Arc::new(context);
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
                checked_lease(&cache, &context, &source).value().raw() as usize
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
fn a_lookup_in_flight_when_its_context_is_evicted_builds_nothing_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let source = format!(
        "// {:?}\n__kernel void fill(__global float *y) {{ y[get_global_id(0)] = 1.5f; }}\n",
        dir.path()
    );
    let Some(context) = Context::for_test() else {
        return;
    };
    // The entry's name, from a first cache that stores it; then the entry goes, so that the
    // next lookup misses the disk too.
    let first = cache_with_disk(dir.path());
    drop(find(&first, &context, &[&source], "").unwrap());
    drop(first);
    let entry = entry_files(dir.path())
        .pop()
        .expect("the program was stored");
    std::fs::remove_file(dir.path().join(&entry)).unwrap();
    // The test holds the entry's lock, as another process building it would: the lookup's
    // flight waits in it for exactly as long as the test needs. No heartbeat is written, so
    // the liveness window is long enough for the test to finish first.
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.path().join(format!(".{entry}.lock")))
        .unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    let disk = Persistence::open(PersistenceConfig {
        lock_liveness: Some(std::time::Duration::from_secs(600)),
        ..PersistenceConfig::in_dir(dir.path())
    })
    .unwrap();
    let cache = OpenClCache::new(OpenClOptions {
        persistence: Some(Arc::new(disk)),
        ..OpenClOptions::default()
    })
    .unwrap();
    std::thread::scope(|s| {
        let building = s.spawn(|| find(&cache, &context, &[&source], "").map(drop));
        // A waiter marks the lock file as wanted (its second byte) once it waits.
        let mut marks = [0u8; 2];
        while !(rustix::io::pread(&lock, &mut marks, 0).is_ok_and(|n| n == 2) && marks[1] == b'W') {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(cache.evict_context(context.context().raw()).unwrap(), 0);
        // Let go without an entry: the waiter would take the build over, but its context is
        // gone, so it builds nothing.
        drop(lock);
        let outcome = building.join().unwrap();
        assert!(
            matches!(outcome, Err(Error::DeviceDestroyed(_))),
            "{outcome:?}"
        );
    });
    let s = stats(&cache);
    assert_eq!(
        (
            s.memory.builds,
            s.memory.discarded,
            s.memory.destroys,
            s.source_builds
        ),
        (0, 0, 0, 0),
        "nothing built for the evicted context"
    );
    assert_eq!(cache.len(), 0);

    // The context is still usable: the next lookup builds again and the program works.
    let lease = find(&cache, &context, &[&source], "").unwrap();
    let mut y = vec![0.0f32; 16];
    let mut args = [KernelArg::Floats(&mut y)];
    run_kernel(&context, lease.value(), "fill", &mut args, 16).unwrap();
    assert!(y.iter().all(|v| *v == 1.5));
    assert_eq!(stats(&cache).source_builds, 1);
}

#[test]
fn a_tampered_binary_shows_in_the_disk_tier_counters() {
    let Some((dir, context, source)) = disk_setup("tampered-binary") else {
        return;
    };
    {
        let cold = cache_with_disk(dir.path());
        find(&cold, &context, &[&source], "").unwrap();
        cold.flush();
        let s = stats(&cold);
        assert_eq!((s.disk.puts, s.disk.integrity_rejects), (1, 0));
    }
    let disk = Persistence::open(PersistenceConfig::in_dir(dir.path())).unwrap();
    let key = program_disk_key(context.device(), &[&source], "").unwrap();
    let path = disk.entry_path(&key);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[80] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();

    let s = lookup_in_fresh_cache(dir.path(), &context, &source);
    // The backend's own view: no binary, built from source.
    assert_eq!((s.disk_misses, s.binary_loads, s.source_builds), (1, 0, 1));
    // The disk tier's: a rejected entry, then the rebuilt binary written back.
    assert_eq!(s.disk.integrity_rejects, 1);
    assert_eq!((s.disk.hits, s.disk.misses), (0, 1));
    // The rebuilt binary, and on PoCL possibly once more at flush with the launch's code (when
    // the launch ran before the binary written for waiting processes was taken).
    assert!(matches!(s.disk.puts, 1 | 2), "puts: {}", s.disk.puts);
    assert_eq!(stats(&memory_only_cache()).disk, DiskStats::default());
}

#[test]
fn reset_stats_zeroes_counters_keeps_gauges_and_hit_rate_follows() {
    let Some((dir, context, source)) = disk_setup("reset-stats") else {
        return;
    };
    let cache = cache_with_disk(dir.path());
    assert_eq!(stats(&cache).hit_rate(), None);
    let cold = checked_lease(&cache, &context, &source);
    drop(find(&cache, &context, &[&source], "").unwrap());
    cache.flush();
    let s = stats(&cache);
    assert_eq!((s.memory.hits, s.memory.misses, s.source_builds), (1, 1, 1));
    assert_eq!(s.hit_rate(), Some(0.5));
    assert_eq!(s.disk.puts, 1);

    cache.reset_stats();
    let s = stats(&cache);
    assert_eq!(s.hit_rate(), None);
    assert_eq!((s.memory.hits, s.memory.misses, s.memory.builds), (0, 0, 0));
    assert_eq!(
        (s.source_builds, s.disk_misses, s.disk.puts, s.disk.misses),
        (0, 0, 0, 0)
    );
    // Gauges stay: one program in memory, leased once; one entry on disk.
    assert_eq!((s.memory.entries, s.memory.leases), (1, 1));
    assert_eq!(s.disk.entries, 1);

    drop(find(&cache, &context, &[&source], "").unwrap());
    let s = stats(&cache);
    assert_eq!((s.memory.hits, s.memory.misses), (1, 0));
    assert_eq!(s.hit_rate(), Some(1.0));
    drop(cold);
}

/// The names of the entry files in the cache directory `dir` (its own files start with a dot).
fn entry_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.'))
        .collect()
}

/// `y = SCALE * x + y`, `SCALE` from the header `scale.h` included by `include`.
fn scaled(include: &str) -> String {
    format!(
        "{include}\n__kernel void saxpy(__global float *y, __global const float *x) {{\n\
         size_t i = get_global_id(0);\n y[i] = SCALE * x[i] + y[i];\n}}\n"
    )
}

/// Runs the scaled saxpy of `lease` on `x = 2i`, `y = i`: each `y[i]` over `i` is
/// `1 + 2 * SCALE`.
fn scale_of(context: &Context, lease: &ProgramLease) -> f32 {
    let n = 8;
    let mut y: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
    let mut args = [KernelArg::Floats(&mut y), KernelArg::Input(&x)];
    run_kernel(context, lease.value(), "saxpy", &mut args, n).unwrap();
    (y[1] - 1.0) / 2.0
}

#[test]
fn a_changed_header_is_built_again_and_an_include_kcache_cannot_key_is_cached_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let headers = tempfile::tempdir().unwrap();
    let header = headers.path().join("scale.h");
    std::fs::write(&header, "#define SCALE 0.5f\n").unwrap();
    let options = format!("-I {}", headers.path().display());
    let Some(context) = Context::for_test() else {
        return;
    };
    let cache = cache_with_disk(dir.path());
    let source = scaled("#include \"scale.h\"");
    let lookup = |source: &str| find(&cache, &context, &[source], &options).unwrap();
    assert_eq!(scale_of(&context, &lookup(&source)), 0.5);
    assert_eq!(scale_of(&context, &lookup(&source)), 0.5);
    assert_eq!(stats(&cache).source_builds, 1);
    std::fs::write(&header, "#define SCALE 1.5f\n").unwrap();
    assert_eq!(scale_of(&context, &lookup(&source)), 1.5, "a stale program");
    assert_eq!(stats(&cache).source_builds, 2);
    // A computed include: compiled on every lookup, the header's value each time, kept nowhere.
    let computed = scaled("#define HEADER \"scale.h\"\n#include HEADER");
    assert_eq!(scale_of(&context, &lookup(&computed)), 1.5);
    std::fs::write(&header, "#define SCALE 2.5f\n").unwrap();
    assert_eq!(scale_of(&context, &lookup(&computed)), 2.5);
    let counts = stats(&cache);
    assert_eq!((counts.source_builds, counts.passed_through), (4, 2));
    cache.flush();
    let entries = Persistence::open(PersistenceConfig::in_dir(dir.path()))
        .unwrap()
        .entries()
        .unwrap();
    assert_eq!(
        entries.len(),
        2,
        "one entry per header text, none passed through"
    );
}
