//! NVRTC, CUDA's run-time compiler, resolved at run time: CUDA C++ source in, a cubin (for a
//! real architecture, `sm_XY`) or PTX (for a virtual one, `compute_XY`) out. Optional: kcache
//! only loads it for
//! [`CudaCache::find_or_build_source`](super::CudaCache::find_or_build_source).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use super::build_id::loaded_build;
use crate::backend::library::{self, RuntimeLibrary};
use crate::error::{BuildError, Error, Result};
use crate::headers::Embedded;

type NvrtcResult = c_int;
type NvrtcProgram = *mut std::ffi::c_void;

const NVRTC_SUCCESS: NvrtcResult = 0;

/// Names another NVRTC library (a path or a soname).
pub const LIBRARY_ENV: &str = "KCACHE_NVRTC_LIBRARY";
/// Tried in order when `KCACHE_NVRTC_LIBRARY` is unset and no driver version is known: the
/// development link, then the sonames of the CUDA releases that ship NVRTC as a separate
/// library. [`Nvrtc::load_for_driver`] tries the driver's own release first.
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
type FnCount = unsafe extern "C" fn(*mut c_int) -> NvrtcResult;
type FnArchs = unsafe extern "C" fn(*mut c_int) -> NvrtcResult;

/// What one compile produced.
pub(crate) struct Compiled {
    /// A cubin for a real architecture, else PTX (without its terminating NUL).
    pub image: Vec<u8>,
    pub is_cubin: bool,
    /// The PTX, when NVRTC gives it: where the kernel names are read from. Empty when none.
    pub ptx: Vec<u8>,
}

/// A loaded NVRTC. Share it via `Arc`.
pub struct Nvrtc {
    path: PathBuf,
    version: (i32, i32),
    build: String,
    /// `nvrtcGetSupportedArchs`, ascending: compute capabilities as `major * 10 + minor`.
    supported_archs: Vec<i32>,
    get_error_string: FnGetErrorString,
    create_program: FnCreateProgram,
    destroy_program: FnDestroyProgram,
    compile_program: FnCompileProgram,
    get_ptx_size: FnGetSize,
    get_ptx: FnGetBytes,
    get_cubin_size: FnGetSize,
    get_cubin: FnGetBytes,
    get_log_size: FnGetSize,
    get_log: FnGetBytes,
    // Last so that every function pointer above is dropped before the library is closed.
    _library: RuntimeLibrary,
}

debug_fields!(Nvrtc {
    path,
    version,
    build,
    supported_archs,
    ..
});

impl Nvrtc {
    /// Loads the library named by `KCACHE_NVRTC_LIBRARY`, else the first of
    /// [`DEFAULT_LIBRARIES`] that loads.
    pub fn load() -> Result<Self> {
        Self::load_first(DEFAULT_LIBRARIES.iter().map(|&n| n.to_owned()).collect())
    }

    /// As [`Nvrtc::load`], trying the NVRTC of the driver's own CUDA major release first
    /// (`libnvrtc.so.12` for 12040; all of CUDA 11 ships `libnvrtc.so.11.2`): PTX from a newer NVRTC names a PTX version the driver's JIT refuses
    /// (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`).
    pub fn load_for_driver(driver_version: i32) -> Result<Self> {
        Self::load_first(candidates(driver_version))
    }

    fn load_first(names: Vec<String>) -> Result<Self> {
        if let Some(path) = library::from_env(LIBRARY_ENV) {
            return Self::load_from(Path::new(&path));
        }
        let mut reasons = Vec::new();
        for name in names {
            match Self::load_from(Path::new(&name)) {
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
        let (version_fn, count_fn, archs_fn, nvrtc) = unsafe {
            let version_fn: FnVersion = library.symbol("nvrtcVersion")?;
            let count_fn: FnCount = library.symbol("nvrtcGetNumSupportedArchs")?;
            let archs_fn: FnArchs = library.symbol("nvrtcGetSupportedArchs")?;
            let nvrtc = Nvrtc {
                path: path.to_path_buf(),
                version: (0, 0),
                build: String::new(),
                supported_archs: Vec::new(),
                get_error_string: library.symbol("nvrtcGetErrorString")?,
                create_program: library.symbol("nvrtcCreateProgram")?,
                destroy_program: library.symbol("nvrtcDestroyProgram")?,
                compile_program: library.symbol("nvrtcCompileProgram")?,
                get_ptx_size: library.symbol("nvrtcGetPTXSize")?,
                get_ptx: library.symbol("nvrtcGetPTX")?,
                get_cubin_size: library.symbol("nvrtcGetCUBINSize")?,
                get_cubin: library.symbol("nvrtcGetCUBIN")?,
                get_log_size: library.symbol("nvrtcGetProgramLogSize")?,
                get_log: library.symbol("nvrtcGetProgramLog")?,
                _library: library,
            };
            (version_fn, count_fn, archs_fn, nvrtc)
        };
        let failed = |what: &str, status| {
            Error::Unavailable(format!(
                "{what} failed in {}: {}",
                path.display(),
                nvrtc.describe(status)
            ))
        };
        let (mut major, mut minor, mut count) = (0, 0, 0);
        // SAFETY: out-pointers are live locals.
        let status = unsafe { version_fn(&mut major, &mut minor) };
        if status != NVRTC_SUCCESS {
            return Err(failed("nvrtcVersion", status));
        }
        // SAFETY: as above.
        let status = unsafe { count_fn(&mut count) };
        if status != NVRTC_SUCCESS {
            return Err(failed("nvrtcGetNumSupportedArchs", status));
        }
        let mut archs = vec![0; usize::try_from(count).unwrap_or(0)];
        // SAFETY: `archs` holds the `count` ints NVRTC just said it writes.
        let status = unsafe { archs_fn(archs.as_mut_ptr()) };
        if status != NVRTC_SUCCESS {
            return Err(failed("nvrtcGetSupportedArchs", status));
        }
        archs.sort_unstable();
        let build = loaded_build(version_fn as *const c_void, path, "NVRTC");
        Ok(Nvrtc {
            version: (major, minor),
            build,
            supported_archs: archs,
            ..nvrtc
        })
    }

    /// The architectures this NVRTC compiles for (`nvrtcGetSupportedArchs`), ascending, as
    /// `major * 10 + minor`.
    pub fn supported_archs(&self) -> &[i32] {
        &self.supported_archs
    }

    /// Whether this NVRTC comes from a CUDA release newer than `driver_version`
    /// (`cuDriverGetVersion`, e.g. 12040): its PTX would need a newer driver's JIT.
    pub fn is_newer_than(&self, driver_version: i32) -> bool {
        let (major, minor) = self.version;
        major * 1000 + minor * 10 > driver_version
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `nvrtcVersion`: (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The NVRTC build: the real file name of the loaded library (`libnvrtc.so.12` links to
    /// `libnvrtc.so.12.4.127`; a file that names no build, as NVIDIA's Python wheels install
    /// `libnvrtc.so.13`, has its size and a digest of its content added).
    /// NVRTC makes the cubins of CUDA C++ itself, so a patch release, which `nvrtcVersion`
    /// does not tell apart, changes them: the disk key holds the build.
    pub fn build(&self) -> &str {
        &self.build
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

    /// Compiles CUDA C++ `source` to PTX (the options name a virtual architecture, or none).
    /// A compile error is a [`BuildError`] with the `nvrtcResult` as its code and the compiler
    /// log as its message.
    pub fn compile(
        &self,
        source: &str,
        options: &[&str],
    ) -> std::result::Result<Vec<u8>, BuildError> {
        self.compile_to(source, &[], options, false)
            .map(|c| c.image)
    }

    /// Compiles CUDA C++ `source`, with the in-memory `headers` NVRTC finds by their include
    /// names: to a cubin (`nvrtcGetCUBIN`) when `cubin`, which needs the options to name a
    /// real architecture (`sm_XY`), else to PTX.
    pub(crate) fn compile_to(
        &self,
        source: &str,
        headers: &[Embedded<'_>],
        options: &[&str],
        cubin: bool,
    ) -> std::result::Result<Compiled, BuildError> {
        let invalid = |what: &str| BuildError::new(-1, format!("{what} contains a NUL byte"));
        let source = CString::new(source).map_err(|_| invalid("the CUDA source"))?;
        let strings = |pick: for<'h> fn(&Embedded<'h>) -> &'h str| {
            headers
                .iter()
                .map(|h| CString::new(pick(h)).map_err(|_| invalid("a header")))
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        let (names, texts) = (strings(|h| h.name)?, strings(|h| h.text)?);
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let text_ptrs: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
        let header_count =
            c_int::try_from(headers.len()).map_err(|_| BuildError::new(-1, "too many headers"))?;
        let options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(*o).map_err(|_| invalid("an NVRTC option")))
            .collect::<std::result::Result<_, _>>()?;
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let fail = |what: &str, status| {
            BuildError::new(status, format!("{what} failed: {}", self.describe(status)))
        };

        let mut program: NvrtcProgram = std::ptr::null_mut();
        // SAFETY: `source` and the name are NUL-terminated; the header arrays hold
        // `header_count` NUL-terminated strings each, which outlive the program's creation
        // (NVRTC copies them).
        let status = unsafe {
            (self.create_program)(
                &mut program,
                source.as_ptr(),
                c"kcache.cu".as_ptr(),
                header_count,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
        };
        if status != NVRTC_SUCCESS {
            return Err(fail("nvrtcCreateProgram", status));
        }
        let out = self.compile_program(program, &option_ptrs, cubin, fail);
        // SAFETY: `program` came from nvrtcCreateProgram and is destroyed once.
        unsafe { (self.destroy_program)(&mut program) };
        out
    }

    fn compile_program(
        &self,
        program: NvrtcProgram,
        options: &[*const c_char],
        cubin: bool,
        fail: impl Fn(&str, NvrtcResult) -> BuildError,
    ) -> std::result::Result<Compiled, BuildError> {
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
        let ptx = self.read(program, self.get_ptx_size, self.get_ptx);
        if cubin {
            let image = self
                .read(program, self.get_cubin_size, self.get_cubin)
                .map_err(|status| fail("nvrtcGetCUBIN", status))?;
            // nvrtcGetCUBINSize sets 0 for a virtual architecture, and -dlto makes LTO IR
            // instead: an empty image must never reach cuModuleLoadDataEx, which takes no size.
            if image.is_empty() {
                return Err(BuildError::new(
                    -1,
                    "NVRTC made no cubin (-dlto makes LTO IR, which kcache cannot load; a \
                     virtual architecture makes PTX only)",
                ));
            }
            return Ok(Compiled {
                image,
                is_cubin: true,
                // Only for the kernel names: NVRTC may keep no PTX for a real architecture.
                ptx: ptx.map(without_nul).unwrap_or_default(),
            });
        }
        let ptx = without_nul(ptx.map_err(|status| fail("nvrtcGetPTX", status))?);
        Ok(Compiled {
            image: ptx.clone(),
            is_cubin: false,
            ptx,
        })
    }

    /// Reads a buffer (PTX, cubin or log) whose size NVRTC reports first.
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
        if size == 0 {
            // Nothing to read: an empty buffer's pointer is dangling, never handed out.
            return Ok(Vec::new());
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

/// PTX kept as text without its terminator; the linker gets one added back.
fn without_nul(mut ptx: Vec<u8>) -> Vec<u8> {
    while ptx.last() == Some(&0) {
        ptx.pop();
    }
    ptx
}

/// The libraries [`Nvrtc::load_for_driver`] tries, in order: the soname of the driver's own
/// CUDA major release (`libnvrtc.so.12` for 12040; all of CUDA 11 ships `libnvrtc.so.11.2`),
/// then [`DEFAULT_LIBRARIES`].
fn candidates(driver_version: i32) -> Vec<String> {
    let own = match driver_version / 1000 {
        11 => "libnvrtc.so.11.2".to_owned(),
        major => format!("libnvrtc.so.{major}"),
    };
    let mut names = vec![own.clone()];
    names.extend(
        DEFAULT_LIBRARIES
            .iter()
            .filter(|&&n| n != own)
            .map(|&n| n.to_owned()),
    );
    names
}

#[cfg(test)]
mod tests {
    use super::candidates;

    #[test]
    fn the_drivers_own_release_comes_first() {
        assert_eq!(
            candidates(12040),
            [
                "libnvrtc.so.12",
                "libnvrtc.so",
                "libnvrtc.so.13",
                "libnvrtc.so.11.2"
            ]
        );
        assert_eq!(candidates(11080)[0], "libnvrtc.so.11.2");
        assert_eq!(candidates(11080).len(), 4);
        assert_eq!(candidates(13000)[..2], ["libnvrtc.so.13", "libnvrtc.so"]);
    }
}
