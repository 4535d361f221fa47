//! CUDA C++ through NVIDIA's own NVRTC, CUDA 13's and CUDA 12's (PyPI's `nvidia-cuda-nvrtc`
//! and `nvidia-cuda-nvrtc-cu12`, which `scripts/test` installs and names in
//! `KCACHE_TEST_NVRTC13` / `KCACHE_TEST_NVRTC12`): real kernels compiled to PTX and to cubins
//! for sm_80 and sm_90 through `find_or_build_source` (with headers through `-I` and in
//! memory), the output checked as NVIDIA's, the keys as the real compiler decides them; and
//! CUDA 12.9's `ptxas` (`KCACHE_TEST_PTXAS`) on the PTX the driver is handed.
//!
//! NVRTC needs no GPU; the driver does. The stand-in driver (`c-tests/cuda/fake_cuda.c`) keeps
//! standing in for everything that needs a device: it links the real PTX into its own fake
//! cubin, and it loads NVRTC's real cubins (an ELF of `EM_CUDA`) only on a device of their
//! architecture (device 0 is 8.0, device 1 is 9.0), taking the kernels from their sections.
//! That a real driver loads them and the kernels compute is what `scripts/gpu-check` checks.

use std::path::Path;
use std::sync::Arc;

use kcache::backend::cuda::{CUcontext, Context, CudaCache, CudaOptions, JitOption, Nvrtc};
use kcache::{Error, Persistence, PersistenceConfig};
use kcache_testkit::assert_err;
use kcache_testkit::cuda::{FakeDriver, SAXPY_PTX};
use kcache_testkit::nvrtc::{
    BROKEN, NVRTC12, NVRTC13, TEMPLATE, TEMPLATE_FLOAT, WITH_BOTH, WITH_HEADER, check_kernels,
    cubin_arch, header, real_nvrtc, real_ptxas,
};

/// Both NVRTC releases, CUDA 13's first; `None` once the test is said to be skipped.
fn both() -> Option<[Arc<Nvrtc>; 2]> {
    Some([real_nvrtc(NVRTC13)?, real_nvrtc(NVRTC12)?])
}

/// The stand-in driver posing as CUDA 13.2's, so that it takes either NVRTC's PTX.
fn driver() -> FakeDriver {
    let driver = FakeDriver::new();
    driver.set_version(13020);
    driver
}

fn ctx(raw: CUcontext) -> Option<Context> {
    // SAFETY: the stand-in driver made `raw`; the tests never destroy it while cached.
    unsafe { Context::from_raw(raw) }
}

fn disk(dir: &Path) -> Arc<Persistence> {
    Arc::new(Persistence::open(PersistenceConfig::in_dir(dir)).unwrap())
}

fn cache(driver: &FakeDriver, nvrtc: &Arc<Nvrtc>, disk: Option<Arc<Persistence>>) -> CudaCache {
    CudaCache::new(CudaOptions {
        persistence: disk,
        driver: Some(driver.driver()),
        nvrtc: Some(Arc::clone(nvrtc)),
        ..CudaOptions::default()
    })
    .unwrap()
}

/// The payloads of the disk tier's entries, in no particular order.
fn stored(disk: &Persistence) -> Vec<Vec<u8>> {
    disk.entries()
        .unwrap()
        .iter()
        .map(|e| disk.get(&e.key).unwrap().unwrap().payload().to_vec())
        .collect()
}

fn include(dir: &Path) -> String {
    format!("-I{}", dir.display())
}

#[test]
fn headers_through_the_include_path_make_cubins_for_sm_80_and_sm_90() {
    let Some(nvrtcs) = both() else { return };
    for nvrtc in &nvrtcs {
        let (inc, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(inc.path().join("scale.h"), header("twice")).unwrap();
        let fake = driver();
        let (c0, c1) = (fake.create_context(0), fake.create_context(1));
        let disk = disk(dir.path());
        let cache = cache(&fake, nvrtc, Some(Arc::clone(&disk)));
        let flag = include(inc.path());
        for (context, arch) in [(c0, "-arch=sm_80"), (c1, "--gpu-architecture=sm_90")] {
            let lease = cache
                .find_or_build_source(ctx(context), WITH_HEADER, &[&flag, arch], &[])
                .unwrap();
            assert!(!lease.function("twice").unwrap().is_null());
        }
        cache.flush();
        assert_eq!(fake.counter("module_load_elf"), 2);
        assert_eq!(cache.stats().links, 0);
        let mut archs: Vec<_> = stored(&disk).iter().map(|c| cubin_arch(c)).collect();
        archs.sort();
        assert_eq!(archs, [Some(80), Some(90)], "{:?}", nvrtc.version());
        // A cubin for sm_90 is no binary for the 8.0 device: refused as the driver does.
        let refused =
            cache.find_or_build_source(ctx(c0), WITH_HEADER, &[&flag, "-arch=sm_90"], &[]);
        assert!(matches!(refused, Err(Error::Build(ref e)) if e.code == 209));
        assert_eq!(fake.counter("last_elf_arch"), 90);
    }
}

/// In-memory headers reach NVRTC and their texts are keyed: a changed text is another cubin, the
/// same text again a hit.
#[test]
fn in_memory_headers_reach_nvrtc_and_are_keyed() {
    let Some(nvrtcs) = both() else { return };
    for nvrtc in &nvrtcs {
        let (inc, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(inc.path().join("scale.h"), header("both")).unwrap();
        let fake = driver();
        let c0 = fake.create_context(0);
        let disk = disk(dir.path());
        let cache = cache(&fake, nvrtc, Some(Arc::clone(&disk)));
        let flag = include(inc.path());
        let options: &[&str] = &[&flag, "-arch=sm_80"];
        for (text, compiles) in [("1.5f", 1), ("3.5f", 2), ("1.5f", 2)] {
            let factor = format!("#define FACTOR {text}\n");
            let lease = cache
                .find_or_build_source_with_headers(
                    ctx(c0),
                    WITH_BOTH,
                    &[("factor.h", &factor)],
                    options,
                    &[],
                )
                .unwrap();
            assert!(!lease.function("both").unwrap().is_null());
            assert_eq!(cache.stats().nvrtc_compiles, compiles);
        }
        // Without it the source does not compile.
        assert_err!(
            cache.find_or_build_source(ctx(c0), WITH_BOTH, options, &[]),
            Error::Build(_)
        );
        cache.flush();
        let cubins = stored(&disk);
        assert_eq!(cubins.len(), 2);
        assert_ne!(cubins[0], cubins[1]);
    }
}

#[test]
fn ptx_names_its_entry_its_target_and_the_nvrtc_release() {
    let Some(nvrtcs) = both() else { return };
    for nvrtc in &nvrtcs {
        let inc = tempfile::tempdir().unwrap();
        std::fs::write(inc.path().join("scale.h"), header("twice")).unwrap();
        let flag = include(inc.path());
        let ptx = nvrtc
            .compile(WITH_HEADER, &[&flag, "-arch=compute_80"])
            .unwrap();
        let ptx = String::from_utf8(ptx).unwrap();
        let (major, minor) = nvrtc.version();
        assert!(ptx.contains(".entry twice("), "{ptx}");
        assert!(ptx.contains("\n.target sm_80\n"), "{ptx}");
        assert!(
            ptx.contains(&format!("Cuda compilation tools, release {major}.{minor}")),
            "{ptx}"
        );
        // Through the cache the PTX is linked by the (stand-in) driver for the 9.0 device.
        let fake = driver();
        let c1 = fake.create_context(1);
        let cache = cache(&fake, nvrtc, None);
        let lease = cache
            .find_or_build_source(ctx(c1), WITH_HEADER, &[&flag, "-arch=compute_90"], &[])
            .unwrap();
        assert!(!lease.function("twice").unwrap().is_null());
        assert_eq!(cache.stats().links, 1);
        assert_eq!(fake.counter("module_load_elf"), 0);
    }
}

#[test]
fn a_template_kernel_is_found_by_its_mangled_name() {
    let Some(nvrtcs) = both() else { return };
    for nvrtc in &nvrtcs {
        let fake = driver();
        let c1 = fake.create_context(1);
        let cache = cache(&fake, nvrtc, None);
        let lease = cache
            .find_or_build_source(ctx(c1), TEMPLATE, &["-arch=sm_90", "-std=c++17"], &[])
            .unwrap();
        assert!(!lease.function(TEMPLATE_FLOAT).unwrap().is_null());
        assert_err!(lease.function("scale"), Error::NotFound);
    }
}

#[test]
fn a_failing_compile_gives_nvrtcs_log_and_stores_nothing() {
    let Some(nvrtcs) = both() else { return };
    for nvrtc in &nvrtcs {
        let dir = tempfile::tempdir().unwrap();
        let fake = driver();
        let c0 = fake.create_context(0);
        let disk = disk(dir.path());
        let cache = cache(&fake, nvrtc, Some(Arc::clone(&disk)));
        for round in 1..=2 {
            let failed = cache.find_or_build_source(ctx(c0), BROKEN, &["-arch=sm_80"], &[]);
            let Err(Error::Build(error)) = failed else {
                panic!("not a build error")
            };
            // NVRTC_ERROR_COMPILATION, with the compiler's own words.
            assert_eq!(error.code, 6);
            assert!(error.message.contains("missing_name"), "{}", error.message);
            assert!(error.message.contains("error"), "{}", error.message);
            // Failures are not cached: each lookup compiles again.
            assert_eq!(cache.stats().nvrtc_failures, round);
        }
        cache.flush();
        assert_eq!(disk.entries().unwrap().len(), 0);
        assert_eq!(fake.counter("module_load"), 0);
    }
}

/// Each input that changes NVRTC's binary is in the key: the options (each, in order), the
/// architecture, the headers' content; the same inputs again are a hit, in memory and on disk.
#[test]
fn every_input_that_changes_the_binary_is_in_the_key() {
    let Some([nvrtc, _]) = both() else { return };
    let (inc, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(inc.path().join("scale.h"), header("first")).unwrap();
    let fake = driver();
    let c0 = fake.create_context(0);
    let flag = include(inc.path());
    let lookups: [&[&str]; 5] = [
        &[&flag, "-arch=sm_80"],
        &[&flag, "-arch=sm_80", "-DX=1"],
        &[&flag, "-arch=sm_80", "-DX=2"],
        // The order matters: the last of -D and -U wins.
        &[&flag, "-arch=sm_80", "-DX=2", "-UX"],
        &[&flag, "-arch=sm_80", "-UX", "-DX=2"],
    ];
    let cache1 = cache(&fake, &nvrtc, Some(disk(dir.path())));
    for (i, options) in lookups.iter().enumerate() {
        cache1
            .find_or_build_source(ctx(c0), WITH_HEADER, options, &[])
            .unwrap();
        assert_eq!(cache1.stats().nvrtc_compiles, i as u64 + 1, "{options:?}");
    }
    // The virtual architecture is another binary (PTX, linked).
    cache1
        .find_or_build_source(ctx(c0), WITH_HEADER, &[&flag, "-arch=compute_80"], &[])
        .unwrap();
    assert_eq!(cache1.stats().nvrtc_compiles, 6);
    for options in lookups {
        cache1
            .find_or_build_source(ctx(c0), WITH_HEADER, options, &[])
            .unwrap();
    }
    assert_eq!(cache1.stats().nvrtc_compiles, 6);
    cache1.flush();
    drop(cache1);

    // A fresh cache on the same disk: every one a disk hit, no compile.
    let cache2 = cache(&fake, &nvrtc, Some(disk(dir.path())));
    for options in lookups {
        cache2
            .find_or_build_source(ctx(c0), WITH_HEADER, options, &[])
            .unwrap();
    }
    assert_eq!(cache2.stats().nvrtc_compiles, 0);
    assert_eq!(cache2.stats().disk_hits, 5);

    // A changed header is a miss, in memory and on disk, and never the stale module; a fresh
    // cache then finds the new module on disk.
    std::fs::write(inc.path().join("scale.h"), header("second")).unwrap();
    let cache3 = cache(&fake, &nvrtc, Some(disk(dir.path())));
    for (cache, compiles, disk_hits) in [(&cache2, 1, 5), (&cache3, 0, 1)] {
        let lease = cache
            .find_or_build_source(ctx(c0), WITH_HEADER, lookups[0], &[])
            .unwrap();
        assert!(!lease.function("second").unwrap().is_null());
        assert_err!(lease.function("first"), Error::NotFound);
        assert_eq!(cache.stats().nvrtc_compiles, compiles);
        assert_eq!(cache.stats().disk_hits, disk_hits);
        cache.flush();
    }
}

/// The same source and options under CUDA 13's and CUDA 12's NVRTC never share an entry, and
/// each NVRTC is known by its file (`nvrtcVersion` gives major.minor only).
#[test]
fn cuda_12_and_13_never_share_an_entry() {
    let Some([nvrtc13, nvrtc12]) = both() else {
        return;
    };
    assert_eq!(nvrtc13.version().0, 13);
    assert_eq!(nvrtc12.version().0, 12);
    // The wheels install libnvrtc.so.13 / .12 as regular files, which name no patch release.
    for nvrtc in [&nvrtc13, &nvrtc12] {
        assert!(
            nvrtc.build().contains(" bytes, blake3 "),
            "{}",
            nvrtc.build()
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let fake = driver();
    let c0 = fake.create_context(0);
    let options: &[&str] = &["-arch=sm_80", "-std=c++17"];
    for (nvrtc, hits) in [(&nvrtc13, 0), (&nvrtc12, 0), (&nvrtc13, 1), (&nvrtc12, 1)] {
        let cache = cache(&fake, nvrtc, Some(disk(dir.path())));
        cache
            .find_or_build_source(ctx(c0), TEMPLATE, options, &[])
            .unwrap();
        assert_eq!(cache.stats().disk_hits, hits);
        assert_eq!(cache.stats().nvrtc_compiles, 1 - hits);
        cache.flush();
    }
    assert_eq!(disk(dir.path()).entries().unwrap().len(), 2);
}

/// JIT options only reach the driver's linker: with a real architecture, whose cubin NVRTC
/// makes and the driver loads without a link, they would be dropped, so the lookup is refused;
/// with a virtual one the PTX is linked with them.
#[test]
fn jit_options_are_refused_with_a_real_architecture_and_linked_with_a_virtual_one() {
    let Some([nvrtc, _]) = both() else { return };
    let fake = driver();
    let c0 = fake.create_context(0);
    let cache = cache(&fake, &nvrtc, None);
    let jit = [JitOption::MaxRegisters(32)];
    assert_err!(
        cache.find_or_build_source(ctx(c0), TEMPLATE, &["-arch=sm_80"], &jit),
        Error::InvalidArgument(_)
    );
    assert_eq!(cache.stats().nvrtc_compiles, 0);
    cache
        .find_or_build_source(ctx(c0), TEMPLATE, &["-arch=compute_80"], &jit)
        .unwrap();
    assert_eq!(cache.stats().links, 1);
    assert_eq!(fake.counter("last_max_registers"), 32);
}

/// `-dlto` makes LTO IR and no cubin (`nvrtcGetCUBINSize` says 0): a build error, and nothing
/// is handed to cuModuleLoadDataEx, which takes no size.
#[test]
fn no_cubin_from_nvrtc_is_a_build_error() {
    let Some(nvrtcs) = both() else { return };
    for nvrtc in &nvrtcs {
        let fake = driver();
        let c0 = fake.create_context(0);
        let cache = cache(&fake, nvrtc, None);
        let failed = cache.find_or_build_source(ctx(c0), TEMPLATE, &["-arch=sm_80", "-dlto"], &[]);
        let Err(Error::Build(error)) = failed else {
            panic!("not a build error")
        };
        assert!(error.message.contains("no cubin"), "{}", error.message);
        assert_eq!(fake.counter("module_load"), 0);
        assert_eq!(fake.counter("module_load_failed"), 0);
    }
}

/// What `scripts/gpu-check` runs on a GPU, here on the stand-in driver: every kernel found, for
/// the device's own architecture, which kcache picks.
#[test]
fn the_gpu_checks_kernels_compile_for_the_device() {
    let Some(nvrtcs) = both() else { return };
    for nvrtc in &nvrtcs {
        let fake = driver();
        let c1 = fake.create_context(1);
        let cache = cache(&fake, nvrtc, None);
        assert_eq!(check_kernels(&cache, ctx(c1)).unwrap(), 3);
        assert_eq!(fake.counter("module_load_elf"), 3);
        assert_eq!(fake.counter("last_elf_arch"), 90);
    }
}

/// Lookups of one failing source at once all get NVRTC's error and none is left waiting: the
/// failure is not kept, so the next lookup compiles again.
#[test]
fn concurrent_lookups_of_a_failing_compile_all_get_the_error() {
    let Some([nvrtc, _]) = both() else { return };
    let fake = driver();
    let c0 = ctx(fake.create_context(0));
    let cache = cache(&fake, &nvrtc, None);
    let barrier = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                barrier.wait();
                let failed = cache.find_or_build_source(c0, BROKEN, &["-arch=sm_80"], &[]);
                assert!(matches!(failed, Err(Error::Build(ref e)) if e.code == 6));
            });
        }
    });
    let failures = cache.stats().nvrtc_failures;
    assert!((1..=4).contains(&failures), "{failures}");
    assert_err!(
        cache.find_or_build_source(c0, BROKEN, &["-arch=sm_80"], &[]),
        Error::Build(_)
    );
    assert_eq!(cache.stats().nvrtc_failures, failures + 1);
    assert_eq!(cache.stats().memory.entries, 0);
}

/// kcache runs no ptxas (NVRTC assembles a real architecture itself, the driver's JIT links
/// PTX), but the PTX kcache hands the driver must assemble: the repository's saxpy.ptx, which
/// the stand-in and `scripts/gpu-check` run, and NVRTC 12.9's PTX each become an sm_80 and an
/// sm_90 cubin with CUDA 12.9's ptxas.
#[test]
fn nvidias_ptxas_assembles_the_ptx_the_driver_is_handed() {
    let Some(ptxas) = real_ptxas() else { return };
    let Some(nvrtc) = real_nvrtc(NVRTC12) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("scale.h"), header("twice")).unwrap();
    let flag = include(dir.path());
    let from_nvrtc = nvrtc
        .compile(WITH_HEADER, &[&flag, "-arch=compute_80"])
        .unwrap();
    for (name, ptx) in [("saxpy", SAXPY_PTX.as_bytes()), ("twice", &from_nvrtc)] {
        let input = dir.path().join(format!("{name}.ptx"));
        std::fs::write(&input, ptx).unwrap();
        for arch in [80, 90] {
            let output = dir.path().join(format!("{name}.sm_{arch}.cubin"));
            let run = std::process::Command::new(&ptxas)
                .arg(format!("-arch=sm_{arch}"))
                .arg("-o")
                .arg(&output)
                .arg(&input)
                .output()
                .unwrap();
            assert!(run.status.success(), "{name}: {run:?}");
            let cubin = std::fs::read(&output).unwrap();
            assert_eq!(cubin_arch(&cubin), Some(arch), "{name}");
            // The cubin's kernel is the PTX's entry.
            let section = format!(".nv.info.{name}\0");
            assert!(
                cubin
                    .windows(section.len())
                    .any(|w| w == section.as_bytes()),
                "{name}"
            );
        }
    }
}
