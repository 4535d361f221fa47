//! OpenCL for the tests, the demo and the benchmarks: a context of their own on the first
//! device, a plain driver build to compare kcache with, and a runner for 1-D kernels, which is
//! what they need to prove that a cached program really works. The entry points come from the
//! library kcache loads (`KCACHE_OPENCL_LIBRARY`, else `libOpenCL.so.1`), so that kernels run
//! in the same OpenCL library as the programs were built by.

#![allow(non_camel_case_types)]

use std::ffi::{CString, OsString, c_char, c_void};
use std::path::Path;
use std::ptr;
use std::sync::{Arc, OnceLock};

use kcache::Persistence;
use kcache::backend::library::{self, RuntimeLibrary};
use kcache::backend::opencl::{
    ContextRef, Device, OpenClCache, OpenClOptions, Program, cl_context, cl_device_id, cl_int,
    cl_program, program_disk_key, status_name,
};
use kcache::key::Key;
use kcache::{Error, Result};

use crate::needs::{self, Missing};

type cl_uint = u32;
type cl_bool = cl_uint;
type cl_bitfield = u64;
type cl_platform_id = *mut c_void;
type cl_command_queue = *mut c_void;
type cl_kernel = *mut c_void;
type cl_mem = *mut c_void;
type cl_event = *mut c_void;
type cl_context_properties = isize;
type ContextNotify = Option<unsafe extern "C" fn(*const c_char, *const c_void, usize, *mut c_void)>;
type BuildNotify = Option<unsafe extern "C" fn(cl_program, *mut c_void)>;

const CL_SUCCESS: cl_int = 0;
const CL_DEVICE_NOT_FOUND: cl_int = -1;
const CL_PLATFORM_NOT_FOUND_KHR: cl_int = -1001;
const CL_TRUE: cl_bool = 1;
const CL_DEVICE_TYPE_ALL: cl_bitfield = 0xFFFF_FFFF;
const CL_MEM_READ_WRITE: cl_bitfield = 1;
const CL_MEM_COPY_HOST_PTR: cl_bitfield = 1 << 5;
const CL_PROGRAM_REFERENCE_COUNT: cl_uint = 0x1160;

/// Declares [`Api`], one field per entry point named and typed as the OpenCL specification
/// gives it, and `Api::resolve`, which looks each one up by its field's name: every entry point
/// is named once.
macro_rules! api {
    ($($name:ident: $prototype:ty,)*) => {
        /// The OpenCL entry points kcache itself never calls. They stay valid as long as
        /// `_library` lives, which is as long as the table.
        #[allow(non_snake_case)]
        struct Api {
            $($name: $prototype,)*
            _library: RuntimeLibrary,
        }

        impl Api {
            fn resolve(library: RuntimeLibrary) -> Result<Api> {
                Ok(Api {
                    // SAFETY: each field's type is the prototype the OpenCL specification gives
                    // for its symbol, and the pointer is kept only alongside `library`.
                    $($name: unsafe { library.symbol(stringify!($name)) }?,)*
                    _library: library,
                })
            }
        }
    };
}

api! {
    clGetPlatformIDs: unsafe extern "C" fn(cl_uint, *mut cl_platform_id, *mut cl_uint) -> cl_int,
    clGetDeviceIDs: unsafe extern "C" fn(
        cl_platform_id,
        cl_bitfield,
        cl_uint,
        *mut cl_device_id,
        *mut cl_uint,
    ) -> cl_int,
    clCreateContext: unsafe extern "C" fn(
        *const cl_context_properties,
        cl_uint,
        *const cl_device_id,
        ContextNotify,
        *mut c_void,
        *mut cl_int,
    ) -> cl_context,
    clReleaseContext: unsafe extern "C" fn(cl_context) -> cl_int,
    clCreateProgramWithSource: unsafe extern "C" fn(
        cl_context,
        cl_uint,
        *const *const c_char,
        *const usize,
        *mut cl_int,
    ) -> cl_program,
    clBuildProgram: unsafe extern "C" fn(
        cl_program,
        cl_uint,
        *const cl_device_id,
        *const c_char,
        BuildNotify,
        *mut c_void,
    ) -> cl_int,
    clReleaseProgram: unsafe extern "C" fn(cl_program) -> cl_int,
    clGetProgramInfo:
        unsafe extern "C" fn(cl_program, cl_uint, usize, *mut c_void, *mut usize) -> cl_int,
    clCreateCommandQueue: unsafe extern "C" fn(
        cl_context,
        cl_device_id,
        cl_bitfield,
        *mut cl_int,
    ) -> cl_command_queue,
    clReleaseCommandQueue: unsafe extern "C" fn(cl_command_queue) -> cl_int,
    clFinish: unsafe extern "C" fn(cl_command_queue) -> cl_int,
    clCreateKernel: unsafe extern "C" fn(cl_program, *const c_char, *mut cl_int) -> cl_kernel,
    clReleaseKernel: unsafe extern "C" fn(cl_kernel) -> cl_int,
    clSetKernelArg: unsafe extern "C" fn(cl_kernel, cl_uint, usize, *const c_void) -> cl_int,
    clCreateBuffer:
        unsafe extern "C" fn(cl_context, cl_bitfield, usize, *mut c_void, *mut cl_int) -> cl_mem,
    clReleaseMemObject: unsafe extern "C" fn(cl_mem) -> cl_int,
    clEnqueueReadBuffer: unsafe extern "C" fn(
        cl_command_queue,
        cl_mem,
        cl_bool,
        usize,
        usize,
        *mut c_void,
        cl_uint,
        *const cl_event,
        *mut cl_event,
    ) -> cl_int,
    clEnqueueNDRangeKernel: unsafe extern "C" fn(
        cl_command_queue,
        cl_kernel,
        cl_uint,
        *const usize,
        *const usize,
        *const usize,
        cl_uint,
        *const cl_event,
        *mut cl_event,
    ) -> cl_int,
}

impl Api {
    /// The process-wide table. kcache loads its library first (making a cache does), which
    /// also runs the first platform query where only one thread gets: not every driver takes
    /// concurrent first queries. Its error, `Unavailable` without a library, is this one's.
    fn get() -> Result<&'static Api> {
        static API: OnceLock<Result<Api>> = OnceLock::new();
        API.get_or_init(|| {
            drop(OpenClCache::new(OpenClOptions::default())?);
            let path = library::from_env("KCACHE_OPENCL_LIBRARY")
                .unwrap_or_else(|| OsString::from("libOpenCL.so.1"));
            Api::resolve(RuntimeLibrary::open("OpenCL library", Path::new(&path))?)
        })
        .as_ref()
        .map_err(Clone::clone)
    }
}

fn check(code: cl_int, what: &str) -> Result<()> {
    let failed = || Error::Backend(format!("{what} failed: {} ({code})", status_name(code)));
    (code == CL_SUCCESS).then_some(()).ok_or_else(failed)
}

/// A context on one device, owned and released on drop.
pub struct Context {
    api: &'static Api,
    context: cl_context,
    device: Device,
}

// SAFETY: OpenCL contexts are thread-safe objects (OpenCL 1.1+, appendix A.2), and `Context`
// adds no unsynchronised state of its own.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// A context on the first device of the first platform that has one.
    pub fn first_device() -> Result<Context> {
        let api = Api::get()?;
        let mut count: cl_uint = 0;
        // SAFETY: a null list with 0 entries only asks for the count.
        let code = unsafe { (api.clGetPlatformIDs)(0, ptr::null_mut(), &mut count) };
        let mut platforms = vec![ptr::null_mut(); count as usize];
        if code != CL_PLATFORM_NOT_FOUND_KHR && count > 0 {
            check(code, "clGetPlatformIDs")?;
            // SAFETY: `platforms` has room for `count` handles.
            let code =
                unsafe { (api.clGetPlatformIDs)(count, platforms.as_mut_ptr(), ptr::null_mut()) };
            check(code, "clGetPlatformIDs")?;
        }
        for platform in platforms {
            let mut device: cl_device_id = ptr::null_mut();
            // SAFETY: room for one device handle; the count is not asked for.
            let code = unsafe {
                (api.clGetDeviceIDs)(
                    platform,
                    CL_DEVICE_TYPE_ALL,
                    1,
                    &mut device,
                    ptr::null_mut(),
                )
            };
            if code == CL_DEVICE_NOT_FOUND {
                continue;
            }
            check(code, "clGetDeviceIDs")?;
            // SAFETY: a root device the platform reported, never released.
            return Context::new(unsafe { Device::from_raw(device) });
        }
        Err(Error::Unavailable("no OpenCL device found".into()))
    }

    /// [`Context::first_device`] for a test that needs one: `None` when no OpenCL library,
    /// platform or device is there, the test skipped ([`needs::met`]).
    pub fn for_test() -> Option<Context> {
        let missing = match Context::first_device() {
            Err(Error::Unavailable(why)) => Missing::new(
                format!("OpenCL is not usable: {why}"),
                "apt install pocl-opencl-icd ocl-icd-libopencl1; scripts/test installs them",
            ),
            found => return Some(found.unwrap()),
        };
        needs::met(Err(missing))
    }

    pub fn new(device: Device) -> Result<Context> {
        let api = Api::get()?;
        let mut code = CL_SUCCESS;
        // SAFETY: one live device handle, no properties, no callback.
        let context = unsafe {
            (api.clCreateContext)(
                ptr::null(),
                1,
                &device.raw(),
                None,
                ptr::null_mut(),
                &mut code,
            )
        };
        check(code, "clCreateContext")?;
        Ok(Context {
            api,
            context,
            device,
        })
    }

    /// The context, borrowed for as long as `self` lives.
    pub fn context(&self) -> ContextRef<'_> {
        // SAFETY: `self` owns the context and releases it only on drop.
        unsafe { ContextRef::from_raw(self.context) }
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Builds `source` (no options) on this device through an OpenCL cache on `persistence`
    /// and flushes the cache, so that the binary is stored: the program's key there.
    pub fn store_program(&self, persistence: Arc<Persistence>, source: &str) -> Key {
        let cache = OpenClCache::new(OpenClOptions {
            persistence: Some(persistence),
            ..OpenClOptions::default()
        })
        .unwrap();
        drop(
            cache
                .find_or_build(self.context(), self.device(), &[source], "")
                .unwrap(),
        );
        cache.flush();
        program_disk_key(self.device(), &[source], "").unwrap()
    }

    /// `clCreateProgramWithSource` + `clBuildProgram` of `sources` with `options`, without
    /// kcache: what a program without a cache does, for comparing with it. The program is
    /// released when the result is dropped.
    pub fn build_uncached(&self, sources: &[&str], options: &str) -> Result<UncachedProgram> {
        let api = self.api;
        let strings: Vec<*const c_char> = sources.iter().map(|s| s.as_ptr().cast()).collect();
        let lengths: Vec<usize> = sources.iter().map(|s| s.len()).collect();
        let options = CString::new(options)
            .map_err(|_| Error::InvalidArgument("build options contain a NUL byte".into()))?;
        let mut code = CL_SUCCESS;
        // SAFETY: the context is live; `strings` and `lengths` hold one entry per source, each
        // pointer valid for its length (given, so no NUL terminator is needed).
        let raw = unsafe {
            (api.clCreateProgramWithSource)(
                self.context,
                cl_uint::try_from(sources.len()).expect("a few sources"),
                strings.as_ptr(),
                lengths.as_ptr(),
                &mut code,
            )
        };
        check(code, "clCreateProgramWithSource")?;
        let program = UncachedProgram { api, raw };
        // SAFETY: the program is live and belongs to this context, which contains the device;
        // `options` outlives the call; without a callback the build is synchronous.
        let code = unsafe {
            (api.clBuildProgram)(
                raw,
                1,
                &self.device.raw(),
                options.as_ptr(),
                None,
                ptr::null_mut(),
            )
        };
        check(code, "clBuildProgram")?;
        Ok(program)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context was created by `Context::new` and is released exactly once;
        // programs built in the context hold their own reference to it.
        unsafe { (self.api.clReleaseContext)(self.context) };
    }
}

/// A program from [`Context::build_uncached`], released on drop.
pub struct UncachedProgram {
    api: &'static Api,
    raw: cl_program,
}

/// A built program whose kernels [`run_kernel`] can launch: a cached one, or one built without
/// kcache, to time a first launch the same way for both.
pub trait BuiltProgram {
    /// The program handle, live as long as `self`.
    fn raw(&self) -> cl_program;
}

impl BuiltProgram for Program {
    fn raw(&self) -> cl_program {
        Program::raw(self)
    }
}

impl BuiltProgram for UncachedProgram {
    fn raw(&self) -> cl_program {
        self.raw
    }
}

impl Drop for UncachedProgram {
    fn drop(&mut self) {
        // SAFETY: the one reference `build_uncached` created, released once.
        unsafe { (self.api.clReleaseProgram)(self.raw) };
    }
}

/// The driver's reference count of `program` (`CL_PROGRAM_REFERENCE_COUNT`): how many owners
/// it has, `program` included. Meant for checks, as the specification says.
pub fn reference_count(program: &Program) -> Result<u32> {
    let api = Api::get()?;
    let mut count: cl_uint = 0;
    // SAFETY: `program` owns a reference, so it is live; the answer is one `cl_uint`, whose
    // size is passed.
    let code = unsafe {
        (api.clGetProgramInfo)(
            program.raw(),
            CL_PROGRAM_REFERENCE_COUNT,
            size_of::<cl_uint>(),
            (&raw mut count).cast(),
            ptr::null_mut(),
        )
    };
    check(code, "clGetProgramInfo(CL_PROGRAM_REFERENCE_COUNT)")?;
    Ok(count)
}

/// `clReleaseProgram` on a handle, as a C caller gives back a program reference it was handed
/// (`Program::into_raw`).
///
/// # Safety
/// `raw` must be a program reference the caller owns; it is given up here.
pub unsafe fn release_program(raw: cl_program) -> Result<()> {
    let api = Api::get()?;
    // SAFETY: the caller owns the reference and gives it up.
    check(unsafe { (api.clReleaseProgram)(raw) }, "clReleaseProgram")
}

/// The buffers of an `n` x `n` row-major matrix product C = A * B, for a kernel taking
/// `(c, a, b, n)`. Its inputs are small integers and halves, so that every partial sum is exact
/// in `f32` and a device's result equals the CPU's.
pub struct Matmul {
    n: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl Matmul {
    pub fn new(n: usize) -> Matmul {
        Matmul {
            n,
            a: (0..n * n).map(|i| ((i * 7) % 13) as f32 - 6.0).collect(),
            b: (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.5).collect(),
            c: vec![0.0; n * n],
        }
    }

    /// The kernel's arguments: C (read back), A, B, n.
    pub fn args(&mut self) -> [KernelArg<'_>; 4] {
        [
            KernelArg::Floats(&mut self.c),
            KernelArg::Input(&self.a),
            KernelArg::Input(&self.b),
            KernelArg::Int(i32::try_from(self.n).expect("a small matrix")),
        ]
    }

    /// Compares every element of C with the CPU's product; the error names the first that
    /// differs.
    pub fn check(&self) -> std::result::Result<(), String> {
        let (n, a, b) = (self.n, &self.a, &self.b);
        for (i, &got) in self.c.iter().enumerate() {
            let (row, col) = (i / n, i % n);
            let expected: f32 = (0..n).map(|k| a[row * n + k] * b[k * n + col]).sum();
            if got != expected {
                return Err(format!("c[{row}][{col}] is {got}, expected {expected}"));
            }
        }
        Ok(())
    }
}

/// One argument of [`run_kernel`].
pub enum KernelArg<'a> {
    /// Copied to a device buffer before the launch and read back into the slice after it.
    Floats(&'a mut [f32]),
    /// Copied to a device buffer before the launch, and not read back.
    Input(&'a [f32]),
    Float(f32),
    Int(i32),
}

/// Runs `kernel` of `program` (built in `context`) over `global` work items on a queue of its
/// own, in work-groups of the driver's choosing, and waits for it; float buffers are read back
/// into their slices.
pub fn run_kernel(
    context: &Context,
    program: &impl BuiltProgram,
    kernel: &str,
    args: &mut [KernelArg<'_>],
    global: usize,
) -> Result<()> {
    run_kernel_in_groups(context, program, kernel, args, global, None)
}

/// [`run_kernel`] in work-groups of `local` work items, when `Some` (a kernel that declares
/// `reqd_work_group_size` needs its size given).
pub fn run_kernel_in_groups(
    context: &Context,
    program: &impl BuiltProgram,
    kernel: &str,
    args: &mut [KernelArg<'_>],
    global: usize,
    local: Option<usize>,
) -> Result<()> {
    let api = context.api;
    let name = CString::new(kernel)
        .map_err(|_| Error::InvalidArgument("kernel name contains a NUL byte".into()))?;
    let mut code = CL_SUCCESS;
    // SAFETY: `context` owns a live context on its device; no queue properties.
    let queue =
        unsafe { (api.clCreateCommandQueue)(context.context, context.device.raw(), 0, &mut code) };
    check(code, "clCreateCommandQueue")?;
    // SAFETY: `program` is live (it owns a reference); `name` is a C string.
    let k = unsafe { (api.clCreateKernel)(program.raw(), name.as_ptr(), &mut code) };
    let result = check(code, "clCreateKernel").and_then(|()| {
        let mut buffers: Vec<cl_mem> = Vec::new();
        let sizes = (global, local);
        let result = launch(api, context, queue, k, args, sizes, &mut buffers);
        for b in buffers {
            // SAFETY: each buffer was created by `launch` and is released once.
            unsafe { (api.clReleaseMemObject)(b) };
        }
        // SAFETY: the kernel was created above and is released once.
        unsafe { (api.clReleaseKernel)(k) };
        result
    });
    // SAFETY: created above, released once; `launch` waited for everything queued on it.
    unsafe { (api.clReleaseCommandQueue)(queue) };
    result
}

fn launch(
    api: &Api,
    context: &Context,
    queue: cl_command_queue,
    kernel: cl_kernel,
    args: &mut [KernelArg<'_>],
    (global, local): (usize, Option<usize>),
    buffers: &mut Vec<cl_mem>,
) -> Result<()> {
    for (index, arg) in args.iter_mut().enumerate() {
        let index = cl_uint::try_from(index)
            .map_err(|_| Error::InvalidArgument("too many kernel arguments".into()))?;
        let code = match arg {
            KernelArg::Floats(data) => set_buffer(api, context, kernel, index, data, buffers)?,
            KernelArg::Input(data) => set_buffer(api, context, kernel, index, data, buffers)?,
            // SAFETY: scalar arguments are passed by address with their size.
            KernelArg::Float(v) => unsafe {
                (api.clSetKernelArg)(kernel, index, size_of::<f32>(), (&raw const *v).cast())
            },
            // SAFETY: as above.
            KernelArg::Int(v) => unsafe {
                (api.clSetKernelArg)(kernel, index, size_of::<i32>(), (&raw const *v).cast())
            },
        };
        check(code, "clSetKernelArg")?;
    }
    let local = local.as_ref().map_or(ptr::null(), ptr::from_ref);
    // SAFETY: one dimension: `global` points to one size_t, `local` to one or is null (the
    // driver chooses); no events.
    let code = unsafe {
        (api.clEnqueueNDRangeKernel)(
            queue,
            kernel,
            1,
            ptr::null(),
            &global,
            local,
            0,
            ptr::null(),
            ptr::null_mut(),
        )
    };
    check(code, "clEnqueueNDRangeKernel")?;
    // One buffer was created per slice, in argument order.
    let slices = args
        .iter_mut()
        .filter(|arg| matches!(arg, KernelArg::Floats(_) | KernelArg::Input(_)));
    for (arg, &mem) in slices.zip(buffers.iter()) {
        let KernelArg::Floats(data) = arg else {
            continue;
        };
        // SAFETY: a blocking read of exactly the bytes the buffer was created with, into the
        // slice they came from.
        let code = unsafe {
            (api.clEnqueueReadBuffer)(
                queue,
                mem,
                CL_TRUE,
                0,
                size_of_val(*data),
                data.as_mut_ptr().cast(),
                0,
                ptr::null(),
                ptr::null_mut(),
            )
        };
        check(code, "clEnqueueReadBuffer")?;
    }
    // SAFETY: the queue is live; waiting makes the results visible before returning.
    check(unsafe { (api.clFinish)(queue) }, "clFinish")
}

/// Creates a device buffer holding a copy of `data`, kept in `buffers` for the caller to release,
/// and sets it as argument `index` of `kernel`; returns the code of `clSetKernelArg`.
fn set_buffer(
    api: &Api,
    context: &Context,
    kernel: cl_kernel,
    index: cl_uint,
    data: &[f32],
    buffers: &mut Vec<cl_mem>,
) -> Result<cl_int> {
    let mut code = CL_SUCCESS;
    // SAFETY: COPY_HOST_PTR only reads `size_of_val(data)` bytes from `data` during the call
    // and keeps no pointer to it.
    let mem = unsafe {
        (api.clCreateBuffer)(
            context.context,
            CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
            size_of_val(data),
            data.as_ptr().cast_mut().cast(),
            &mut code,
        )
    };
    check(code, "clCreateBuffer")?;
    buffers.push(mem);
    // SAFETY: a buffer argument is passed as a pointer to the cl_mem handle.
    let code = unsafe {
        (api.clSetKernelArg)(kernel, index, size_of::<cl_mem>(), (&raw const mem).cast())
    };
    Ok(code)
}
