//! Runs the repository's saxpy PTX (`c-tests/cuda/kernels/saxpy.ptx`) on a real GPU, checks
//! the result, and times how the module was obtained. Driven by `scripts/gpu-check`, which runs
//! it in several processes with different environments:
//!
//! - `cuda_check jit`: `cuModuleLoadDataEx` on the PTX, without kcache. With
//!   `CUDA_CACHE_DISABLE=1` this is a cold JIT; with a warm `CUDA_CACHE_PATH`, a hit in CUDA's
//!   own JIT cache.
//! - `cuda_check kcache link|disk`: the module through a `CudaCache` whose disk tier is
//!   `KCACHE_DIR`; the argument says where the first lookup must come from (a PTX link, or a
//!   cubin from disk). Then times memory-tier hits.
//!
//! - `cuda_check nvrtc link|disk`: as `kcache`, from CUDA C++ source compiled by NVRTC.
//!
//! Prints `RESULT <name> <milliseconds>` lines. Exit status 2 means no usable CUDA driver,
//! 3 no NVRTC library (for `nvrtc`).

use std::ffi::c_void;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use kcache::Error;
use kcache::backend::cuda::driver::CUdeviceptr;
use kcache::backend::cuda::{CUfunction, CudaCache, CudaOptions, Driver};
use kcache::disk::{DiskCache, DiskConfig};

const PTX: &str = include_str!("../c-tests/cuda/kernels/saxpy.ptx");
/// The same kernel as `PTX`, as CUDA C++.
const CUDA_SOURCE: &str = "extern \"C\" __global__ void saxpy(unsigned n, float a, \
                           const float *x, float *y) {\n\
                           unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n\
                           if (i < n) y[i] = a * x[i] + y[i];\n}\n";
const L1_ROUNDS: u32 = 10_000;

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
    let usage =
        || Error::InvalidArgument("usage: cuda_check jit | cuda_check kcache link|disk".into());
    let mode = args.first().ok_or_else(usage)?;
    let driver = Arc::new(Driver::load()?);
    let device = driver.device(0)?;
    let (major, minor) = driver.compute_capability(device)?;
    println!(
        "device 0: {} (compute capability {major}.{minor}), driver {}",
        driver.device_name(device)?,
        driver.version()
    );
    let context = driver.retain_primary_context(device)?;
    // SAFETY: a primary context just retained, released below after every use.
    unsafe { driver.set_current_context(context) }?;
    let outcome = match mode.as_str() {
        "jit" => run_jit(&driver),
        "kcache" => run_kcache(&driver, false, args.get(1).ok_or_else(usage)?),
        "nvrtc" => run_kcache(&driver, true, args.get(1).ok_or_else(usage)?),
        _ => Err(usage()),
    };
    // SAFETY: unbinds the context before its release.
    let unbound = unsafe { driver.set_current_context(std::ptr::null_mut()) };
    let released = driver.release_primary_context(device);
    outcome?;
    unbound?;
    released
}

fn run_jit(driver: &Driver) -> Result<(), Error> {
    let mut image = PTX.as_bytes().to_vec();
    image.push(0);
    let start = Instant::now();
    let module = driver.load_module(&image)?;
    println!("RESULT jit_load {:.3}", ms(start));
    // SAFETY: the module was just loaded in the current context.
    let saxpy = unsafe { driver.function(module, "saxpy") }?.ok_or(Error::NotFound)?;
    let checked = run_saxpy(driver, saxpy);
    // SAFETY: loaded above in the current context; nothing uses it afterwards.
    unsafe { driver.unload_module(module) }?;
    checked
}

fn run_kcache(driver: &Arc<Driver>, nvrtc: bool, expect: &str) -> Result<(), Error> {
    let disk = Arc::new(DiskCache::open(DiskConfig::from_env())?);
    let cache = CudaCache::new(CudaOptions {
        disk: Some(disk),
        driver: Some(Arc::clone(driver)),
        ..CudaOptions::default()
    })?;
    let lookup = || {
        if nvrtc {
            cache.module_from_cuda(None, CUDA_SOURCE, &[], &[])
        } else {
            cache.module(None, PTX.as_bytes(), &[])
        }
    };
    if nvrtc {
        let found = cache.nvrtc()?;
        println!(
            "NVRTC {:?} from {}",
            found.version(),
            found.path().display()
        );
    }
    let prefix = if nvrtc { "nvrtc" } else { "kcache" };
    let start = Instant::now();
    let lease = lookup()?;
    let first = ms(start);
    let stats = cache.stats();
    let source = match (stats.links, stats.cubin_loads) {
        (1, 0) => "link",
        (0, 1) => "disk",
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
    run_saxpy(driver, lease.function("saxpy")?)?;

    let start = Instant::now();
    for _ in 0..L1_ROUNDS {
        let hit = lookup()?;
        if hit.raw() != lease.raw() {
            return Err(Error::Backend(
                "a memory hit returned another module".into(),
            ));
        }
    }
    println!(
        "RESULT {prefix}_memory_hit {:.6}",
        ms(start) / f64::from(L1_ROUNDS)
    );
    drop(lease);
    let stats = cache.stats();
    if stats.memory.hits != u64::from(L1_ROUNDS) {
        return Err(Error::Backend(format!(
            "expected {L1_ROUNDS} hits: {stats:?}"
        )));
    }
    Ok(())
}

/// y = a * x + y on 2^20 floats, compared exactly with the host's fused multiply-add.
fn run_saxpy(driver: &Driver, saxpy: CUfunction) -> Result<(), Error> {
    let n: u32 = 1 << 20;
    let a: f32 = 2.5;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + 1.0).collect();
    let bytes = n as usize * 4;
    let dx = driver.mem_alloc(bytes)?;
    let out = driver.mem_alloc(bytes).and_then(|dy| {
        let out = launch(driver, saxpy, n, a, (dx, &x), (dy, &y));
        // SAFETY: allocated above, freed once.
        let freed = unsafe { driver.mem_free(dy) };
        let out = out?;
        freed.map(|()| out)
    });
    // SAFETY: allocated above, freed once.
    let freed = unsafe { driver.mem_free(dx) };
    let out = out?;
    freed?;
    let wrong = (0..n as usize)
        .filter(|&i| out[i] != a.mul_add(x[i], y[i]))
        .count();
    if wrong != 0 {
        return Err(Error::Backend(format!(
            "saxpy: {wrong} of {n} results are wrong"
        )));
    }
    println!("saxpy: {n} results correct");
    Ok(())
}

/// Copies `x` and `y` to their device buffers, runs the kernel, and returns the new `y`.
fn launch(
    driver: &Driver,
    saxpy: CUfunction,
    n: u32,
    a: f32,
    (dx, x): (CUdeviceptr, &[f32]),
    (dy, y): (CUdeviceptr, &[f32]),
) -> Result<Vec<f32>, Error> {
    let to_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_ne_bytes()).collect() };
    let mut out = vec![0u8; y.len() * 4];
    // SAFETY: `dx` and `dy` hold `4 * n` bytes each; the kernel's parameters are
    // (u32 n, f32 a, f32 *x, f32 *y), passed as pointers to locals of those types that outlive
    // the synchronous launch.
    unsafe {
        driver.copy_to_device(dx, &to_bytes(x))?;
        driver.copy_to_device(dy, &to_bytes(y))?;
        let (mut n_arg, mut a_arg, mut x_arg, mut y_arg) = (n, a, dx, dy);
        let mut params: [*mut c_void; 4] = [
            (&raw mut n_arg).cast(),
            (&raw mut a_arg).cast(),
            (&raw mut x_arg).cast(),
            (&raw mut y_arg).cast(),
        ];
        driver.launch_and_wait(saxpy, [n.div_ceil(256), 1, 1], [256, 1, 1], &mut params)?;
        driver.copy_from_device(&mut out, dy)?;
    }
    Ok(out
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
