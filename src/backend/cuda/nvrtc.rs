//! NVRTC, CUDA's run-time compiler, resolved at run time: CUDA C++ source in, PTX out. Optional:
//! kcache only loads it for
//! [`CudaCache::find_or_build_source`](super::CudaCache::find_or_build_source).

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};

use crate::backend::library::{self, RuntimeLibrary};
use crate::error::{BuildError, Error, Result};

type NvrtcResult = c_int;
type NvrtcProgram = *mut std::ffi::c_void;

const NVRTC_SUCCESS: NvrtcResult = 0;

/// Names another NVRTC library (a path or a soname).
pub const LIBRARY_ENV: &str = "KCACHE_NVRTC_LIBRARY";
/// Tried in order when `KCACHE_NVRTC_LIBRARY` is unset: the development link, then the
/// sonames of the CUDA releases that ship NVRTC as a separate library.
pub const DEFAULT_LIBRARIES: [&str; 4] = [
    "libnvrtc.so",
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
];

type FnGetErrorString = unsafe extern "C" fn(NvrtcResult) -> *const c_char;
type FnVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult;
type FnCreateProgram = unsafe extern "C" fn(
    *mut NvrtcProgram,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> NvrtcResult;
type FnDestroyProgram = unsafe extern "C" fn(*mut NvrtcProgram) -> NvrtcResult;
type FnCompileProgram =
    unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> NvrtcResult;
type FnGetSize = unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult;
type FnGetBytes = unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult;

/// A loaded NVRTC. Share it via `Arc`.
pub struct Nvrtc {
    path: PathBuf,
    version: (i32, i32),
    get_error_string: FnGetErrorString,
    create_program: FnCreateProgram,
    destroy_program: FnDestroyProgram,
    compile_program: FnCompileProgram,
    get_ptx_size: FnGetSize,
    get_ptx: FnGetBytes,
    get_log_size: FnGetSize,
    get_log: FnGetBytes,
    // Last so that every function pointer above is dropped before the library is closed.
    _library: RuntimeLibrary,
}

debug_fields!(Nvrtc { path, version, .. });

impl Nvrtc {
    /// Loads the library named by `KCACHE_NVRTC_LIBRARY`, else the first of
    /// [`DEFAULT_LIBRARIES`] that loads.
    pub fn load() -> Result<Self> {
        if let Some(path) = library::from_env(LIBRARY_ENV) {
            return Self::load_from(Path::new(&path));
        }
        let mut reasons = Vec::new();
        for name in DEFAULT_LIBRARIES {
            match Self::load_from(Path::new(name)) {
                Ok(nvrtc) => return Ok(nvrtc),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        Err(Error::Unavailable(format!(
            "no NVRTC library: {}",
            reasons.join("; ")
        )))
    }

    /// Loads NVRTC from `path` (a path, or a soname searched the usual dlopen way).
    pub fn load_from(path: &Path) -> Result<Self> {
        let library = RuntimeLibrary::open("NVRTC", path)?;
        // SAFETY: each type alias spells the C prototype of the named NVRTC entry point.
        let (version_fn, nvrtc) = unsafe {
            let version_fn: FnVersion = library.symbol("nvrtcVersion")?;
            let nvrtc = Nvrtc {
                path: path.to_path_buf(),
                version: (0, 0),
                get_error_string: library.symbol("nvrtcGetErrorString")?,
                create_program: library.symbol("nvrtcCreateProgram")?,
                destroy_program: library.symbol("nvrtcDestroyProgram")?,
                compile_program: library.symbol("nvrtcCompileProgram")?,
                get_ptx_size: library.symbol("nvrtcGetPTXSize")?,
                get_ptx: library.symbol("nvrtcGetPTX")?,
                get_log_size: library.symbol("nvrtcGetProgramLogSize")?,
                get_log: library.symbol("nvrtcGetProgramLog")?,
                _library: library,
            };
            (version_fn, nvrtc)
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: out-pointers are live locals.
        let status = unsafe { version_fn(&mut major, &mut minor) };
        if status != NVRTC_SUCCESS {
            return Err(Error::Unavailable(format!(
                "nvrtcVersion failed in {}: {}",
                path.display(),
                nvrtc.describe(status)
            )));
        }
        Ok(Nvrtc {
            version: (major, minor),
            ..nvrtc
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `nvrtcVersion`: (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    fn describe(&self, status: NvrtcResult) -> String {
        // SAFETY: returns a static string for any value (or NULL in old releases).
        let text = unsafe { (self.get_error_string)(status) };
        if text.is_null() {
            format!("nvrtcResult {status}")
        } else {
            // SAFETY: a NUL-terminated static string.
            let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
            format!("{text} (nvrtcResult {status})")
        }
    }

    /// Compiles CUDA C++ `source` to PTX. A compile error is a [`BuildError`] with the
    /// `nvrtcResult` as its code and the compiler log as its message.
    pub fn compile(
        &self,
        source: &str,
        options: &[&str],
    ) -> std::result::Result<Vec<u8>, BuildError> {
        let invalid = |what: &str| BuildError::new(-1, format!("{what} contains a NUL byte"));
        let source = CString::new(source).map_err(|_| invalid("the CUDA source"))?;
        let options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(*o).map_err(|_| invalid("an NVRTC option")))
            .collect::<std::result::Result<_, _>>()?;
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let fail = |what: &str, status| {
            BuildError::new(status, format!("{what} failed: {}", self.describe(status)))
        };

        let mut program: NvrtcProgram = std::ptr::null_mut();
        // SAFETY: `source` and the name are NUL-terminated; no headers.
        let status = unsafe {
            (self.create_program)(
                &mut program,
                source.as_ptr(),
                c"kcache.cu".as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if status != NVRTC_SUCCESS {
            return Err(fail("nvrtcCreateProgram", status));
        }
        let out = self.compile_program(program, &option_ptrs, fail);
        // SAFETY: `program` came from nvrtcCreateProgram and is destroyed once.
        unsafe { (self.destroy_program)(&mut program) };
        out
    }

    fn compile_program(
        &self,
        program: NvrtcProgram,
        options: &[*const c_char],
        fail: impl Fn(&str, NvrtcResult) -> BuildError,
    ) -> std::result::Result<Vec<u8>, BuildError> {
        // SAFETY: `program` is live; `options` holds valid C strings that outlive the call.
        let status =
            unsafe { (self.compile_program)(program, options.len() as c_int, options.as_ptr()) };
        if status != NVRTC_SUCCESS {
            let log = self.read(program, self.get_log_size, self.get_log);
            let log = log.map(|l| {
                String::from_utf8_lossy(&l)
                    .trim_end_matches(['\0', ' ', '\n', '\r', '\t'])
                    .to_owned()
            });
            return Err(BuildError::new(
                status,
                match log {
                    Ok(log) if !log.is_empty() => format!("{}: {log}", self.describe(status)),
                    _ => self.describe(status),
                },
            ));
        }
        let mut ptx = self
            .read(program, self.get_ptx_size, self.get_ptx)
            .map_err(|status| fail("nvrtcGetPTX", status))?;
        // Kept as text without its terminator; the linker gets one added back.
        while ptx.last() == Some(&0) {
            ptx.pop();
        }
        Ok(ptx)
    }

    /// Reads a NUL-terminated buffer (PTX or log) whose size NVRTC reports first.
    fn read(
        &self,
        program: NvrtcProgram,
        size_fn: FnGetSize,
        bytes_fn: FnGetBytes,
    ) -> std::result::Result<Vec<u8>, NvrtcResult> {
        let mut size = 0usize;
        // SAFETY: `program` is live; the out-pointer is a live local.
        let status = unsafe { size_fn(program, &mut size) };
        if status != NVRTC_SUCCESS {
            return Err(status);
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes NVRTC just said it writes.
        let status = unsafe { bytes_fn(program, buf.as_mut_ptr().cast()) };
        if status != NVRTC_SUCCESS {
            return Err(status);
        }
        Ok(buf)
    }
}
