//! The CUDA module cache against the test driver library.
//!
//! No GPU is available in CI: `kcache_testkit::cuda::FakeDriver` is a private copy of the
//! test-kit's build of `c-tests/cuda/fake_cuda.c`, a library that stands in for the real driver (`libcuda.so.1`), counts every call and checks
//! the context binding. What these tests assert is what kcache asks of the driver: how many
//! links, loads and unloads, and in which context.

use std::sync::{Arc, Barrier};

use tempfile::TempDir;

use kcache::Error;
use kcache::backend::cuda::{CUcontext, Context, CudaCache, CudaOptions, JitOption};
use kcache::disk::{Descriptor, DiskStats};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::cuda::SAXPY_PTX;
use kcache_testkit::cuda::{FakeDriver, Handle};
use kcache_testkit::{assert_err, rerun_test, successful_stdout};

mod cuda_common;
use cuda_common::child_line;

fn ctx(raw: CUcontext) -> Option<Context> {
    // SAFETY: the fake driver created `raw`; every test evicts or drops its cache before it
    // destroys a context.
    unsafe { Context::from_raw(raw) }
}

fn disk(dir: &TempDir) -> Arc<Persistence> {
    Arc::new(Persistence::open(PersistenceConfig::in_dir(dir.path().join("l2"))).unwrap())
}

fn cache(fake: &FakeDriver, disk: Option<Arc<Persistence>>) -> CudaCache {
    CudaCache::new(CudaOptions {
        persistence: disk,
        driver: Some(fake.driver()),
        ..CudaOptions::default()
    })
    .unwrap()
}

/// The fake driver, a temporary directory, and a cache on a disk tier in that directory.
fn fake_with_disk() -> (FakeDriver, TempDir, CudaCache) {
    let fake = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(&fake, Some(disk(&dir)));
    (fake, dir, cache)
}

/// A cache on `dir`'s disk tier that has built SAXPY in `context`.
fn built_on_disk(fake: &FakeDriver, dir: &TempDir, context: CUcontext) -> CudaCache {
    let cold = cache(fake, Some(disk(dir)));
    cold.find_or_build_ptx(ctx(context), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    cold.flush();
    cold
}

/// A directory that holds the SAXPY cubin of device 0, written by a cache since dropped.
fn saxpy_on_disk() -> (FakeDriver, TempDir, CUcontext) {
    let fake = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let c0 = fake.create_context(0);
    drop(built_on_disk(&fake, &dir, c0));
    (fake, dir, c0)
}

const OTHER_PTX: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\
    .visible .entry other() { ret; }\n";

#[test]
fn cold_path_links_and_loads_once_then_hits() {
    let (fake, _dir, cache) = fake_with_disk();
    let c0 = fake.create_context(0);
    let pops_before = fake.counter("ctx_pop"); // the one that unbound the new context

    let lease = cache
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(fake.counter("link_create"), 1);
    assert_eq!(fake.counter("link_complete"), 1);
    assert_eq!(fake.counter("link_destroy"), 1);
    assert_eq!(fake.counter("module_load"), 1);
    assert_eq!(
        fake.counter("module_load_ptx"),
        0,
        "PTX must never reach the loader"
    );
    assert_eq!(lease.context(), c0);
    assert!(!lease.function("saxpy").unwrap().is_null());
    assert!(matches!(lease.function("missing"), Err(Error::NotFound)));

    let again = cache
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(again.raw(), lease.raw());
    assert_eq!(fake.counter("link_create"), 1);
    assert_eq!(fake.counter("module_load"), 1);

    let stats = cache.stats();
    assert_eq!(stats.links, 1);
    assert_eq!(stats.disk_misses, 1);
    assert_eq!(stats.disk_hits, 0);
    assert_eq!(stats.memory.hits, 1);
    assert_eq!(stats.memory.misses, 1);
    // kcache's pushes were all popped: nothing is left current on this thread.
    assert!(fake.counter("ctx_push") > 0);
    assert_eq!(
        fake.counter("ctx_push"),
        fake.counter("ctx_pop") - pops_before
    );
    assert!(fake.current().is_null());
}

#[test]
fn the_stored_cubin_says_which_kernels_and_device_it_is_for() {
    let (_fake, dir, _c0) = saxpy_on_disk();
    let disk = disk(&dir);
    let entries = disk.entries().unwrap();
    assert_eq!(entries.len(), 1);
    let entry = disk.get(&entries[0].key).unwrap().unwrap();
    assert_eq!(
        entry.descriptor(),
        Some(&Descriptor::new("cuda", "kcache fake GPU 0", "saxpy"))
    );
}

#[test]
fn warm_cache_in_the_same_process_loads_the_cubin_without_linking() {
    let (fake, dir, c0) = saxpy_on_disk();
    assert_eq!(
        fake.counter("module_unload"),
        1,
        "dropping the cache unloads"
    );
    let warm = cache(&fake, Some(disk(&dir)));
    let lease = warm
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert!(!lease.function("saxpy").unwrap().is_null());
    assert_eq!(
        fake.counter("link_create"),
        1,
        "the warm cache must not link"
    );
    assert_eq!(fake.counter("module_load"), 2);
    let stats = warm.stats();
    assert_eq!((stats.links, stats.disk_hits, stats.cubin_loads), (0, 1, 1));
    assert_eq!(
        (stats.memory.builds, stats.memory.loads),
        (0, 1),
        "a load is not a build"
    );
}

/// Environment variable that turns `warm_start_child` into one run of a cache in a fresh
/// process.
const CHILD_ENV: &str = "KCACHE_CUDA_TEST_CHILD_DIR";

/// Not a test on its own: `warm_start_in_a_fresh_process_loads_the_cubin_and_never_links`
/// runs this test binary again with [`CHILD_ENV`] set, so the driver, the memory tier and the
/// fake driver's counters all start from nothing; only the disk directory carries over. The
/// driver comes from `KCACHE_CUDA_LIBRARY`, as in a deployed program.
#[test]
fn warm_start_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let fake_path = std::env::var_os("KCACHE_CUDA_LIBRARY").unwrap();
    // SAFETY: the fake driver library named by the parent.
    let fake = unsafe { libloading::Library::new(&fake_path) }.unwrap();
    let disk = Arc::new(Persistence::open(PersistenceConfig::in_dir(dir)).unwrap());
    let cache = CudaCache::new(CudaOptions {
        persistence: Some(disk),
        ..CudaOptions::default()
    })
    .unwrap();
    type Create = unsafe extern "C" fn(*mut CUcontext, u32, i32) -> i32;
    type Counter = unsafe extern "C" fn(*const std::ffi::c_char) -> u64;
    let mut c0: CUcontext = std::ptr::null_mut();
    // SAFETY: symbols of the fake driver with their C types; the new context is left current.
    let counter = unsafe {
        assert_eq!(
            fake.get::<Create>(b"cuCtxCreate_v2").unwrap()(&mut c0, 0, 0),
            0
        );
        *fake.get::<Counter>(b"fakecuda_counter").unwrap()
    };
    // The current context, as a caller that set one up would use it.
    let lease = cache
        .find_or_build_ptx(None, SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(lease.context(), c0);
    assert!(!lease.function("saxpy").unwrap().is_null());
    let stats = cache.stats();
    // SAFETY: NUL-terminated counter names.
    let (links, loads) = unsafe {
        (
            counter(c"link_create".as_ptr()),
            counter(c"module_load".as_ptr()),
        )
    };
    println!(
        "CHILD links={links} loads={loads} disk_hits={} cubin_loads={}",
        stats.disk_hits, stats.cubin_loads
    );
}

fn run_child(fake: &FakeDriver, dir: &std::path::Path) -> String {
    // Test names are module paths without the crate's name: at the top of an integration
    // test, just the function's name.
    let mut child = rerun_test("warm_start_child");
    child
        .env(CHILD_ENV, dir)
        .env("KCACHE_CUDA_LIBRARY", fake.path());
    child_line(&successful_stdout("child", &mut child))
}

#[test]
fn warm_start_in_a_fresh_process_loads_the_cubin_and_never_links() {
    let fake = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let l2 = dir.path().join("l2");
    assert_eq!(
        run_child(&fake, &l2),
        "links=1 loads=1 disk_hits=0 cubin_loads=0"
    );
    assert_eq!(
        run_child(&fake, &l2),
        "links=0 loads=1 disk_hits=1 cubin_loads=1"
    );
}

#[test]
fn a_rejected_cubin_is_dropped_and_relinked() {
    let fake = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let c0 = fake.create_context(0);
    cache(&fake, Some(disk(&dir)))
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(fake.counter("link_create"), 1);

    fake.reject_next_loads(1);
    let second = cache(&fake, Some(disk(&dir)));
    let lease = second
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert!(!lease.function("saxpy").unwrap().is_null());
    assert_eq!(fake.counter("module_load_rejected"), 1);
    assert_eq!(fake.counter("link_create"), 2, "relinked from the PTX");
    let stats = second.stats();
    assert_eq!(
        (
            stats.disk_hits,
            stats.cubins_rejected,
            stats.links,
            stats.cubin_loads
        ),
        (1, 1, 1, 0)
    );
    drop(lease);
    drop(second);

    // The relinked cubin replaced the refused one.
    let third = cache(&fake, Some(disk(&dir)));
    third
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(fake.counter("link_create"), 2);
    assert_eq!(third.stats().cubin_loads, 1);
}

#[test]
fn eviction_unloads_each_module_once_with_its_own_context_current() {
    let fake = FakeDriver::new();
    let cache = cache(&fake, None);
    let c0 = fake.create_context(0);
    let c1 = fake.create_context(1);
    let ptxs = [SAXPY_PTX, OTHER_PTX];
    let mut leases = Vec::new();
    for c in [c0, c1] {
        for ptx in ptxs {
            leases.push(
                cache
                    .find_or_build_ptx(ctx(c), ptx.as_bytes(), &[])
                    .unwrap(),
            );
        }
    }
    assert_eq!(fake.counter("module_load"), 4);
    let held = leases.remove(0); // a module of c0, still in use
    drop(leases);

    // Another context is current on the evicting thread: kcache must switch to the owner.
    // SAFETY: made by `create_context` above, not destroyed yet.
    unsafe { fake.set_current(c1) };
    assert_eq!(cache.evict_context(c0).unwrap(), 2);
    assert_eq!(
        fake.counter("module_unload"),
        1,
        "the leased module waits for its lease"
    );
    assert_eq!(fake.current(), c1, "the caller's binding is restored");
    drop(held);
    assert_eq!(fake.counter("module_unload"), 2);

    assert_eq!(cache.evict_device(1).unwrap(), 2);
    assert_eq!(fake.counter("module_unload"), 4);
    assert_eq!(cache.evict_device(1).unwrap(), 0);
    assert_eq!(fake.counter("unload_wrong_context"), 0);
    assert_eq!(fake.counter("unload_invalid"), 0);
    assert_eq!(fake.counter("live_modules"), 0);
    assert_eq!(fake.current(), c1);
    // SAFETY: NULL unbinds.
    unsafe { fake.set_current(std::ptr::null_mut()) };

    // An evicted context starts over: its modules are loaded again, not served stale.
    cache
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(fake.counter("module_load"), 5);
    drop(cache);
    assert_eq!(fake.counter("module_unload"), 5);
    assert_eq!(fake.counter("unload_wrong_context"), 0);
    // SAFETY: made by `create_context` above and destroyed once, after the cache is gone.
    unsafe {
        fake.destroy_context(c0);
        fake.destroy_context(c1);
    }
}

#[test]
fn eight_threads_on_one_cold_key_link_once() {
    let fake = Arc::new(FakeDriver::new());
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(cache(&fake, Some(disk(&dir))));
    let c0 = Handle(fake.create_context(0));
    // The link is parked until all eight callers are inside the cache: the one building and
    // seven waiting on its flight.
    fake.hold_links(true);
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (cache, barrier) = (Arc::clone(&cache), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let context = c0; // the whole `Handle`, which is `Send`
                barrier.wait();
                let lease = cache
                    .find_or_build_ptx(ctx(context.0), SAXPY_PTX.as_bytes(), &[])
                    .unwrap();
                Handle(lease.raw())
            })
        })
        .collect();
    while fake.counter("link_waiting") < 1 || cache.stats().memory.waits < 7 {
        std::thread::yield_now();
    }
    fake.hold_links(false);
    let modules: Vec<Handle> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(modules.iter().all(|m| *m == modules[0]));
    assert_eq!(fake.counter("link_create"), 1);
    assert_eq!(fake.counter("link_complete"), 1);
    assert_eq!(fake.counter("module_load"), 1);
    let stats = cache.stats();
    assert_eq!(
        (stats.links, stats.memory.builds, stats.memory.waits),
        (1, 1, 7)
    );
}

#[test]
fn jit_options_reach_the_linker_and_separate_entries() {
    let (fake, _dir, cache) = fake_with_disk();
    let c0 = fake.create_context(0);
    let ptx = SAXPY_PTX.as_bytes();
    let a = cache.find_or_build_ptx(ctx(c0), ptx, &[]).unwrap();
    let b = cache
        .find_or_build_ptx(ctx(c0), ptx, &[JitOption::MaxRegisters(32)])
        .unwrap();
    assert_eq!(fake.counter("last_max_registers"), 32);
    assert_ne!(a.raw(), b.raw());
    let options = [JitOption::OptimizationLevel(3), JitOption::MaxRegisters(32)];
    let c = cache.find_or_build_ptx(ctx(c0), ptx, &options).unwrap();
    assert_ne!(b.raw(), c.raw());
    assert_eq!(fake.counter("link_create"), 3);
    let twice = [JitOption::MaxRegisters(32), JitOption::MaxRegisters(64)];
    assert_err!(
        cache.find_or_build_ptx(ctx(c0), ptx, &twice),
        Error::InvalidArgument(_)
    );
    assert!(
        JitOption::from_raw(5, 0).is_err(),
        "log buffers belong to kcache"
    );
    assert_eq!(
        JitOption::from_raw(0, 32).unwrap(),
        JitOption::MaxRegisters(32)
    );
}

#[test]
fn a_device_of_another_capability_gets_its_own_cubin() {
    let (fake, _dir, cache) = fake_with_disk();
    let c0 = fake.create_context(0); // compute capability 8.0
    let c1 = fake.create_context(1); // 9.0
    cache
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    cache
        .find_or_build_ptx(ctx(c1), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    // The fake refuses a cubin linked for another capability; none was offered.
    assert_eq!(fake.counter("module_load_failed"), 0);
    assert_eq!(fake.counter("link_create"), 2);
    assert_eq!(cache.stats().disk_misses, 2);
    // A second context on device 0 shares the disk cubin but not the module.
    let c2 = fake.create_context(0);
    cache
        .find_or_build_ptx(ctx(c2), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(fake.counter("link_create"), 2);
    assert_eq!(fake.counter("module_load"), 3);
}

#[test]
fn bad_ptx_is_a_build_error_with_the_jit_log() {
    let fake = FakeDriver::new();
    let cache = cache(&fake, None);
    let c0 = fake.create_context(0);
    for _ in 0..2 {
        match cache.find_or_build_ptx(ctx(c0), b"this is not PTX", &[]) {
            Err(Error::Build(e)) => {
                assert_eq!(e.code, 218, "CUDA_ERROR_INVALID_PTX");
                assert!(e.message.contains("ptxas fatal"), "{}", e.message);
            }
            other => panic!("expected a build error, got {other:?}"),
        }
    }
    // Failures are not cached: the second call tried again.
    assert_eq!(fake.counter("link_failed"), 2);
    assert_eq!(
        fake.counter("link_destroy"),
        2,
        "the link state is always destroyed"
    );
    assert_eq!(cache.stats().link_failures, 2);
    assert!(cache.is_empty());
    assert_err!(
        cache.find_or_build_ptx(ctx(c0), b"", &[]),
        Error::InvalidArgument(_)
    );
}

#[test]
fn the_current_context_is_used_when_none_is_given() {
    let fake = FakeDriver::new();
    let cache = cache(&fake, None);
    assert_err!(
        cache.find_or_build_ptx(None, SAXPY_PTX.as_bytes(), &[]),
        Error::InvalidArgument(_)
    );
    let c0 = fake.create_context(0);
    // SAFETY: made by `create_context` just above.
    unsafe { fake.set_current(c0) };
    let lease = cache
        .find_or_build_ptx(None, SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(lease.context(), c0);
    assert_eq!(
        fake.counter("ctx_push"),
        0,
        "already current: no push needed"
    );
    let same = cache
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    assert_eq!(same.raw(), lease.raw());
    assert_eq!(fake.current(), c0);
    // SAFETY: NULL unbinds.
    unsafe { fake.set_current(std::ptr::null_mut()) };
}

#[test]
fn a_module_linked_while_its_context_is_evicted_is_discarded_and_unloaded() {
    let fake = Arc::new(FakeDriver::new());
    let cache = Arc::new(cache(&fake, None));
    let c0 = Handle(fake.create_context(0));
    fake.hold_links(true);
    let builder = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || {
            let context = c0;
            cache
                .find_or_build_ptx(ctx(context.0), SAXPY_PTX.as_bytes(), &[])
                .map(|lease| Handle(lease.raw()))
        })
    };
    while fake.counter("link_waiting") < 1 {
        std::thread::yield_now();
    }
    assert_eq!(
        cache.evict_context(c0.0).unwrap(),
        0,
        "nothing installed yet"
    );
    fake.hold_links(false);
    assert_err!(builder.join().unwrap(), Error::DeviceDestroyed(_));
    assert_eq!(fake.counter("module_load"), 1);
    assert_eq!(
        fake.counter("module_unload"),
        1,
        "the discarded module was unloaded"
    );
    assert_eq!(fake.counter("unload_wrong_context"), 0);
    assert!(cache.is_empty());
}

#[test]
fn a_tampered_cubin_shows_in_the_disk_tier_counters() {
    let fake = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let c0 = fake.create_context(0);
    {
        let cold = built_on_disk(&fake, &dir, c0);
        let s = cold.stats();
        assert_eq!((s.disk.puts, s.disk.integrity_rejects), (1, 0));
    }
    let entries: Vec<_> = std::fs::read_dir(dir.path().join("l2"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kce"))
        .collect();
    assert_eq!(entries.len(), 1);
    let mut bytes = std::fs::read(&entries[0]).unwrap();
    bytes[80] ^= 0x01;
    std::fs::write(&entries[0], &bytes).unwrap();

    let warm = cache(&fake, Some(disk(&dir)));
    warm.find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    warm.flush();
    let s = warm.stats();
    assert_eq!((s.links, s.disk_misses, s.cubin_loads), (1, 1, 0));
    assert_eq!(s.disk.integrity_rejects, 1);
    assert_eq!((s.disk.hits, s.disk.misses, s.disk.puts), (0, 1, 1));
    assert_eq!(cache(&fake, None).stats().disk, DiskStats::default());
}

#[test]
fn reset_stats_zeroes_counters_keeps_gauges_and_hit_rate_follows() {
    let (fake, _dir, cache) = fake_with_disk();
    let c0 = fake.create_context(0);
    assert_eq!(cache.stats().hit_rate(), None);
    let lease = cache
        .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
        .unwrap();
    drop(
        cache
            .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
            .unwrap(),
    );
    cache.flush();
    let s = cache.stats();
    assert_eq!((s.memory.hits, s.memory.misses, s.links), (1, 1, 1));
    assert_eq!(s.hit_rate(), Some(0.5));

    cache.reset_stats();
    let s = cache.stats();
    assert_eq!(s.hit_rate(), None);
    assert_eq!((s.memory.hits, s.memory.misses, s.memory.builds), (0, 0, 0));
    assert_eq!((s.links, s.disk_misses, s.disk.puts), (0, 0, 0));
    assert_eq!(
        (s.memory.entries, s.memory.leases, s.disk.entries),
        (1, 1, 1)
    );

    drop(
        cache
            .find_or_build_ptx(ctx(c0), SAXPY_PTX.as_bytes(), &[])
            .unwrap(),
    );
    assert_eq!(cache.stats().hit_rate(), Some(1.0));
    drop(lease);
    cache.evict_context(c0).unwrap();
}
