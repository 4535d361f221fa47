//! The OpenCL entry points kcache uses, resolved from the ICD loader at run time.
//!
//! kcache never links against `libOpenCL`: the library is opened the first time an OpenCL call
//! needs it, so `libkcache.so` loads on machines without any OpenCL runtime and reports
//! [`Error::Unavailable`] there instead.

#![allow(non_camel_case_types)]

use std::ffi::{OsStr, OsString, c_char, c_void};
use std::path::Path;
use std::sync::OnceLock;

use crate::backend::library::{self, RuntimeLibrary};
use crate::error::{Error, Result};

pub type cl_int = i32;
pub type cl_uint = u32;
pub type cl_ulong = u64;
pub type cl_bitfield = cl_ulong;
pub type cl_platform_id = *mut c_void;
pub type cl_device_id = *mut c_void;
pub type cl_context = *mut c_void;
pub type cl_program = *mut c_void;

pub const CL_SUCCESS: cl_int = 0;
pub const CL_DEVICE_NOT_FOUND: cl_int = -1;
pub const CL_BUILD_PROGRAM_FAILURE: cl_int = -11;
pub const CL_INVALID_VALUE: cl_int = -30;
pub const CL_INVALID_BINARY: cl_int = -42;
pub const CL_INVALID_BUILD_OPTIONS: cl_int = -43;
pub const CL_PLATFORM_NOT_FOUND_KHR: cl_int = -1001;

pub const CL_PLATFORM_VERSION: cl_uint = 0x0901;
pub const CL_PLATFORM_NAME: cl_uint = 0x0902;

pub const CL_DEVICE_TYPE_ALL: cl_bitfield = 0xFFFF_FFFF;
pub const CL_DEVICE_NAME: cl_uint = 0x102B;
pub const CL_DEVICE_VERSION: cl_uint = 0x102F;
pub const CL_DRIVER_VERSION: cl_uint = 0x102D;
pub const CL_DEVICE_PLATFORM: cl_uint = 0x1031;
pub const CL_DEVICE_OPENCL_C_VERSION: cl_uint = 0x103D;

pub const CL_CONTEXT_DEVICES: cl_uint = 0x1081;

pub const CL_PROGRAM_BINARY_SIZES: cl_uint = 0x1165;
pub const CL_PROGRAM_BINARIES: cl_uint = 0x1166;
pub const CL_PROGRAM_KERNEL_NAMES: cl_uint = 0x1168;

pub const CL_PROGRAM_BUILD_LOG: cl_uint = 0x1183;

/// The library opened when `KCACHE_OPENCL_LIBRARY` is not set: the ICD loader's soname.
pub const DEFAULT_LIBRARY: &str = "libOpenCL.so.1";

type BuildNotify = Option<unsafe extern "C" fn(cl_program, *mut c_void)>;

/// Function pointers into one loaded OpenCL library. They stay valid as long as `_library`
/// lives, which is as long as the table.
#[allow(non_snake_case)]
pub struct Api {
    pub clGetPlatformIDs:
        unsafe extern "C" fn(cl_uint, *mut cl_platform_id, *mut cl_uint) -> cl_int,
    pub clGetPlatformInfo:
        unsafe extern "C" fn(cl_platform_id, cl_uint, usize, *mut c_void, *mut usize) -> cl_int,
    pub clGetDeviceIDs: unsafe extern "C" fn(
        cl_platform_id,
        cl_bitfield,
        cl_uint,
        *mut cl_device_id,
        *mut cl_uint,
    ) -> cl_int,
    pub clGetDeviceInfo:
        unsafe extern "C" fn(cl_device_id, cl_uint, usize, *mut c_void, *mut usize) -> cl_int,
    pub clGetContextInfo:
        unsafe extern "C" fn(cl_context, cl_uint, usize, *mut c_void, *mut usize) -> cl_int,
    pub clCreateProgramWithSource: unsafe extern "C" fn(
        cl_context,
        cl_uint,
        *const *const c_char,
        *const usize,
        *mut cl_int,
    ) -> cl_program,
    pub clCreateProgramWithBinary: unsafe extern "C" fn(
        cl_context,
        cl_uint,
        *const cl_device_id,
        *const usize,
        *const *const u8,
        *mut cl_int,
        *mut cl_int,
    ) -> cl_program,
    pub clBuildProgram: unsafe extern "C" fn(
        cl_program,
        cl_uint,
        *const cl_device_id,
        *const c_char,
        BuildNotify,
        *mut c_void,
    ) -> cl_int,
    pub clCompileProgram: unsafe extern "C" fn(
        cl_program,
        cl_uint,
        *const cl_device_id,
        *const c_char,
        cl_uint,
        *const cl_program,
        *const *const c_char,
        BuildNotify,
        *mut c_void,
    ) -> cl_int,
    pub clGetProgramInfo:
        unsafe extern "C" fn(cl_program, cl_uint, usize, *mut c_void, *mut usize) -> cl_int,
    pub clGetProgramBuildInfo: unsafe extern "C" fn(
        cl_program,
        cl_device_id,
        cl_uint,
        usize,
        *mut c_void,
        *mut usize,
    ) -> cl_int,
    pub clRetainProgram: unsafe extern "C" fn(cl_program) -> cl_int,
    pub clReleaseProgram: unsafe extern "C" fn(cl_program) -> cl_int,
    /// The library the entry points come from; `None` for an OpenCL layer's next dispatch
    /// table, which the ICD loader owns for the whole process.
    pub(super) _library: Option<RuntimeLibrary>,
}

/// `Api { field: $entry!(field), … }` over every entry point, with no library: the one list of
/// the table's fields, for each way of finding them ([`Api::load`], and the next dispatch table
/// of the OpenCL layer, whose slots are named as the fields).
macro_rules! api_table {
    ($entry:ident) => {
        $crate::backend::opencl::sys::api_table!($entry:
            clGetPlatformIDs clGetPlatformInfo clGetDeviceIDs clGetDeviceInfo clGetContextInfo
            clCreateProgramWithSource clCreateProgramWithBinary clBuildProgram clCompileProgram
            clGetProgramInfo clGetProgramBuildInfo clRetainProgram clReleaseProgram
        )
    };
    ($entry:ident: $($field:ident)*) => {
        $crate::backend::opencl::sys::Api {
            $($field: $entry!($field),)*
            _library: None,
        }
    };
}
pub(super) use api_table;

/// The process-wide table: loaded on first use, or installed first by the OpenCL layer.
static API: OnceLock<std::result::Result<Api, Error>> = OnceLock::new();

impl Api {
    /// Opens `path` (a file path or a soname searched like `dlopen` does) and resolves every
    /// entry point. Any failure is [`Error::Unavailable`] naming the library and the symbol.
    pub fn load(path: &OsStr) -> Result<Api> {
        let library = RuntimeLibrary::open("OpenCL library", Path::new(path))?;
        macro_rules! resolve {
            ($name:ident) => {
                // SAFETY: the field's type is the prototype the OpenCL specification gives for
                // this symbol, and the pointer is kept only alongside `library`.
                unsafe { library.symbol(stringify!($name)) }?
            };
        }
        let mut api = api_table!(resolve);
        api._library = Some(library);
        Ok(api)
    }

    /// The process-wide table, loaded on first use from `KCACHE_OPENCL_LIBRARY` or
    /// [`DEFAULT_LIBRARY`]. A failed load is remembered: the environment is read once, so every
    /// later call reports the same error rather than retrying `dlopen` on each lookup.
    pub fn get() -> Result<&'static Api> {
        API.get_or_init(|| {
            let path = library::from_env("KCACHE_OPENCL_LIBRARY")
                .unwrap_or_else(|| OsString::from(DEFAULT_LIBRARY));
            let api = Api::load(&path)?;
            // Loaders and drivers discover platforms and devices on the first query, and not
            // all of them safely against a concurrent first query (PoCL 3 reports no device
            // to the loser). Run that first query here, where only one thread gets.
            let _ = super::runtime::all_devices(&api);
            Ok(api)
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// Makes `api` the process-wide table, before anything loaded one: the OpenCL layer's own
    /// calls must go to the next dispatch table, not back through the loader into the layer.
    /// False when a table was loaded already.
    pub(super) fn install(api: Api) -> bool {
        API.set(Ok(api)).is_ok()
    }
}

/// A human-readable name for an OpenCL status code, for error messages.
pub fn status_name(code: cl_int) -> &'static str {
    match code {
        CL_SUCCESS => "CL_SUCCESS",
        CL_DEVICE_NOT_FOUND => "CL_DEVICE_NOT_FOUND",
        -2 => "CL_DEVICE_NOT_AVAILABLE",
        -3 => "CL_COMPILER_NOT_AVAILABLE",
        -4 => "CL_MEM_OBJECT_ALLOCATION_FAILURE",
        -5 => "CL_OUT_OF_RESOURCES",
        -6 => "CL_OUT_OF_HOST_MEMORY",
        CL_BUILD_PROGRAM_FAILURE => "CL_BUILD_PROGRAM_FAILURE",
        CL_INVALID_VALUE => "CL_INVALID_VALUE",
        -32 => "CL_INVALID_PLATFORM",
        -33 => "CL_INVALID_DEVICE",
        -34 => "CL_INVALID_CONTEXT",
        -36 => "CL_INVALID_COMMAND_QUEUE",
        -38 => "CL_INVALID_MEM_OBJECT",
        CL_INVALID_BINARY => "CL_INVALID_BINARY",
        CL_INVALID_BUILD_OPTIONS => "CL_INVALID_BUILD_OPTIONS",
        -44 => "CL_INVALID_PROGRAM",
        -45 => "CL_INVALID_PROGRAM_EXECUTABLE",
        -46 => "CL_INVALID_KERNEL_NAME",
        -48 => "CL_INVALID_KERNEL",
        -49 => "CL_INVALID_ARG_INDEX",
        -50 => "CL_INVALID_ARG_VALUE",
        -51 => "CL_INVALID_ARG_SIZE",
        -52 => "CL_INVALID_KERNEL_ARGS",
        -54 => "CL_INVALID_WORK_GROUP_SIZE",
        CL_PLATFORM_NOT_FOUND_KHR => "CL_PLATFORM_NOT_FOUND_KHR",
        _ => "unknown OpenCL status",
    }
}
