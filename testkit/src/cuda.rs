//! CUDA without a GPU, and running a kernel with one.
//!
//! No GPU and no CUDA toolkit are available in CI, so the tests do not talk to the real NVIDIA
//! driver or NVRTC: the build script compiles `c-tests/cuda/fake_cuda.c`, a library that stands
//! in for `libcuda.so.1` (same entry points, same prototypes), and `c-tests/cuda/fake_nvrtc.c`,
//! which stands in for NVRTC. The driver stand-in counts every call, produces deterministic fake
//! cubins from the PTX, enforces the per-thread context binding, and can be told to refuse
//! cubins. The real driver path is exercised by `scripts/gpu-check` on a GPU machine, through
//! [`PrimaryContext`] and [`Saxpy`].
//!
//! Each [`FakeDriver`] and [`FakeNvrtc`] is a private copy of the library file, so the dynamic
//! loader gives it its own globals: tests running in parallel threads do not share counters.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kcache::backend::cuda::{
    CUcontext, CUdevice, CUfunction, CUmodule, CudaCache, Driver, ModuleLease, Nvrtc,
};
use kcache::{Error, Result};
use libloading::Library;
use tempfile::TempDir;

/// The repository's saxpy kernel, `y[i] = a * x[i] + y[i]`, with the parameters
/// `(u32 n, f32 a, f32 *x, f32 *y)`.
pub const SAXPY_PTX: &str = include_str!("../../c-tests/cuda/kernels/saxpy.ptx");

/// [`SAXPY_PTX`] as CUDA C++, for NVRTC.
pub const SAXPY_CUDA: &str = "extern \"C\" __global__ void saxpy(unsigned n, float a, \
                              const float *x, float *y) {\n\
                              unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n\
                              if (i < n) y[i] = a * x[i] + y[i];\n}\n";

/// The driver stand-in built by this crate's build script.
pub fn stand_in_driver_path() -> &'static Path {
    Path::new(env!("KCACHE_TESTKIT_FAKE_CUDA"))
}

/// The NVRTC stand-in built by this crate's build script.
pub fn stand_in_nvrtc_path() -> &'static Path {
    Path::new(env!("KCACHE_TESTKIT_FAKE_NVRTC"))
}

/// A private copy of a stand-in library in a directory of its own, loaded from there.
struct PrivateCopy {
    path: PathBuf,
    library: Library,
    _dir: TempDir,
}

impl PrivateCopy {
    /// Copies `built` under `file_name` and loads the copy.
    fn new(built: &Path, file_name: &str) -> PrivateCopy {
        Self::linked(built, file_name, file_name)
    }

    /// Copies `built` under `file_name`, links `link_name` to it (unless the same), and loads
    /// the copy through the link, as `libcuda.so.1` links to `libcuda.so.<build>`.
    fn linked(built: &Path, file_name: &str, link_name: &str) -> PrivateCopy {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(built, dir.path().join(file_name)).unwrap();
        let path = dir.path().join(link_name);
        if link_name != file_name {
            std::os::unix::fs::symlink(file_name, &path).unwrap();
        }
        // SAFETY: the stand-ins have no initialisers with preconditions.
        let library = unsafe { Library::new(&path) }.unwrap();
        PrivateCopy {
            path,
            library,
            _dir: dir,
        }
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: every caller names a symbol of the stand-in with its C type, and the stand-in
        // that owns `self` keeps the library open while the pointer is called.
        unsafe { symbol(&self.library, name) }.unwrap()
    }
}

/// Copies the function pointer `name` of type `T` out of `library`.
///
/// # Safety
/// `T` must be the `extern "C"` function type of the symbol, and the pointer must not be called
/// after `library` is closed.
unsafe fn symbol<T: Copy>(library: &Library, name: &str) -> std::result::Result<T, String> {
    // SAFETY: forwarded from the caller.
    unsafe { library.get::<T>(name.as_bytes()) }
        .map(|sym| *sym)
        .map_err(|e| format!("{name}: {e}"))
}

type FnCounter = unsafe extern "C" fn(*const c_char) -> u64;
type FnInt = unsafe extern "C" fn(c_int);
type FnIntInt = unsafe extern "C" fn(c_int, c_int);
type FnInit = unsafe extern "C" fn(c_uint) -> c_int;
type FnCtxCreate = unsafe extern "C" fn(*mut CUcontext, c_uint, c_int) -> c_int;
type FnCtx = unsafe extern "C" fn(CUcontext) -> c_int;
type FnCtxOut = unsafe extern "C" fn(*mut CUcontext) -> c_int;
type FnCount = unsafe extern "C" fn() -> u64;
type FnText = unsafe extern "C" fn() -> *const c_char;

/// One private instance of the driver stand-in, plus the calls kcache never makes (creating
/// contexts, reading the call counters, the stand-in's switches).
pub struct FakeDriver(PrivateCopy);

impl Default for FakeDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeDriver {
    /// The stand-in installed as a driver is, `libcuda.so.1` linking to `libcuda.so.<build>`
    /// (here a build of 0.0.0).
    pub fn new() -> FakeDriver {
        Self::with_build("0.0.0")
    }

    /// The stand-in as a regular file named `libcuda.so.1`, which names no build.
    pub fn unversioned() -> FakeDriver {
        Self::init(PrivateCopy::new(stand_in_driver_path(), "libcuda.so.1"))
    }

    /// A driver installed as the real one is: the file `libcuda.so.<build>`, loaded through the
    /// link `libcuda.so.1`.
    pub fn with_build(build: &str) -> FakeDriver {
        let file_name = format!("libcuda.so.{build}");
        Self::init(PrivateCopy::linked(
            stand_in_driver_path(),
            &file_name,
            "libcuda.so.1",
        ))
    }

    fn init(copy: PrivateCopy) -> FakeDriver {
        let fake = FakeDriver(copy);
        // SAFETY: cuInit(0) per the driver API.
        assert_eq!(unsafe { fake.0.sym::<FnInit>("cuInit")(0) }, 0);
        fake
    }

    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// kcache's view of this same library instance.
    pub fn driver(&self) -> Arc<Driver> {
        Arc::new(Driver::load_from(&self.0.path).unwrap())
    }

    /// A counter of the stand-in (see the list in fake_cuda.c).
    pub fn counter(&self, name: &str) -> u64 {
        let name = CString::new(name).unwrap();
        // SAFETY: NUL-terminated name.
        let value = unsafe { self.0.sym::<FnCounter>("fakecuda_counter")(name.as_ptr()) };
        assert_ne!(value, u64::MAX, "unknown fake driver counter {name:?}");
        value
    }

    pub fn reject_next_loads(&self, n: i32) {
        // SAFETY: plain value argument.
        unsafe { self.0.sym::<FnInt>("fakecuda_reject_next_loads")(n) }
    }

    /// The next `n` cubin loads fail with `code` (a `CUresult`), as the driver's loads of a
    /// good image do when the device is out of memory or an earlier launch failed.
    pub fn fail_next_loads(&self, n: i32, code: i32) {
        // SAFETY: plain value arguments.
        unsafe { self.0.sym::<FnIntInt>("fakecuda_fail_next_loads")(n, code) }
    }

    /// Lazy loading on or off (off by default; `CUDA_MODULE_LOADING=LAZY` at `cuInit` turns it
    /// on): failures injected by [`FakeDriver::fail_next_loads`] then come from the module's
    /// first `cuModuleGetFunction` instead of the load.
    pub fn lazy_loading(&self, on: bool) {
        // SAFETY: plain value argument.
        unsafe { self.0.sym::<FnInt>("fakecuda_lazy_loading")(c_int::from(on)) }
    }

    /// The CUDA version (`cuDriverGetVersion`, e.g. 13020) this instance reports to drivers
    /// loaded from now on, as a driver of that release would.
    pub fn set_version(&self, version: i32) {
        // SAFETY: plain value argument.
        unsafe { self.0.sym::<FnInt>("fakecuda_set_driver_version")(version) }
    }

    pub fn hold_links(&self, on: bool) {
        // SAFETY: plain value argument.
        unsafe { self.0.sym::<FnInt>("fakecuda_hold_links")(c_int::from(on)) }
    }

    /// A new context on `device`, not left current on this thread.
    pub fn create_context(&self, device: i32) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointers are live locals; the create pushes the context, the pop undoes it.
        unsafe {
            assert_eq!(
                self.0.sym::<FnCtxCreate>("cuCtxCreate_v2")(&mut ctx, 0, device),
                0
            );
            assert_eq!(self.0.sym::<FnCtxOut>("cuCtxPopCurrent_v2")(&mut popped), 0);
        }
        assert_eq!(popped, ctx);
        ctx
    }

    /// # Safety
    /// `ctx` must be a context of this library that [`FakeDriver::create_context`] made; the
    /// stand-in reads it to tell a live context from a destroyed one.
    pub unsafe fn destroy_context(&self, ctx: CUcontext) {
        // SAFETY: a context of this library (the caller's guarantee).
        assert_eq!(unsafe { self.0.sym::<FnCtx>("cuCtxDestroy_v2")(ctx) }, 0);
    }

    /// # Safety
    /// `ctx` must be NULL or a context of this library that [`FakeDriver::create_context`] made.
    pub unsafe fn set_current(&self, ctx: CUcontext) {
        // SAFETY: NULL or a context of this library (the caller's guarantee).
        assert_eq!(unsafe { self.0.sym::<FnCtx>("cuCtxSetCurrent")(ctx) }, 0);
    }

    pub fn current(&self) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer is a live local.
        assert_eq!(
            unsafe { self.0.sym::<FnCtxOut>("cuCtxGetCurrent")(&mut ctx) },
            0
        );
        ctx
    }
}

/// One private instance of the NVRTC stand-in.
pub struct FakeNvrtc(PrivateCopy);

impl Default for FakeNvrtc {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeNvrtc {
    /// The stand-in installed as NVRTC is, `libnvrtc.so` linking to `libnvrtc.so.<build>`
    /// (here 12.4.0).
    pub fn new() -> FakeNvrtc {
        Self::with_build("12.4.0")
    }

    /// The stand-in as the file `libnvrtc.so.<build>`, loaded through the link `libnvrtc.so`.
    pub fn with_build(build: &str) -> FakeNvrtc {
        let file_name = format!("libnvrtc.so.{build}");
        FakeNvrtc(PrivateCopy::linked(
            stand_in_nvrtc_path(),
            &file_name,
            "libnvrtc.so",
        ))
    }

    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// kcache's view of this same library instance.
    pub fn nvrtc(&self) -> Arc<Nvrtc> {
        Arc::new(Nvrtc::load_from(&self.0.path).unwrap())
    }

    pub fn compiles(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { self.0.sym::<FnCount>("fakenvrtc_compiles")() }
    }

    pub fn last_arch(&self) -> String {
        // SAFETY: returns a NUL-terminated static buffer.
        let text = unsafe { self.0.sym::<FnText>("fakenvrtc_last_arch")() };
        // SAFETY: as above.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// The newest architecture `nvrtcGetSupportedArchs` lists (`major * 10 + minor`).
    pub fn set_max_arch(&self, arch: i32) {
        // SAFETY: plain value argument.
        unsafe { self.0.sym::<FnInt>("fakenvrtc_set_max_arch")(arch) }
    }

    pub fn set_version(&self, major: i32, minor: i32) {
        // SAFETY: plain value arguments.
        unsafe { self.0.sym::<FnIntInt>("fakenvrtc_set_version")(major, minor) }
    }
}

/// A pointer that may cross threads in tests (contexts, functions: plain driver handles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle(pub *mut c_void);
// SAFETY: driver handles are valid on any thread.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

type CUdeviceptr = u64;
type FnPrimaryCtxRetain = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> c_int;
type FnPrimaryCtxRelease = unsafe extern "C" fn(CUdevice) -> c_int;
type FnCtxSetCurrent = unsafe extern "C" fn(CUcontext) -> c_int;
type FnMemAlloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> c_int;
type FnMemFree = unsafe extern "C" fn(CUdeviceptr) -> c_int;
type FnMemcpyHtoD = unsafe extern "C" fn(CUdeviceptr, *const c_void, usize) -> c_int;
type FnMemcpyDtoH = unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize) -> c_int;
type FnLaunchKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;
type FnCtxSynchronize = unsafe extern "C" fn() -> c_int;
type CUevent = *mut c_void;
type FnEventCreate = unsafe extern "C" fn(*mut CUevent, c_uint) -> c_int;
type FnEventRecord = unsafe extern "C" fn(CUevent, *mut c_void) -> c_int;
type FnEvent = unsafe extern "C" fn(CUevent) -> c_int;
type FnEventElapsedTime = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> c_int;
type FnModuleLoadDataEx = unsafe extern "C" fn(
    *mut CUmodule,
    *const c_void,
    c_uint,
    *mut c_uint,
    *mut *mut c_void,
) -> c_int;
type FnModuleUnload = unsafe extern "C" fn(CUmodule) -> c_int;

/// The driver entry points a program needs to run a kernel it got from the cache, which kcache
/// itself never calls: resolved from the library `driver` was loaded from, so that they act on
/// the same driver instance.
struct Launch<'a> {
    driver: &'a Driver,
    primary_ctx_retain: FnPrimaryCtxRetain,
    primary_ctx_release: FnPrimaryCtxRelease,
    ctx_set_current: FnCtxSetCurrent,
    mem_alloc: FnMemAlloc,
    mem_free: FnMemFree,
    memcpy_htod: FnMemcpyHtoD,
    memcpy_dtoh: FnMemcpyDtoH,
    launch_kernel: FnLaunchKernel,
    ctx_synchronize: FnCtxSynchronize,
    event_create: FnEventCreate,
    event_record: FnEventRecord,
    event_synchronize: FnEvent,
    event_elapsed_time: FnEventElapsedTime,
    event_destroy: FnEvent,
    module_load_data_ex: FnModuleLoadDataEx,
    module_unload: FnModuleUnload,
    // Holds one more reference to the library the pointers above come from.
    _library: Library,
}

impl Launch<'_> {
    fn new(driver: &Driver) -> Result<Launch<'_>> {
        // SAFETY: `driver` already loaded this library as a CUDA driver, so opening it again
        // runs no initialiser and returns the same instance.
        let library = unsafe { Library::new(driver.path()) }
            .map_err(|e| Error::Unavailable(format!("{}: {e}", driver.path().display())))?;
        let lacks = |e: String| {
            Error::Unavailable(format!(
                "{} lacks the memory and launch entry points: {e}",
                driver.path().display()
            ))
        };
        // SAFETY: each type alias spells the C prototype of the named driver entry point, and
        // `_library` keeps the library open as long as the pointers live.
        unsafe {
            Ok(Launch {
                driver,
                primary_ctx_retain: symbol(&library, "cuDevicePrimaryCtxRetain").map_err(lacks)?,
                primary_ctx_release: symbol(&library, "cuDevicePrimaryCtxRelease_v2")
                    .map_err(lacks)?,
                ctx_set_current: symbol(&library, "cuCtxSetCurrent").map_err(lacks)?,
                mem_alloc: symbol(&library, "cuMemAlloc_v2").map_err(lacks)?,
                mem_free: symbol(&library, "cuMemFree_v2").map_err(lacks)?,
                memcpy_htod: symbol(&library, "cuMemcpyHtoD_v2").map_err(lacks)?,
                memcpy_dtoh: symbol(&library, "cuMemcpyDtoH_v2").map_err(lacks)?,
                launch_kernel: symbol(&library, "cuLaunchKernel").map_err(lacks)?,
                ctx_synchronize: symbol(&library, "cuCtxSynchronize").map_err(lacks)?,
                event_create: symbol(&library, "cuEventCreate").map_err(lacks)?,
                event_record: symbol(&library, "cuEventRecord").map_err(lacks)?,
                event_synchronize: symbol(&library, "cuEventSynchronize").map_err(lacks)?,
                event_elapsed_time: symbol(&library, "cuEventElapsedTime").map_err(lacks)?,
                // cuda.h: #define cuEventDestroy cuEventDestroy_v2
                event_destroy: symbol(&library, "cuEventDestroy_v2").map_err(lacks)?,
                module_load_data_ex: symbol(&library, "cuModuleLoadDataEx").map_err(lacks)?,
                module_unload: symbol(&library, "cuModuleUnload").map_err(lacks)?,
                _library: library,
            })
        }
    }

    fn check(&self, what: &str, status: c_int) -> Result<()> {
        if status == 0 {
            Ok(())
        } else {
            Err(Error::Backend(format!(
                "{what} failed: {}",
                self.driver.describe(status)
            )))
        }
    }

    fn mem_alloc(&self, bytes: usize) -> Result<CUdeviceptr> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: the out-pointer is a live local.
        let status = unsafe { (self.mem_alloc)(&mut ptr, bytes) };
        self.check("cuMemAlloc", status)?;
        Ok(ptr)
    }

    /// `cuCtxSetCurrent`: binds `ctx` (or nothing, for NULL) to the calling thread.
    ///
    /// # Safety
    /// `ctx` must be NULL or a live context of this driver.
    unsafe fn set_current_context(&self, ctx: CUcontext) -> Result<()> {
        // SAFETY: the caller guarantees `ctx` is NULL or live.
        let status = unsafe { (self.ctx_set_current)(ctx) };
        self.check("cuCtxSetCurrent", status)
    }

    /// # Safety
    /// `ptr` must come from [`Launch::mem_alloc`] and be freed once.
    unsafe fn mem_free(&self, ptr: CUdeviceptr) -> Result<()> {
        // SAFETY: guaranteed by the caller.
        let status = unsafe { (self.mem_free)(ptr) };
        self.check("cuMemFree", status)
    }

    /// A new event in the current context (`cuEventCreate`, default flags: timing on).
    fn event(&self) -> Result<CUevent> {
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local; flags 0 is CU_EVENT_DEFAULT.
        let status = unsafe { (self.event_create)(&mut event, 0) };
        self.check("cuEventCreate", status)?;
        Ok(event)
    }

    /// The device's milliseconds between two events recorded on the default stream
    /// (`cuEventSynchronize` on `end`, then `cuEventElapsedTime`).
    ///
    /// # Safety
    /// `start` and `end` must be live events of the current context, both recorded.
    unsafe fn elapsed(&self, start: CUevent, end: CUevent) -> Result<f64> {
        // SAFETY: live, recorded events (the caller's guarantee).
        let status = unsafe { (self.event_synchronize)(end) };
        self.check("cuEventSynchronize", status)?;
        let mut ms = 0f32;
        // SAFETY: as above; the out-pointer is a live local.
        let status = unsafe { (self.event_elapsed_time)(&mut ms, start, end) };
        self.check("cuEventElapsedTime", status)?;
        Ok(f64::from(ms))
    }

    /// # Safety
    /// `event` must come from [`Launch::event`] and be destroyed once.
    unsafe fn destroy_event(&self, event: CUevent) -> Result<()> {
        // SAFETY: guaranteed by the caller.
        let status = unsafe { (self.event_destroy)(event) };
        self.check("cuEventDestroy", status)
    }

    /// `cuModuleLoadDataEx` into the current context, bypassing any cache: a cubin, a fatbin,
    /// or NUL-terminated PTX, which the driver JIT-compiles (through CUDA's own JIT cache unless
    /// `CUDA_CACHE_DISABLE=1`). Unload it with [`Launch::unload_module`].
    fn load_module(&self, image: &[u8]) -> Result<CUmodule> {
        let mut module: CUmodule = std::ptr::null_mut();
        // No JIT options: a count of zero, and neither the option nor the value array.
        let (options, values) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: `image` is readable for its whole length; the driver parses the ELF header
        // (or reads PTX up to its NUL) to find the size.
        let status = unsafe {
            (self.module_load_data_ex)(&mut module, image.as_ptr().cast(), 0, options, values)
        };
        self.check("cuModuleLoadDataEx", status)?;
        Ok(module)
    }

    /// `cuModuleUnload` of a module from [`Launch::load_module`].
    ///
    /// # Safety
    /// `module` must be live, loaded in the current context, and not used afterwards.
    unsafe fn unload_module(&self, module: CUmodule) -> Result<()> {
        // SAFETY: guaranteed by the caller.
        let status = unsafe { (self.module_unload)(module) };
        self.check("cuModuleUnload", status)
    }
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
        let launch = Launch::new(driver)?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        let status = unsafe { (launch.primary_ctx_retain)(&mut context, device) };
        launch.check("cuDevicePrimaryCtxRetain", status)?;
        // SAFETY: retained just above, so live; released only by `release`, after unbinding.
        unsafe { launch.set_current_context(context) }?;
        Ok(PrimaryContext {
            driver: Arc::clone(driver),
            device,
        })
    }

    /// Unbinds the context from this thread, then releases it; the first error wins.
    pub fn release(self) -> Result<()> {
        let launch = Launch::new(&self.driver)?;
        // SAFETY: NULL binds no context.
        let unbound = unsafe { launch.set_current_context(std::ptr::null_mut()) };
        // SAFETY: `bind` took the retain this gives back, and the context is no longer current
        // here; whoever loaded modules in it has dropped them before releasing (documented).
        let status = unsafe { (launch.primary_ctx_release)(self.device) };
        unbound.and(launch.check("cuDevicePrimaryCtxRelease", status))
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
    launch: Launch<'a>,
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
        Self::leased(cache, lease)
    }

    /// The module of a lease `cache` gave for [`SAXPY_PTX`] or [`SAXPY_CUDA`] (the caller's
    /// word: the kernel's parameters are taken to be saxpy's). Resolves the launch entry points,
    /// which takes a `dlopen`: keep it out of timed lookups.
    pub fn leased(cache: &CudaCache, lease: ModuleLease) -> Result<Saxpy<'_>> {
        Ok(Saxpy {
            launch: Launch::new(cache.driver())?,
            context: lease.context(),
            module: Loaded::Leased(lease),
        })
    }

    /// `cuModuleLoadDataEx` on [`SAXPY_PTX`] in the current context, without kcache: the driver
    /// JIT-compiles it (through CUDA's own JIT cache unless `CUDA_CACHE_DISABLE=1`).
    pub fn load(driver: &Driver) -> Result<Saxpy<'_>> {
        let launch = Launch::new(driver)?;
        let context = driver.current_context()?;
        let mut image = SAXPY_PTX.as_bytes().to_vec();
        image.push(0);
        let module = launch.load_module(&image)?;
        Ok(Saxpy {
            launch,
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
        if self.launch.driver.current_context()? == self.context {
            Ok(())
        } else {
            Err(Error::InvalidArgument(
                "the saxpy module's context is not current".into(),
            ))
        }
    }

    /// `cuModuleGetFunction` for the kernel, with the module's context current on this thread.
    /// Under lazy loading (the Linux default since CUDA 12.2) this is where the driver loads
    /// the kernel onto the device, so a timing of "getting a module" includes it.
    pub fn function(&self) -> Result<CUfunction> {
        self.check_current()?;
        match &self.module {
            Loaded::Leased(lease) => lease.function("saxpy"),
            // SAFETY: loaded by `load` in the current context (checked above), and unloaded only
            // by `unload`, which consumes `self`.
            Loaded::Owned(module) => {
                unsafe { self.launch.driver.function(*module, "saxpy") }?.ok_or(Error::NotFound)
            }
        }
    }

    /// Runs the kernel over `x` and `y` (the same, non-zero length) with the module's context
    /// current on this thread, and returns the new `y`.
    pub fn run(&self, a: f32, x: &[f32], y: &[f32]) -> Result<Vec<f32>> {
        self.run_rounds(a, x, y, 1).map(|(out, _)| out)
    }

    /// The kernel's own time, in milliseconds per launch: `rounds` launches over `x` and `y`
    /// (one warm-up launch before) between two CUDA events on the default stream, so the
    /// figure is the device's time for the code the module holds, whatever made it, without
    /// the host's launch overhead; `y`'s result is not checked (see [`Saxpy::run`]).
    pub fn kernel_time(&self, x: &[f32], y: &[f32], rounds: u32) -> Result<f64> {
        if rounds == 0 {
            return Err(Error::InvalidArgument("no rounds to time".into()));
        }
        let (_, elapsed) = self.run_rounds(1.0, x, y, rounds)?;
        Ok(elapsed / f64::from(rounds))
    }

    /// [`Saxpy::launch`] on device copies of `x` and `y`, freed afterwards.
    fn run_rounds(&self, a: f32, x: &[f32], y: &[f32], rounds: u32) -> Result<(Vec<f32>, f64)> {
        let n = u32::try_from(x.len())
            .ok()
            .filter(|&n| n > 0 && x.len() == y.len())
            .ok_or_else(|| {
                Error::InvalidArgument("x and y need one equal, non-zero length".into())
            })?;
        let function = self.function()?;
        let launch = &self.launch;
        let bytes = size_of_val(x);
        let dx = launch.mem_alloc(bytes)?;
        let out = launch.mem_alloc(bytes).and_then(|dy| {
            // SAFETY: `function` is the saxpy kernel of this module, live in the current
            // context; `dx` and `dy` were allocated above with `n` floats each.
            let out = unsafe { self.launch(function, n, a, (dx, x), (dy, y), rounds) };
            // SAFETY: allocated above, freed once.
            let freed = unsafe { launch.mem_free(dy) };
            let out = out?;
            freed.map(|()| out)
        });
        // SAFETY: allocated above, freed once.
        let freed = unsafe { launch.mem_free(dx) };
        let out = out?;
        freed?;
        Ok(out)
    }

    /// Copies `x` and `y` to their device buffers, runs the kernel `rounds` times (after one
    /// warm-up launch when `rounds > 1`), and returns the new `y` and the device's milliseconds
    /// between an event recorded before the first timed launch and one after the last.
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
        rounds: u32,
    ) -> Result<(Vec<f32>, f64)> {
        let l = &self.launch;
        let to_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_ne_bytes()).collect() };
        let (x, y) = (to_bytes(x), to_bytes(y));
        let mut out = vec![0u8; y.len()];
        let elapsed;
        // SAFETY: the buffers hold `n` floats, as long as `x`, `y` and `out` (the caller's
        // guarantee, with `n` their length); the kernel's parameters are (u32 n, f32 a,
        // f32 *x, f32 *y), passed as pointers to locals of those types that outlive the
        // synchronous launch, on the default stream, with no shared memory or extra arguments.
        unsafe {
            l.check(
                "cuMemcpyHtoD",
                (l.memcpy_htod)(dx, x.as_ptr().cast(), x.len()),
            )?;
            l.check(
                "cuMemcpyHtoD",
                (l.memcpy_htod)(dy, y.as_ptr().cast(), y.len()),
            )?;
            let (mut n_arg, mut a_arg, mut x_arg, mut y_arg) = (n, a, dx, dy);
            let mut params: [*mut c_void; 4] = [
                (&raw mut n_arg).cast(),
                (&raw mut a_arg).cast(),
                (&raw mut x_arg).cast(),
                (&raw mut y_arg).cast(),
            ];
            let mut launch_once = || {
                let status = (l.launch_kernel)(
                    saxpy,
                    n.div_ceil(256),
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                );
                l.check("cuLaunchKernel", status)
            };
            if rounds > 1 {
                launch_once()?;
                l.check("cuCtxSynchronize", (l.ctx_synchronize)())?;
            }
            let start = l.event()?;
            let timed = l.event().and_then(|end| {
                let stream = std::ptr::null_mut(); // the default stream, the launches'
                let timed = l
                    .check("cuEventRecord", (l.event_record)(start, stream))
                    .and_then(|()| (0..rounds).try_for_each(|_| launch_once()))
                    .and_then(|()| l.check("cuEventRecord", (l.event_record)(end, stream)))
                    .and_then(|()| l.elapsed(start, end));
                let destroyed = l.destroy_event(end);
                timed.and_then(|ms| destroyed.map(|()| ms))
            });
            let destroyed = l.destroy_event(start);
            elapsed = timed?;
            destroyed?;
            l.check("cuCtxSynchronize", (l.ctx_synchronize)())?;
            let status = (l.memcpy_dtoh)(out.as_mut_ptr().cast(), dy, out.len());
            l.check("cuMemcpyDtoH", status)?;
        }
        let out = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok((out, elapsed))
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
        unsafe { self.launch.unload_module(*module) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The launch entry points resolve from the driver kcache loaded, and report the driver's
    /// error through kcache's description of it.
    #[test]
    fn device_memory_needs_a_current_context() {
        let fake = FakeDriver::new();
        let driver = fake.driver();
        assert!(driver.current_context().unwrap().is_null());
        let launch = Launch::new(&driver).unwrap();
        match launch.mem_alloc(16) {
            Err(Error::Backend(message)) => assert!(
                message.contains("cuMemAlloc failed: invalid device context"),
                "{message}"
            ),
            other => panic!("expected a backend error without a context, got {other:?}"),
        }
    }
}
