//! The test driver library for the CUDA tests.
//!
//! No GPU is available in CI, so these tests do not talk to the real NVIDIA driver: they build
//! `c-tests/cuda/fake_cuda.c`, a library that stands in for `libcuda.so.1` (same entry points,
//! same prototypes), and point kcache at it. It counts every call, produces deterministic fake
//! cubins from the PTX, enforces the per-thread context binding, and can be told to refuse
//! cubins. The real driver path is exercised by `scripts/gpu-check` on a GPU machine.
//!
//! Each [`FakeDriver`] is a private copy of the library file, so the dynamic loader gives it
//! its own globals: tests running in parallel threads do not share counters.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libloading::Library;
use tempfile::TempDir;

use crate::backend::cuda::testing::build_test_library;
use crate::backend::cuda::{CUcontext, Driver, Nvrtc};

/// A private copy of a test library in its own directory, under `file_name`.
fn private_copy(name: &str, file_name: &str) -> (TempDir, PathBuf, Library) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file_name);
    // Unit tests have no CARGO_TARGET_TMPDIR; the build script's directory is the crate's own.
    let built = build_test_library(name, Path::new(env!("OUT_DIR")));
    std::fs::copy(built, &path).unwrap();
    // SAFETY: the test libraries have no initialisers with preconditions.
    let library = unsafe { Library::new(&path) }.unwrap();
    (dir, path, library)
}

type FnCounter = unsafe extern "C" fn(*const c_char) -> u64;
type FnInt = unsafe extern "C" fn(c_int);
type FnInit = unsafe extern "C" fn(c_uint) -> c_int;
type FnCtxCreate = unsafe extern "C" fn(*mut CUcontext, c_uint, c_int) -> c_int;
type FnCtx = unsafe extern "C" fn(CUcontext) -> c_int;
type FnCtxOut = unsafe extern "C" fn(*mut CUcontext) -> c_int;

/// One private instance of the fake driver, plus the test-only calls kcache never makes.
pub struct FakeDriver {
    path: PathBuf,
    library: Library,
    _dir: TempDir,
}

impl FakeDriver {
    pub fn new() -> FakeDriver {
        let (dir, path, library) = private_copy("fake_cuda", "libcuda.so.1");
        let fake = FakeDriver {
            path,
            library,
            _dir: dir,
        };
        // SAFETY: cuInit(0) per the driver API.
        assert_eq!(unsafe { fake.sym::<FnInit>("cuInit")(0) }, 0);
        fake
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// kcache's view of this same library instance.
    pub fn driver(&self) -> Arc<Driver> {
        Arc::new(Driver::load_from(&self.path).unwrap())
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: every caller names a symbol of the fake driver with its C type.
        unsafe { *self.library.get::<T>(name.as_bytes()).unwrap() }
    }

    /// A counter of the fake driver (see the list in fake_cuda.c).
    pub fn counter(&self, name: &str) -> u64 {
        let name = CString::new(name).unwrap();
        // SAFETY: NUL-terminated name.
        let value = unsafe { self.sym::<FnCounter>("fakecuda_counter")(name.as_ptr()) };
        assert_ne!(value, u64::MAX, "unknown fake driver counter {name:?}");
        value
    }

    pub fn reject_next_loads(&self, n: i32) {
        // SAFETY: plain value argument.
        unsafe { self.sym::<FnInt>("fakecuda_reject_next_loads")(n) }
    }

    pub fn hold_links(&self, on: bool) {
        // SAFETY: plain value argument.
        unsafe { self.sym::<FnInt>("fakecuda_hold_links")(c_int::from(on)) }
    }

    /// A new context on `device`, not left current on this thread.
    pub fn create_context(&self, device: i32) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointers are live locals; the create pushes the context, the pop undoes it.
        unsafe {
            assert_eq!(
                self.sym::<FnCtxCreate>("cuCtxCreate_v2")(&mut ctx, 0, device),
                0
            );
            assert_eq!(self.sym::<FnCtxOut>("cuCtxPopCurrent_v2")(&mut popped), 0);
        }
        assert_eq!(popped, ctx);
        ctx
    }

    pub fn destroy_context(&self, ctx: CUcontext) {
        // SAFETY: a context of this library.
        assert_eq!(unsafe { self.sym::<FnCtx>("cuCtxDestroy_v2")(ctx) }, 0);
    }

    pub fn set_current(&self, ctx: CUcontext) {
        // SAFETY: NULL or a context of this library.
        assert_eq!(unsafe { self.sym::<FnCtx>("cuCtxSetCurrent")(ctx) }, 0);
    }

    pub fn current(&self) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer is a live local.
        assert_eq!(
            unsafe { self.sym::<FnCtxOut>("cuCtxGetCurrent")(&mut ctx) },
            0
        );
        ctx
    }
}

/// One private instance of the NVRTC stand-in (`c-tests/cuda/fake_nvrtc.c`): no CUDA toolkit
/// is installed in CI either.
pub struct FakeNvrtc {
    path: PathBuf,
    library: Library,
    _dir: TempDir,
}

impl FakeNvrtc {
    pub fn new() -> FakeNvrtc {
        let (dir, path, library) = private_copy("fake_nvrtc", "libnvrtc.so");
        FakeNvrtc {
            path,
            library,
            _dir: dir,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// kcache's view of this same library instance.
    pub fn nvrtc(&self) -> Arc<Nvrtc> {
        Arc::new(Nvrtc::load_from(&self.path).unwrap())
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: every caller names a symbol of the fake NVRTC with its C type.
        unsafe { *self.library.get::<T>(name.as_bytes()).unwrap() }
    }

    pub fn compiles(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { self.sym::<unsafe extern "C" fn() -> u64>("fakenvrtc_compiles")() }
    }

    pub fn last_arch(&self) -> String {
        // SAFETY: returns a NUL-terminated static buffer.
        let text =
            unsafe { self.sym::<unsafe extern "C" fn() -> *const c_char>("fakenvrtc_last_arch")() };
        // SAFETY: as above.
        unsafe { std::ffi::CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn set_version(&self, major: i32, minor: i32) {
        // SAFETY: plain value arguments.
        unsafe {
            self.sym::<unsafe extern "C" fn(c_int, c_int)>("fakenvrtc_set_version")(major, minor)
        }
    }
}

/// A pointer that may cross threads in tests (contexts, functions: plain driver handles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle(pub *mut c_void);
// SAFETY: driver handles are valid on any thread.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}
