//! The lookups that hand out a `cl_program` reference of the caller's own (no lease), for one
//! device or a device list, against a real OpenCL implementation (PoCL in CI). PoCL offers one
//! device, so the lists here hold that device, given or taken from the context.

use kcache::Error;
use kcache::backend::opencl::{
    CL_BUILD_PROGRAM_FAILURE, OpenClCache, Program, context_devices, program_disk_key,
};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::{Context, KernelArg, reference_count, release_program, run_kernel};

mod opencl_common;
use opencl_common::{cache_with_disk, memory_only_cache};

/// `x = x + 1`, tagged so that each test compiles a program no other test shares.
fn add_one(tag: &str) -> String {
    format!(
        "// {tag}\n__kernel void add_one(__global float *x) {{ x[get_global_id(0)] += 1.0f; }}\n"
    )
}

fn check_add_one(context: &Context, program: &Program) {
    let mut x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    run_kernel(
        context,
        program,
        "add_one",
        &mut [KernelArg::Floats(&mut x)],
        32,
    )
    .unwrap();
    for (i, v) in x.iter().enumerate() {
        assert_eq!(*v, i as f32 + 1.0, "element {i}");
    }
}

/// `program`'s reference count once the driver has let go of its finished launches: PoCL drops
/// a launch's hold on the kernel (and so on its program) on its own thread, shortly after
/// `clFinish` returns. Waits up to 10 s for `want`, then returns the count as it is.
fn settled_count(program: &Program, want: u32) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let count = reference_count(program).unwrap();
        if count == want || std::time::Instant::now() > deadline {
            return count;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The single program a list of one device gave.
fn only(outcomes: Vec<kcache::Result<Program>>) -> Program {
    assert_eq!(outcomes.len(), 1);
    outcomes.into_iter().next().unwrap().unwrap()
}

#[test]
fn the_callers_reference_is_its_own_and_eviction_drops_only_the_caches() {
    let Some(context) = Context::for_test() else {
        return;
    };
    // Memory only: no background writer holds references of its own.
    let cache = memory_only_cache();
    let source = add_one("own-reference");
    let find = |cache: &OpenClCache| {
        cache.find_or_build_program(context.context(), context.device(), &[&source], "")
    };

    let mine = find(&cache).unwrap();
    check_add_one(&context, &mine);
    // The cache's reference and the caller's.
    assert_eq!(settled_count(&mine, 2), 2);
    let watcher = mine.retain().unwrap();
    assert_eq!(reference_count(&watcher).unwrap(), 3);

    // The caller's release (clReleaseProgram, as ported code keeps doing) leaves the cached
    // program alive: the next lookup is a memory hit on the same program, and it runs.
    // SAFETY: the caller owns the reference `into_raw` hands over, and releases it once.
    unsafe { release_program(mine.into_raw()) }.unwrap();
    assert_eq!(reference_count(&watcher).unwrap(), 2);
    let again = find(&cache).unwrap();
    assert_eq!(again.raw(), watcher.raw());
    check_add_one(&context, &again);
    let s = cache.stats();
    assert_eq!((s.source_builds, s.memory.hits, s.memory.leases), (1, 1, 0));
    drop(again);

    // Eviction gives up the cache's reference only; the program goes with the last one.
    assert_eq!(cache.evict_context(context.context().raw()).unwrap(), 1);
    assert_eq!(settled_count(&watcher, 1), 1);
    assert_eq!(cache.stats().memory.destroys, 1);
    drop(watcher);
}

#[test]
fn a_device_list_and_all_devices_of_the_context_build_per_device_with_binaries_on_disk() {
    let Some(context) = Context::for_test() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let source = add_one("device-list");
    let devices = context_devices(context.context()).unwrap();
    assert_eq!(devices, vec![context.device()]);

    let cache = cache_with_disk(dir.path());
    let listed = only(
        cache
            .find_or_build_programs(context.context(), Some(&devices), &[&source], "")
            .unwrap(),
    );
    check_add_one(&context, &listed);
    // No list: every device of the context, the same program for the same device.
    let all = only(
        cache
            .find_or_build_programs(context.context(), None, &[&source], "")
            .unwrap(),
    );
    assert_eq!(all.raw(), listed.raw());
    let s = cache.stats();
    assert_eq!((s.source_builds, s.memory.hits), (1, 1));
    cache.flush();
    drop((listed, all));
    drop(cache);

    // The device's binary is on disk under that device's identity, and a fresh cache (a new
    // process) loads it for the device list.
    let disk = Persistence::open(PersistenceConfig::in_dir(dir.path())).unwrap();
    let key = program_disk_key(context.device(), &[&source], "").unwrap();
    assert!(disk.get(&key).unwrap().is_some());
    let fresh = cache_with_disk(dir.path());
    let loaded = only(
        fresh
            .find_or_build_programs(context.context(), None, &[&source], "")
            .unwrap(),
    );
    check_add_one(&context, &loaded);
    let s = fresh.stats();
    assert_eq!((s.source_builds, s.binary_loads), (0, 1));
}

#[test]
fn an_empty_device_list_is_refused_and_a_build_failure_carries_each_devices_log() {
    let Some(context) = Context::for_test() else {
        return;
    };
    let cache = memory_only_cache();
    let error = cache
        .find_or_build_programs(context.context(), Some(&[]), &[&add_one("empty")], "")
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");

    let broken = "__kernel void broken(__global float *x) { x[0] = per_device_log_marker; }";
    let outcomes = cache
        .find_or_build_programs(context.context(), None, &[broken], "")
        .unwrap();
    assert_eq!(outcomes.len(), 1);
    match &outcomes[0] {
        Err(Error::Build(build)) => {
            assert_eq!(build.code, CL_BUILD_PROGRAM_FAILURE);
            assert!(
                build.message.contains("per_device_log_marker"),
                "{}",
                build.message
            );
        }
        other => panic!("expected a build failure, got {other:?}"),
    }
    assert_eq!(cache.len(), 0);
}
