//! Runs the repository's saxpy PTX (`c-tests/cuda/kernels/saxpy.ptx`) on a real GPU, checks
//! the result, and times how the module was obtained (up to and including
//! `cuModuleGetFunction`, where lazy loading, the Linux default since CUDA 12.2, loads the
//! kernel) and the kernel itself: a cubin kcache linked from PTX is relocatable code, which may
//! run differently from the PTX the driver JIT-compiles whole. Driven by `scripts/gpu-check`,
//! which runs it in several processes with different environments:
//!
//! - `cuda_check jit`: `cuModuleLoadDataEx` on the PTX, without kcache. With
//!   `CUDA_CACHE_DISABLE=1` this is a cold JIT; with a warm `CUDA_CACHE_PATH`, a hit in CUDA's
//!   own JIT cache.
//! - `cuda_check kcache link|disk`: the module through a `CudaCache` whose disk tier is
//!   `KCACHE_DIR`; the argument says where the first lookup must come from (a PTX link, or a
//!   cubin from disk). Then times memory-tier hits (the lookup alone, as a program repeats
//!   it), and exercises what kcache adds over the driver: a lookup and kernel lookup from a
//!   thread with no current context (kcache pushes the module's context), `evict_context`
//!   and `evict_device`, and every module unloaded without a driver error
//!   (`destroy_errors == 0`).
//!
//! - `cuda_check nvrtc link|disk`: as `kcache`, from CUDA C++ source compiled by NVRTC (`link`:
//!   built, by NVRTC's own cubin or through a link).
//!
//! - `cuda_check kernels`: the kernels of `tests/cuda_real_nvrtc.rs` through NVRTC for the
//!   device (a header through `-I`, an in-memory header, a template found by its mangled name)
//!   each looked up, and a failing compile that must give NVRTC's log.
//!
//! Prints `RESULT <name> <milliseconds>` lines. Exit status 2 means no usable CUDA driver,
//! 3 no NVRTC library, or one newer than the driver that cannot make a cubin for the device
//! (for `nvrtc`: its PTX would need a newer driver).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use kcache::Error;
use kcache::backend::cuda::{Context, CudaCache, CudaOptions, Driver, ModuleLease};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::cuda::{PrimaryContext, SAXPY_CUDA, SAXPY_PTX, Saxpy};
use kcache_testkit::nvrtc::check_kernels;

const L1_ROUNDS: u32 = 10_000;
/// Lookups timed from a thread with no current context.
const OTHER_THREAD_ROUNDS: u32 = 1_000;
/// Launches timed for the kernel's own figure.
const KERNEL_ROUNDS: u32 = 20;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::Unavailable(message)) if message.contains("NVRTC") => {
            eprintln!("cuda_check: {message}");
            ExitCode::from(3)
        }
        Err(Error::Unavailable(message)) => {
            eprintln!("cuda_check: {message}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("cuda_check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

fn run(args: &[String]) -> Result<(), Error> {
    let usage = || {
        Error::InvalidArgument(
            "usage: cuda_check jit | cuda_check kcache|nvrtc link|disk | cuda_check kernels".into(),
        )
    };
    let mode = args.first().ok_or_else(usage)?;
    let driver = Arc::new(Driver::load()?);
    let device = driver.device(0)?;
    let (major, minor) = driver.compute_capability(device)?;
    println!(
        "device 0: {} (compute capability {major}.{minor}), driver {} ({})",
        driver.device_name(device)?,
        driver.version(),
        driver.build()
    );
    let context = PrimaryContext::bind(&driver, device)?;
    let outcome = match mode.as_str() {
        "jit" => run_jit(&driver),
        "kcache" => run_kcache(&driver, false, args.get(1).ok_or_else(usage)?),
        "nvrtc" => run_kcache(&driver, true, args.get(1).ok_or_else(usage)?),
        "kernels" => run_kernels(&driver),
        _ => Err(usage()),
    };
    let released = context.release();
    outcome?;
    released
}

fn run_kernels(driver: &Arc<Driver>) -> Result<(), Error> {
    let cache = CudaCache::new(CudaOptions {
        driver: Some(Arc::clone(driver)),
        ..CudaOptions::default()
    })?;
    let nvrtc = cache.nvrtc()?;
    println!("NVRTC {:?} ({})", nvrtc.version(), nvrtc.build());
    let found = check_kernels(&cache, None)?;
    println!("kernels: {found} found, and the failing compile gave NVRTC's log");
    Ok(())
}

fn run_jit(driver: &Driver) -> Result<(), Error> {
    let start = Instant::now();
    let saxpy = Saxpy::load(driver)?;
    saxpy.function()?;
    println!("RESULT jit_load {:.3}", ms(start));
    let checked = run_saxpy(&saxpy, "jit");
    saxpy.unload()?;
    checked
}

fn run_kcache(driver: &Arc<Driver>, nvrtc: bool, expect: &str) -> Result<(), Error> {
    let disk = Arc::new(Persistence::open(PersistenceConfig::from_env())?);
    let cache = CudaCache::new(CudaOptions {
        persistence: Some(disk),
        driver: Some(Arc::clone(driver)),
        ..CudaOptions::default()
    })?;
    let find = |context: Option<Context>| -> Result<ModuleLease, Error> {
        if nvrtc {
            cache.find_or_build_source(context, SAXPY_CUDA, &[], &[])
        } else {
            cache.find_or_build_ptx(context, SAXPY_PTX.as_bytes(), &[])
        }
    };
    if nvrtc {
        let found = cache.nvrtc()?;
        println!(
            "NVRTC {:?} from {}",
            found.version(),
            found.path().display()
        );
        let device = driver.device(0)?;
        let (major, minor) = driver.compute_capability(device)?;
        if found.is_newer_than(driver.version())
            && !found.supported_archs().contains(&(major * 10 + minor))
        {
            return Err(Error::Unavailable(format!(
                "NVRTC {:?} is newer than the driver ({}) and cannot make a cubin for sm_{major}{minor}: \
                 its PTX would need a newer driver",
                found.version(),
                driver.version()
            )));
        }
    }
    let prefix = if nvrtc { "nvrtc" } else { "kcache" };
    let start = Instant::now();
    let first = find(None)?;
    first.function("saxpy")?;
    let elapsed = ms(start);
    let lease = Saxpy::leased(&cache, first)?;
    let first = elapsed;
    let stats = cache.stats();
    let built = stats.links + stats.nvrtc_compiles;
    let source = match (built > 0, stats.cubin_loads) {
        (true, 0) => "link",
        (false, 1) => "disk",
        _ => {
            return Err(Error::Backend(format!(
                "unexpected first lookup: {stats:?}"
            )));
        }
    };
    if source != expect {
        return Err(Error::Backend(format!(
            "the first lookup came from {source}, expected {expect}"
        )));
    }
    println!("RESULT {prefix}_{source} {first:.3}");
    run_saxpy(&lease, &format!("{prefix}_{source}"))?;

    // What a program repeats: the lookup alone, the module's context current.
    let context = cache
        .current_context()?
        .ok_or_else(|| Error::Backend("the primary context is not current".into()))?;
    let module = lease.module() as usize;
    let start = Instant::now();
    for _ in 0..L1_ROUNDS {
        if find(None)?.raw() as usize != module {
            return Err(Error::Backend(
                "a memory hit returned another module".into(),
            ));
        }
    }
    println!(
        "RESULT {prefix}_memory_hit {:.6}",
        ms(start) / f64::from(L1_ROUNDS)
    );
    let stats = cache.stats();
    if stats.memory.hits != u64::from(L1_ROUNDS) {
        return Err(Error::Backend(format!(
            "expected {L1_ROUNDS} hits: {stats:?}"
        )));
    }

    // A thread with no current context: the hit needs none, the kernel lookup has kcache push
    // the module's context and pop it again.
    let other_thread = std::thread::scope(|s| {
        s.spawn(|| -> Result<f64, Error> {
            if !driver.current_context()?.is_null() {
                return Err(Error::Backend("a new thread has a current context".into()));
            }
            let start = Instant::now();
            for _ in 0..OTHER_THREAD_ROUNDS {
                let hit = find(Some(context))?;
                if hit.raw() as usize != module || hit.function("saxpy")?.is_null() {
                    return Err(Error::Backend("the hit from another thread differs".into()));
                }
            }
            let elapsed = ms(start) / f64::from(OTHER_THREAD_ROUNDS);
            if !driver.current_context()?.is_null() {
                return Err(Error::Backend("kcache left a context current".into()));
            }
            Ok(elapsed)
        })
        .join()
        .map_err(|_| Error::Backend("the lookup thread panicked".into()))?
    })?;
    println!("RESULT {prefix}_hit_no_context {other_thread:.6}");
    drop(lease);

    // Eviction: by context, then (after the module came back from the disk tier) by device.
    // Each module is unloaded with its context current, and the driver must accept each unload.
    cache.flush(); // the cubin is on disk before the module leaves memory
    let evicted = cache.evict_context(context.raw())?;
    let reloaded = find(None)?;
    let stats = cache.stats();
    if stats.cubin_loads != (source == "disk") as u64 + 1 {
        return Err(Error::Backend(format!(
            "the evicted module did not come back from the disk tier: {stats:?}"
        )));
    }
    drop(reloaded);
    let evicted_device = cache.evict_device(driver.device(0)?)?;
    let stats = cache.stats().memory;
    if (
        evicted,
        evicted_device,
        stats.destroys,
        stats.destroy_errors,
    ) != (1, 1, 2, 0)
    {
        return Err(Error::Backend(format!(
            "evict_context unlinked {evicted}, evict_device {evicted_device}; expected 1 and \
             1, then 2 unloads without an error: {stats:?}"
        )));
    }
    println!("evict_context, evict_device: 2 modules unloaded, destroy_errors 0");
    Ok(())
}

/// y = a * x + y on 2^20 floats, compared exactly with the host's fused multiply-add; then the
/// kernel's own time, as `RESULT <name>_kernel`.
fn run_saxpy(saxpy: &Saxpy, name: &str) -> Result<(), Error> {
    let n: u32 = 1 << 20;
    let a: f32 = 2.5;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + 1.0).collect();
    let out = saxpy.run(a, &x, &y)?;
    let wrong = (0..n as usize)
        .filter(|&i| out[i] != a.mul_add(x[i], y[i]))
        .count();
    if wrong != 0 {
        return Err(Error::Backend(format!(
            "saxpy: {wrong} of {n} results are wrong"
        )));
    }
    println!("saxpy: {n} results correct");
    let kernel = saxpy.kernel_time(&x, &y, KERNEL_ROUNDS)?;
    println!("RESULT {name}_kernel {kernel:.4}");
    Ok(())
}
