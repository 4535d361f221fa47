//! Support for kcache's own CUDA tests, benchmark and `cuda_check` example: building the test
//! libraries that stand in for the driver and NVRTC, binding a primary context, and running the
//! repository's saxpy kernel. Not part of the supported API.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use super::cache::{CudaCache, ModuleLease};
use super::driver::{CUcontext, CUdevice, CUdeviceptr, CUfunction, CUmodule, Driver};
use crate::{Error, Result};

/// The repository's saxpy kernel, `y[i] = a * x[i] + y[i]`, with the parameters
/// `(u32 n, f32 a, f32 *x, f32 *y)`.
pub const SAXPY_PTX: &str = include_str!("../../../c-tests/cuda/kernels/saxpy.ptx");

/// [`SAXPY_PTX`] as CUDA C++, for NVRTC.
pub const SAXPY_CUDA: &str = "extern \"C\" __global__ void saxpy(unsigned n, float a, \
                              const float *x, float *y) {\n\
                              unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n\
                              if (i < n) y[i] = a * x[i] + y[i];\n}\n";

/// Compiles `c-tests/cuda/<name>.c` (`fake_cuda` or `fake_nvrtc`) into a shared library in
/// `out_dir`, once per process. Panics when the C compiler (`$CC`, else `cc`) fails.
pub fn build_test_library(name: &str, out_dir: &Path) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = built.iter().find(|(n, _)| n == name) {
        return path.clone();
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("c-tests/cuda/{name}.c"));
    // The process id keeps concurrent test processes from writing one file.
    let out = out_dir.join(format!("lib{name}-{}.so", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-std=c11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-o",
        ])
        .arg(&out)
        .arg(&source)
        .arg("-lm")
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(status.success(), "building {name} failed");
    built.push((name.to_owned(), out.clone()));
    out
}

/// A device's primary context, retained and current on the calling thread until
/// [`PrimaryContext::release`]; never released without it. Drop every module and cache made in
/// it before releasing.
pub struct PrimaryContext {
    driver: Arc<Driver>,
    device: CUdevice,
}

impl PrimaryContext {
    pub fn bind(driver: &Arc<Driver>, device: CUdevice) -> Result<PrimaryContext> {
        let context = driver.retain_primary_context(device)?;
        // SAFETY: retained just above, so live; released only by `release`, after unbinding.
        unsafe { driver.set_current_context(context) }?;
        Ok(PrimaryContext {
            driver: Arc::clone(driver),
            device,
        })
    }

    /// Unbinds the context from this thread, then releases it; the first error wins.
    pub fn release(self) -> Result<()> {
        // SAFETY: NULL binds no context.
        let unbound = unsafe { self.driver.set_current_context(std::ptr::null_mut()) };
        // SAFETY: `bind` took the retain this gives back, and the context is no longer current
        // here; whoever loaded modules in it has dropped them before releasing (documented).
        let released = unsafe { self.driver.release_primary_context(self.device) };
        unbound.and(released)
    }
}

enum Loaded {
    Leased(ModuleLease),
    Owned(CUmodule),
}

/// A module holding the `saxpy` kernel of [`SAXPY_PTX`] or [`SAXPY_CUDA`]. Only the
/// constructors below make one, from those sources: that is what makes the kernel's parameter
/// types known to [`Saxpy::run`].
pub struct Saxpy<'a> {
    driver: &'a Driver,
    context: CUcontext,
    module: Loaded,
}

impl Saxpy<'_> {
    /// The module from `cache`, for the current context: linked from [`SAXPY_PTX`], or with
    /// `nvrtc` compiled from [`SAXPY_CUDA`] by NVRTC.
    pub fn cached(cache: &CudaCache, nvrtc: bool) -> Result<Saxpy<'_>> {
        let lease = if nvrtc {
            cache.find_or_build_source(None, SAXPY_CUDA, &[], &[])?
        } else {
            cache.find_or_build_ptx(None, SAXPY_PTX.as_bytes(), &[])?
        };
        Ok(Saxpy {
            driver: cache.driver(),
            context: lease.context(),
            module: Loaded::Leased(lease),
        })
    }

    /// `cuModuleLoadDataEx` on [`SAXPY_PTX`] in the current context, without kcache: the driver
    /// JIT-compiles it (through CUDA's own JIT cache unless `CUDA_CACHE_DISABLE=1`).
    pub fn load(driver: &Driver) -> Result<Saxpy<'_>> {
        let context = driver.current_context()?;
        let mut image = SAXPY_PTX.as_bytes().to_vec();
        image.push(0);
        let module = driver.load_module(&image)?;
        Ok(Saxpy {
            driver,
            context,
            module: Loaded::Owned(module),
        })
    }

    pub fn module(&self) -> CUmodule {
        match &self.module {
            Loaded::Leased(lease) => lease.raw(),
            Loaded::Owned(module) => *module,
        }
    }

    fn check_current(&self) -> Result<()> {
        if self.driver.current_context()? == self.context {
            Ok(())
        } else {
            Err(Error::InvalidArgument(
                "the saxpy module's context is not current".into(),
            ))
        }
    }

    /// Runs the kernel over `x` and `y` (the same, non-zero length) with the module's context
    /// current on this thread, and returns the new `y`.
    pub fn run(&self, a: f32, x: &[f32], y: &[f32]) -> Result<Vec<f32>> {
        let n = u32::try_from(x.len())
            .ok()
            .filter(|&n| n > 0 && x.len() == y.len())
            .ok_or_else(|| {
                Error::InvalidArgument("x and y need one equal, non-zero length".into())
            })?;
        self.check_current()?;
        let function = match &self.module {
            Loaded::Leased(lease) => lease.function("saxpy")?,
            // SAFETY: loaded by `load` in the current context (checked above), and unloaded only
            // by `unload`, which consumes `self`.
            Loaded::Owned(module) => {
                unsafe { self.driver.function(*module, "saxpy") }?.ok_or(Error::NotFound)?
            }
        };
        let bytes = size_of_val(x);
        let dx = self.driver.mem_alloc(bytes)?;
        let out = self.driver.mem_alloc(bytes).and_then(|dy| {
            // SAFETY: `function` is the saxpy kernel of this module, live in the current
            // context; `dx` and `dy` were allocated above with `n` floats each.
            let out = unsafe { self.launch(function, n, a, (dx, x), (dy, y)) };
            // SAFETY: allocated above, freed once.
            let freed = unsafe { self.driver.mem_free(dy) };
            let out = out?;
            freed.map(|()| out)
        });
        // SAFETY: allocated above, freed once.
        let freed = unsafe { self.driver.mem_free(dx) };
        let out = out?;
        freed?;
        Ok(out)
    }

    /// Copies `x` and `y` to their device buffers, runs the kernel, and returns the new `y`.
    ///
    /// # Safety
    /// `saxpy` must be the saxpy kernel, live in the current context, and `dx` and `dy` device
    /// buffers of `n` floats each.
    unsafe fn launch(
        &self,
        saxpy: CUfunction,
        n: u32,
        a: f32,
        (dx, x): (CUdeviceptr, &[f32]),
        (dy, y): (CUdeviceptr, &[f32]),
    ) -> Result<Vec<f32>> {
        let to_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_ne_bytes()).collect() };
        let mut out = vec![0u8; size_of_val(y)];
        // SAFETY: the buffers hold `n` floats, as long as `x`, `y` and `out` (the caller's
        // guarantee, with `n` their length); the kernel's parameters are (u32 n, f32 a,
        // f32 *x, f32 *y), passed as pointers to locals of those types that outlive the
        // synchronous launch.
        unsafe {
            self.driver.copy_to_device(dx, &to_bytes(x))?;
            self.driver.copy_to_device(dy, &to_bytes(y))?;
            let (mut n_arg, mut a_arg, mut x_arg, mut y_arg) = (n, a, dx, dy);
            let mut params: [*mut c_void; 4] = [
                (&raw mut n_arg).cast(),
                (&raw mut a_arg).cast(),
                (&raw mut x_arg).cast(),
                (&raw mut y_arg).cast(),
            ];
            self.driver.launch_and_wait(
                saxpy,
                [n.div_ceil(256), 1, 1],
                [256, 1, 1],
                &mut params,
            )?;
            self.driver.copy_from_device(&mut out, dy)?;
        }
        Ok(out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Unloads a module from [`Saxpy::load`], with its context current; releases the lease of
    /// one from [`Saxpy::cached`].
    pub fn unload(self) -> Result<()> {
        let Loaded::Owned(module) = &self.module else {
            return Ok(());
        };
        self.check_current()?;
        // SAFETY: loaded by `load` in the current context (checked above); `self` is consumed,
        // so nothing uses the module afterwards.
        unsafe { self.driver.unload_module(*module) }
    }
}
