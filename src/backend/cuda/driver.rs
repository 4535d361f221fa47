//! The slice of the CUDA driver API that kcache uses, resolved at run time from `libcuda.so.1`
//! (or the library named by `KCACHE_CUDA_LIBRARY`).
//!
//! kcache has no link dependency on CUDA: a machine without a driver loads `libkcache.so` fine
//! and every CUDA call returns [`Error::Unavailable`]. The entry points are the versioned names
//! the driver exports (`cuLinkCreate_v2`, `cuCtxPushCurrent_v2`, …), not the `cuda.h` macros.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

use super::build_id::loaded_build;
use crate::backend::library::{self, RuntimeLibrary};
use crate::error::{Error, Result};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;

// Only this file speaks to the driver: the names below never leave it.
type CUlinkState = *mut c_void;

const CUDA_SUCCESS: CUresult = 0;
const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
const CUDA_ERROR_NOT_FOUND: CUresult = 500;

const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;

const CU_JIT_INFO_LOG_BUFFER: c_uint = 3;
const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: c_uint = 4;
const CU_JIT_ERROR_LOG_BUFFER: c_uint = 5;
const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_uint = 6;
const CU_JIT_INPUT_PTX: c_uint = 1;

/// The library kcache loads when `KCACHE_CUDA_LIBRARY` is unset.
pub const DEFAULT_LIBRARY: &str = "libcuda.so.1";
/// Names another driver library (a path or a soname).
pub const LIBRARY_ENV: &str = "KCACHE_CUDA_LIBRARY";

type FnInit = unsafe extern "C" fn(c_uint) -> CUresult;
type FnDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> CUresult;
type FnDeviceGet = unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult;
type FnDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult;
type FnDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult;
type FnCtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
type FnCtxPushCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
type FnCtxPopCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
type FnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
type FnLinkCreate =
    unsafe extern "C" fn(c_uint, *mut c_uint, *mut *mut c_void, *mut CUlinkState) -> CUresult;
type FnLinkAddData = unsafe extern "C" fn(
    CUlinkState,
    c_uint,
    *mut c_void,
    usize,
    *const c_char,
    c_uint,
    *mut c_uint,
    *mut *mut c_void,
) -> CUresult;
type FnLinkComplete = unsafe extern "C" fn(CUlinkState, *mut *mut c_void, *mut usize) -> CUresult;
type FnLinkDestroy = unsafe extern "C" fn(CUlinkState) -> CUresult;
type FnModuleLoadDataEx = unsafe extern "C" fn(
    *mut CUmodule,
    *const c_void,
    c_uint,
    *mut c_uint,
    *mut *mut c_void,
) -> CUresult;
type FnModuleUnload = unsafe extern "C" fn(CUmodule) -> CUresult;
type FnModuleGetFunction =
    unsafe extern "C" fn(*mut CUfunction, CUmodule, *const c_char) -> CUresult;
type FnGetErrorString = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;

/// A loaded CUDA driver. Holds the library open for as long as it lives; share it via `Arc`.
pub struct Driver {
    path: PathBuf,
    version: i32,
    build: String,
    init: FnInit,
    driver_get_version: FnDriverGetVersion,
    device_get: FnDeviceGet,
    device_get_name: FnDeviceGetName,
    device_get_attribute: FnDeviceGetAttribute,
    ctx_get_current: FnCtxGetCurrent,
    ctx_push_current: FnCtxPushCurrent,
    ctx_pop_current: FnCtxPopCurrent,
    ctx_get_device: FnCtxGetDevice,
    link_create: FnLinkCreate,
    link_add_data: FnLinkAddData,
    link_complete: FnLinkComplete,
    link_destroy: FnLinkDestroy,
    module_load_data_ex: FnModuleLoadDataEx,
    module_unload: FnModuleUnload,
    module_get_function: FnModuleGetFunction,
    get_error_string: FnGetErrorString,
}

debug_fields!(Driver {
    path,
    version,
    build,
    ..
});

impl Driver {
    /// Loads the driver named by `KCACHE_CUDA_LIBRARY`, else `libcuda.so.1`.
    pub fn load() -> Result<Self> {
        match library::from_env(LIBRARY_ENV) {
            Some(path) => Self::load_from(Path::new(&path)),
            None => Self::load_from(Path::new(DEFAULT_LIBRARY)),
        }
    }

    /// Loads the driver library at `path` (a path, or a soname searched the usual dlopen way)
    /// and initialises it with `cuInit(0)`.
    pub fn load_from(path: &Path) -> Result<Self> {
        let library = RuntimeLibrary::open("CUDA driver", path)?;
        // SAFETY: each type alias spells the C prototype of the named entry point as published
        // in the CUDA driver API.
        let driver = unsafe {
            Driver {
                path: path.to_path_buf(),
                version: 0,
                build: String::new(),
                init: library.symbol("cuInit")?,
                driver_get_version: library.symbol("cuDriverGetVersion")?,
                device_get: library.symbol("cuDeviceGet")?,
                device_get_name: library.symbol("cuDeviceGetName")?,
                device_get_attribute: library.symbol("cuDeviceGetAttribute")?,
                ctx_get_current: library.symbol("cuCtxGetCurrent")?,
                ctx_push_current: library.symbol("cuCtxPushCurrent_v2")?,
                ctx_pop_current: library.symbol("cuCtxPopCurrent_v2")?,
                ctx_get_device: library.symbol("cuCtxGetDevice")?,
                link_create: library.symbol("cuLinkCreate_v2")?,
                link_add_data: library.symbol("cuLinkAddData_v2")?,
                link_complete: library.symbol("cuLinkComplete")?,
                link_destroy: library.symbol("cuLinkDestroy")?,
                module_load_data_ex: library.symbol("cuModuleLoadDataEx")?,
                module_unload: library.symbol("cuModuleUnload")?,
                module_get_function: library.symbol("cuModuleGetFunction")?,
                get_error_string: library.symbol("cuGetErrorString")?,
            }
        };
        // Never closed: after cuInit the driver runs its own threads and exit handlers, which
        // must not outlive its code. Each `Driver` keeps one dlopen reference for good.
        library.keep_open();
        driver.finish_init()
    }

    fn finish_init(mut self) -> Result<Self> {
        // SAFETY: cuInit takes a flags word that must be 0.
        let status = unsafe { (self.init)(0) };
        if status != CUDA_SUCCESS {
            return Err(Error::Unavailable(format!(
                "no usable CUDA driver: cuInit failed in {}: {}",
                self.path.display(),
                self.describe(status)
            )));
        }
        let mut version: c_int = 0;
        // SAFETY: the out-pointer is a live local.
        let status = unsafe { (self.driver_get_version)(&mut version) };
        self.check("cuDriverGetVersion", status)?;
        self.version = version;
        self.build = loaded_build(self.init as *const c_void, &self.path, "CUDA driver");
        Ok(self)
    }

    /// The library this driver was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cuDriverGetVersion`, e.g. 12040 for CUDA 12.4: the CUDA release the driver supports,
    /// the same for every driver build of that release.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The driver build: the real file name of the loaded library (`libcuda.so.1` is a link to
    /// `libcuda.so.<build>`, e.g. `libcuda.so.550.54.15`; a file that names no build has its
    /// size and a digest of its content added). A driver update changes it, and with it the PTX JIT, so
    /// the disk key holds it.
    pub fn build(&self) -> &str {
        &self.build
    }

    /// The driver's name for `status` (`cuGetErrorString`), with the numeric code.
    pub fn describe(&self, status: CUresult) -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: the out-pointer is a live local; the driver writes a pointer to a static
        // string or leaves it NULL for an unknown code.
        let known = unsafe { (self.get_error_string)(status, &mut text) } == CUDA_SUCCESS;
        if known && !text.is_null() {
            // SAFETY: the driver returned a NUL-terminated static string.
            let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
            format!("{text} (CUresult {status})")
        } else {
            format!("CUresult {status}")
        }
    }

    pub(crate) fn check(&self, what: &str, status: CUresult) -> Result<()> {
        if status == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(what, status))
        }
    }

    fn error(&self, what: &str, status: CUresult) -> Error {
        Error::Backend(format!("{what} failed: {}", self.describe(status)))
    }

    /// `cuDeviceGet`.
    pub fn device(&self, ordinal: i32) -> Result<CUdevice> {
        let mut device: CUdevice = 0;
        // SAFETY: the out-pointer is a live local.
        let status = unsafe { (self.device_get)(&mut device, ordinal) };
        self.check("cuDeviceGet", status)?;
        Ok(device)
    }

    /// `cuDeviceGetName`.
    pub fn device_name(&self, device: CUdevice) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL included, into `buf`.
        let status =
            unsafe { (self.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, device) };
        self.check("cuDeviceGetName", status)?;
        // The driver NUL-terminates within `len`; the last byte stays 0 regardless.
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` holds a NUL byte at the latest at its last position.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Compute capability `(major, minor)` of `device`.
    pub fn compute_capability(&self, device: CUdevice) -> Result<(i32, i32)> {
        let attr = |which: c_int| -> Result<i32> {
            let mut value: c_int = 0;
            // SAFETY: the out-pointer is a live local.
            let status = unsafe { (self.device_get_attribute)(&mut value, which, device) };
            self.check("cuDeviceGetAttribute", status)?;
            Ok(value)
        };
        Ok((
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// The calling thread's current context (NULL when none).
    pub fn current_context(&self) -> Result<CUcontext> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        let status = unsafe { (self.ctx_get_current)(&mut ctx) };
        self.check("cuCtxGetCurrent", status)?;
        Ok(ctx)
    }

    /// Runs `f` with `ctx` current on this thread, restoring the previous binding afterwards.
    /// Skips the push/pop when `ctx` already is current, which is the common case on a
    /// caller's launch thread.
    ///
    /// # Safety
    /// `ctx` must be a live context of this driver.
    pub unsafe fn with_context<T>(&self, ctx: CUcontext, f: impl FnOnce() -> T) -> Result<T> {
        // SAFETY: forwarded from the caller.
        unsafe { self.scoped(ctx, f) }.map_err(|(what, code)| self.error(what, code))
    }

    /// [`Driver::with_context`] keeping the failing call and its `CUresult`, for callers that
    /// report them as a build or destroy code.
    ///
    /// A failing pop after `f` ran is reported as an error and drops `f`'s result: it can only
    /// happen when something else unbalanced this thread's context stack inside `f`.
    ///
    /// # Safety
    /// `ctx` must be a live context of this driver.
    pub(crate) unsafe fn scoped<T>(
        &self,
        ctx: CUcontext,
        f: impl FnOnce() -> T,
    ) -> std::result::Result<T, (&'static str, CUresult)> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        let status = unsafe { (self.ctx_get_current)(&mut current) };
        if status != CUDA_SUCCESS {
            return Err(("cuCtxGetCurrent", status));
        }
        if current == ctx {
            return Ok(f());
        }
        // SAFETY: the caller guarantees `ctx` is live.
        let status = unsafe { (self.ctx_push_current)(ctx) };
        if status != CUDA_SUCCESS {
            return Err(("cuCtxPushCurrent", status));
        }
        let out = f();
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: we pushed one context above; the out-pointer is a live local.
        let status = unsafe { (self.ctx_pop_current)(&mut popped) };
        if status != CUDA_SUCCESS {
            return Err(("cuCtxPopCurrent", status));
        }
        Ok(out)
    }

    /// The device of the context current on this thread.
    pub fn current_device(&self) -> Result<CUdevice> {
        let mut device: CUdevice = 0;
        // SAFETY: the out-pointer is a live local.
        let status = unsafe { (self.ctx_get_device)(&mut device) };
        self.check("cuCtxGetDevice", status)?;
        Ok(device)
    }

    /// Links PTX into a cubin for the current context's device. A PTX or link error comes back
    /// as `Err((CUresult, error log))`. The JIT's information log (what `CU_JIT_LOG_VERBOSE`
    /// asks for) goes to kcache's log at `info`.
    pub(crate) fn link_ptx(
        &self,
        ptx: &[u8],
        options: &[(c_uint, usize)],
    ) -> std::result::Result<Vec<u8>, (CUresult, String)> {
        // The driver reads PTX as a C string.
        let mut ptx_z = Vec::with_capacity(ptx.len() + 1);
        ptx_z.extend_from_slice(ptx);
        if ptx_z.last() != Some(&0) {
            ptx_z.push(0);
        }
        let mut log = vec![0u8; 16 * 1024];
        let mut info = vec![0u8; 16 * 1024];
        let mut keys: Vec<c_uint> = options.iter().map(|&(k, _)| k).collect();
        let mut values: Vec<*mut c_void> = options.iter().map(|&(_, v)| v as *mut c_void).collect();
        for (buffer, size, bytes) in [
            (
                CU_JIT_ERROR_LOG_BUFFER,
                CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                &mut log,
            ),
            (
                CU_JIT_INFO_LOG_BUFFER,
                CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                &mut info,
            ),
        ] {
            keys.extend([buffer, size]);
            values.extend([bytes.as_mut_ptr().cast(), bytes.len() as *mut c_void]);
        }

        let mut state: CUlinkState = std::ptr::null_mut();
        // SAFETY: the option arrays have `keys.len()` entries and outlive the link state,
        // which reads the log buffer pointers until cuLinkDestroy below.
        let status = unsafe {
            (self.link_create)(
                keys.len() as c_uint,
                keys.as_mut_ptr(),
                values.as_mut_ptr(),
                &mut state,
            )
        };
        if status != CUDA_SUCCESS {
            return Err((
                status,
                format!("cuLinkCreate failed: {}", self.describe(status)),
            ));
        }
        let name = c"kernel.ptx";
        // SAFETY: `ptx_z` is NUL-terminated and its length is passed; no per-input options.
        let mut status = unsafe {
            (self.link_add_data)(
                state,
                CU_JIT_INPUT_PTX,
                ptx_z.as_mut_ptr().cast(),
                ptx_z.len(),
                name.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        let mut cubin = Vec::new();
        if status == CUDA_SUCCESS {
            let mut data: *mut c_void = std::ptr::null_mut();
            let mut size: usize = 0;
            // SAFETY: the out-pointers are live locals; the cubin stays owned by `state`.
            status = unsafe { (self.link_complete)(state, &mut data, &mut size) };
            if status == CUDA_SUCCESS && !data.is_null() {
                // SAFETY: the driver returned `size` readable bytes at `data`, valid until
                // cuLinkDestroy; we copy them out before that.
                cubin = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }.to_vec();
            }
        }
        // SAFETY: `state` came from cuLinkCreate and is destroyed exactly once.
        unsafe { (self.link_destroy)(state) };
        if status != CUDA_SUCCESS {
            let text = log_text(&mut log);
            let detail = if text.trim().is_empty() {
                self.describe(status)
            } else {
                format!("{}: {}", self.describe(status), text.trim_end())
            };
            return Err((status, detail));
        }
        if cubin.is_empty() {
            return Err((status, "cuLinkComplete returned an empty image".into()));
        }
        let info = log_text(&mut info);
        if !info.trim().is_empty() {
            crate::log::info(|| format!("JIT information log: {}", info.trim_end()));
        }
        Ok(cubin)
    }

    /// Loads a cubin (or any image the driver accepts) into the current context. An empty
    /// image is `CUDA_ERROR_INVALID_IMAGE` without a driver call: cuModuleLoadDataEx takes no
    /// size and would read a header from the empty buffer's dangling pointer.
    pub(crate) fn load_image(&self, image: &[u8]) -> std::result::Result<CUmodule, CUresult> {
        if image.is_empty() {
            return Err(CUDA_ERROR_INVALID_IMAGE);
        }
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is readable for its whole length; the driver parses the ELF header
        // to find the size. No JIT options are passed.
        let status = unsafe {
            (self.module_load_data_ex)(
                &mut module,
                image.as_ptr().cast(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if status == CUDA_SUCCESS {
            Ok(module)
        } else {
            Err(status)
        }
    }

    /// `cuModuleUnload` in the current context.
    ///
    /// # Safety
    /// `module` must be a live module of the current context, unloaded at most once.
    pub(crate) unsafe fn unload(&self, module: CUmodule) -> CUresult {
        // SAFETY: guaranteed by the caller.
        unsafe { (self.module_unload)(module) }
    }

    /// `cuModuleGetFunction`; `Ok(None)` when the module has no such kernel.
    ///
    /// # Safety
    /// `module` must be a live module of this driver.
    pub unsafe fn function(&self, module: CUmodule, name: &str) -> Result<Option<CUfunction>> {
        let name = CString::new(name)
            .map_err(|_| Error::InvalidArgument("kernel name contains a NUL byte".into()))?;
        let mut function: CUfunction = std::ptr::null_mut();
        // SAFETY: `module` is live per the caller; `name` is NUL-terminated; the out-pointer is
        // a live local.
        let status = unsafe { (self.module_get_function)(&mut function, module, name.as_ptr()) };
        if status == CUDA_ERROR_NOT_FOUND {
            return Ok(None);
        }
        self.check("cuModuleGetFunction", status)?;
        Ok(Some(function))
    }
}

/// The text a JIT log buffer holds, up to its NUL (the last byte is made one).
fn log_text(log: &mut [u8]) -> String {
    if let Some(last) = log.last_mut() {
        *last = 0;
    }
    CStr::from_bytes_until_nul(log)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}
