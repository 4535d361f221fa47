//! Checked, safe wrappers over the raw entry points: devices and their identity, contexts
//! (borrowed from a caller), programs built from source or from binaries (owned
//! references, released on drop).
//!
//! Raw handles become safe values only through an `unsafe` constructor whose contract says
//! the handle is live; everything after that is safe to call.

use std::ffi::{CString, c_char, c_void};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr;

use super::sys::*;
use crate::backend::handle_cache::Destroy;
use crate::error::{BuildError, DestroyError, Error, Result};

fn check(code: cl_int, what: &str) -> Result<()> {
    if code == CL_SUCCESS {
        Ok(())
    } else {
        Err(Error::Backend(format!(
            "{what} failed: {} ({code})",
            status_name(code)
        )))
    }
}

/// Runs the usual two-call OpenCL query: ask for the size, then fill a buffer of that size.
fn query_bytes(
    what: &str,
    mut query: impl FnMut(usize, *mut c_void, *mut usize) -> cl_int,
) -> Result<Vec<u8>> {
    let mut size = 0usize;
    check(query(0, ptr::null_mut(), &mut size), what)?;
    let mut bytes = vec![0u8; size];
    check(
        query(size, bytes.as_mut_ptr().cast(), ptr::null_mut()),
        what,
    )?;
    Ok(bytes)
}

fn bytes_to_string(mut bytes: Vec<u8>) -> String {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn platform_string(api: &Api, platform: cl_platform_id, param: cl_uint) -> Result<String> {
    query_bytes("clGetPlatformInfo", |size, value, size_ret| {
        // SAFETY: `value` is null with size 0 or points to `size` writable bytes.
        unsafe { (api.clGetPlatformInfo)(platform, param, size, value, size_ret) }
    })
    .map(bytes_to_string)
}

fn device_string(api: &Api, device: cl_device_id, param: cl_uint) -> Result<String> {
    query_bytes("clGetDeviceInfo", |size, value, size_ret| {
        // SAFETY: `value` is null with size 0 or points to `size` writable bytes.
        unsafe { (api.clGetDeviceInfo)(device, param, size, value, size_ret) }
    })
    .map(bytes_to_string)
}

/// An OpenCL device. Devices a platform reports are never released, so the handle stays valid
/// for the whole process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device(cl_device_id);

// SAFETY: a device handle is an immutable, thread-safe driver object (OpenCL 1.1+, A.2).
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    /// # Safety
    /// `raw` must be a device handle of the loaded OpenCL library that stays valid while the
    /// `Device` is used (root devices always do; a sub-device until it is released).
    pub unsafe fn from_raw(raw: cl_device_id) -> Device {
        Device(raw)
    }

    pub fn raw(self) -> cl_device_id {
        self.0
    }
}

/// A context the caller owns, borrowed for `'a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextRef<'a> {
    raw: cl_context,
    _borrow: PhantomData<&'a ()>,
}

impl ContextRef<'_> {
    /// # Safety
    /// `raw` must be a live context of the loaded OpenCL library for as long as the returned
    /// value (and anything built with it) is used.
    pub unsafe fn from_raw<'a>(raw: cl_context) -> ContextRef<'a> {
        ContextRef {
            raw,
            _borrow: PhantomData,
        }
    }

    pub fn raw(self) -> cl_context {
        self.raw
    }

    /// The devices the context was created with (`CL_CONTEXT_DEVICES`), in its order.
    pub(crate) fn devices(self, api: &Api) -> Result<Vec<Device>> {
        let what = "clGetContextInfo(CL_CONTEXT_DEVICES)";
        let query = |size, value: *mut cl_device_id, size_ret| {
            // SAFETY: the context is live (`ContextRef`); `value` is null with size 0 or
            // points to `size` writable bytes.
            unsafe {
                (api.clGetContextInfo)(self.raw, CL_CONTEXT_DEVICES, size, value.cast(), size_ret)
            }
        };
        let mut size = 0usize;
        check(query(0, ptr::null_mut(), &mut size), what)?;
        let mut devices = vec![ptr::null_mut(); size / size_of::<cl_device_id>()];
        let size = devices.len() * size_of::<cl_device_id>();
        check(query(size, devices.as_mut_ptr(), ptr::null_mut()), what)?;
        Ok(devices.into_iter().map(Device).collect())
    }
}

/// Every device of every platform the loader reports, in platform order. An ICD loader with
/// no platform installed reports `CL_PLATFORM_NOT_FOUND_KHR`; that is an empty list here.
pub(crate) fn all_devices(api: &Api) -> Result<Vec<Device>> {
    let mut count: cl_uint = 0;
    // SAFETY: a null list with 0 entries only asks for the count.
    let code = unsafe { (api.clGetPlatformIDs)(0, ptr::null_mut(), &mut count) };
    if code == CL_PLATFORM_NOT_FOUND_KHR || count == 0 {
        return Ok(Vec::new());
    }
    check(code, "clGetPlatformIDs")?;
    let mut platforms = vec![ptr::null_mut(); count as usize];
    // SAFETY: `platforms` has room for `count` handles.
    let code = unsafe { (api.clGetPlatformIDs)(count, platforms.as_mut_ptr(), ptr::null_mut()) };
    check(code, "clGetPlatformIDs")?;
    let mut devices = Vec::new();
    for platform in platforms {
        let mut n: cl_uint = 0;
        // SAFETY: a null list with 0 entries only asks for the count.
        let code = unsafe {
            (api.clGetDeviceIDs)(platform, CL_DEVICE_TYPE_ALL, 0, ptr::null_mut(), &mut n)
        };
        if code == CL_DEVICE_NOT_FOUND || n == 0 {
            continue;
        }
        check(code, "clGetDeviceIDs")?;
        let start = devices.len();
        devices.resize(start + n as usize, ptr::null_mut());
        // SAFETY: `devices[start..]` has room for `n` handles.
        let code = unsafe {
            (api.clGetDeviceIDs)(
                platform,
                CL_DEVICE_TYPE_ALL,
                n,
                devices[start..].as_mut_ptr(),
                ptr::null_mut(),
            )
        };
        check(code, "clGetDeviceIDs")?;
    }
    Ok(devices.into_iter().map(Device).collect())
}

/// What makes a program binary valid on a device: it goes into the disk key, so a driver
/// update or another device never sees a binary it did not produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceIdentity {
    pub platform_name: String,
    pub platform_version: String,
    pub device_name: String,
    pub device_version: String,
    pub driver_version: String,
    pub opencl_c_version: String,
}

impl DeviceIdentity {
    /// Asks the driver for `device`'s identity, through the loaded OpenCL library.
    pub fn query(device: Device) -> Result<DeviceIdentity> {
        DeviceIdentity::query_with(Api::get()?, device)
    }

    pub(crate) fn query_with(api: &Api, device: Device) -> Result<DeviceIdentity> {
        let device = device.0;
        let mut platform: cl_platform_id = ptr::null_mut();
        // SAFETY: the value buffer is one platform handle, and its size is passed.
        let code = unsafe {
            (api.clGetDeviceInfo)(
                device,
                CL_DEVICE_PLATFORM,
                size_of::<cl_platform_id>(),
                (&raw mut platform).cast(),
                ptr::null_mut(),
            )
        };
        check(code, "clGetDeviceInfo(CL_DEVICE_PLATFORM)")?;
        Ok(DeviceIdentity {
            platform_name: platform_string(api, platform, CL_PLATFORM_NAME)?,
            platform_version: platform_string(api, platform, CL_PLATFORM_VERSION)?,
            device_name: device_string(api, device, CL_DEVICE_NAME)?,
            device_version: device_string(api, device, CL_DEVICE_VERSION)?,
            driver_version: device_string(api, device, CL_DRIVER_VERSION)?,
            opencl_c_version: device_string(api, device, CL_DEVICE_OPENCL_C_VERSION)?,
        })
    }
}

/// Build options as the C string `clBuildProgram` wants.
pub(crate) fn options_cstring(options: &str) -> Result<CString> {
    CString::new(options)
        .map_err(|_| Error::InvalidArgument("build options contain a NUL byte".into()))
}

/// One reference to a program, released on drop. Cloning retains another reference.
pub struct Program {
    api: &'static Api,
    raw: cl_program,
}

// SAFETY: program objects are thread-safe driver objects (OpenCL 1.1+, appendix A.2); kernels
// created from the handle are the caller's to synchronise.
unsafe impl Send for Program {}
// SAFETY: as above.
unsafe impl Sync for Program {}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Program({:p})", self.raw)
    }
}

impl Program {
    pub fn raw(&self) -> cl_program {
        self.raw
    }

    /// Gives the reference up to the caller, who releases it with `clReleaseProgram`.
    pub fn into_raw(self) -> cl_program {
        ManuallyDrop::new(self).raw
    }

    /// Another reference to the same program (`clRetainProgram`).
    pub fn retain(&self) -> Result<Program> {
        // SAFETY: `self` owns a reference, so the program is live.
        check(
            unsafe { (self.api.clRetainProgram)(self.raw) },
            "clRetainProgram",
        )?;
        Ok(Program {
            api: self.api,
            raw: self.raw,
        })
    }

    /// A `clGetProgramInfo` query whose answer is one plain value; `what` names it in errors.
    ///
    /// # Safety
    /// `T` must be the type the specification gives for `param`'s answer.
    unsafe fn scalar_info<T: Copy + Default>(&self, param: cl_uint, what: &str) -> Result<T> {
        let mut value = T::default();
        // SAFETY: the answer is one `T` (the caller's promise), whose size is passed; the
        // program is live.
        let code = unsafe {
            (self.api.clGetProgramInfo)(
                self.raw,
                param,
                size_of::<T>(),
                (&raw mut value).cast(),
                ptr::null_mut(),
            )
        };
        check(code, what)?;
        Ok(value)
    }

    /// The binary of a program built for exactly one device (`CL_PROGRAM_BINARIES`).
    pub fn binary(&self) -> Result<Vec<u8>> {
        // SAFETY: the program has one device, so the answer is one `size_t`.
        let size: usize = unsafe {
            self.scalar_info(
                CL_PROGRAM_BINARY_SIZES,
                "clGetProgramInfo(CL_PROGRAM_BINARY_SIZES)",
            )
        }?;
        if size == 0 {
            return Err(Error::Backend(
                "the driver reported an empty program binary".into(),
            ));
        }
        let mut binary = vec![0u8; size];
        let mut data = binary.as_mut_ptr();
        // SAFETY: CL_PROGRAM_BINARIES takes an array of one pointer per device (one here); the
        // driver writes `size` bytes through it, which `binary` holds.
        let code = unsafe {
            (self.api.clGetProgramInfo)(
                self.raw,
                CL_PROGRAM_BINARIES,
                size_of::<*mut u8>(),
                (&raw mut data).cast(),
                ptr::null_mut(),
            )
        };
        check(code, "clGetProgramInfo(CL_PROGRAM_BINARIES)")?;
        Ok(binary)
    }

    /// The names of the program's kernels, `;`-separated as the driver gives them
    /// (`CL_PROGRAM_KERNEL_NAMES`, OpenCL 1.2).
    pub fn kernel_names(&self) -> Result<String> {
        query_bytes(
            "clGetProgramInfo(CL_PROGRAM_KERNEL_NAMES)",
            |size, value, size_ret| {
                // SAFETY: `value` is null with size 0 or points to `size` writable bytes; the
                // program is live.
                unsafe {
                    (self.api.clGetProgramInfo)(
                        self.raw,
                        CL_PROGRAM_KERNEL_NAMES,
                        size,
                        value,
                        size_ret,
                    )
                }
            },
        )
        .map(bytes_to_string)
    }

    fn build_log(&self, device: cl_device_id) -> String {
        query_bytes("clGetProgramBuildInfo", |size, value, size_ret| {
            // SAFETY: `value` is null with size 0 or points to `size` writable bytes.
            unsafe {
                (self.api.clGetProgramBuildInfo)(
                    self.raw,
                    device,
                    CL_PROGRAM_BUILD_LOG,
                    size,
                    value,
                    size_ret,
                )
            }
        })
        .map(bytes_to_string)
        .unwrap_or_else(|e| format!("(no build log: {e})"))
    }

    /// Makes the program for `devices` (one or more) into `what`. On failure the program is
    /// released (dropped) and the error carries the OpenCL status and the compiler's log (of
    /// the first device).
    fn make(
        self,
        devices: &[cl_device_id],
        options: &CString,
        what: Make<'_>,
    ) -> std::result::Result<Program, BuildError> {
        let count = devices.len() as cl_uint;
        // SAFETY: the program is live and belongs to a context containing `devices`, `count`
        // of them; `options` is a C string that outlives the call; the headers are live
        // programs, one name each; without a callback the call is synchronous.
        let (code, call) = unsafe {
            match what {
                Make::Executable => (
                    (self.api.clBuildProgram)(
                        self.raw,
                        count,
                        devices.as_ptr(),
                        options.as_ptr(),
                        None,
                        ptr::null_mut(),
                    ),
                    "clBuildProgram",
                ),
                Make::Object(headers) => (
                    (self.api.clCompileProgram)(
                        self.raw,
                        count,
                        devices.as_ptr(),
                        options.as_ptr(),
                        headers.programs.len() as cl_uint,
                        headers.programs.as_ptr(),
                        headers.names.as_ptr(),
                        None,
                        ptr::null_mut(),
                    ),
                    "clCompileProgram",
                ),
            }
        };
        if code == CL_SUCCESS {
            return Ok(self);
        }
        Err(BuildError::new(
            code,
            format!(
                "{call}: {} ({code})\n{}",
                status_name(code),
                self.build_log(devices[0])
            ),
        ))
    }
}

/// The memory tier's way to give the program back: what the driver said is reported, which
/// drop cannot.
impl Destroy for Program {
    fn destroy(self) -> std::result::Result<(), DestroyError> {
        let this = ManuallyDrop::new(self);
        // SAFETY: gives up the one reference `this` owns; `this` is never used again.
        let code = unsafe { (this.api.clReleaseProgram)(this.raw) };
        if code == CL_SUCCESS {
            Ok(())
        } else {
            Err(DestroyError::new(
                code,
                format!("clReleaseProgram: {} ({code})", status_name(code)),
            ))
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: gives up the one reference `self` owns.
        unsafe { (self.api.clReleaseProgram)(self.raw) };
    }
}

/// The headers a compile embeds (`clCompileProgram`'s input headers): programs created from
/// their source, each under the name a source includes it by.
#[derive(Clone, Copy)]
pub(crate) struct EmbeddedHeaders<'a> {
    pub programs: &'a [cl_program],
    pub names: &'a [*const c_char],
}

/// What a program from source is made into: an executable (`clBuildProgram`), or a compiled
/// object for `clLinkProgram` (`clCompileProgram`).
#[derive(Clone, Copy)]
pub(crate) enum Make<'a> {
    Executable,
    Object(EmbeddedHeaders<'a>),
}

/// `clCreateProgramWithSource` + `clBuildProgram`.
pub(crate) fn build_from_source(
    api: &'static Api,
    context: ContextRef<'_>,
    device: Device,
    sources: &[&str],
    options: &CString,
) -> std::result::Result<Program, BuildError> {
    make_from_source(api, context, device, sources, options, Make::Executable)
}

/// `clCreateProgramWithSource`, then `clBuildProgram` or `clCompileProgram`.
pub(crate) fn make_from_source(
    api: &'static Api,
    context: ContextRef<'_>,
    device: Device,
    sources: &[&str],
    options: &CString,
    what: Make<'_>,
) -> std::result::Result<Program, BuildError> {
    let strings: Vec<*const c_char> = sources.iter().map(|s| s.as_ptr().cast()).collect();
    let lengths: Vec<usize> = sources.iter().map(|s| s.len()).collect();
    let count = cl_uint::try_from(sources.len())
        .map_err(|_| BuildError::new(CL_INVALID_VALUE, "too many source strings"))?;
    let mut code = CL_SUCCESS;
    // SAFETY: the context is live (`ContextRef`); `strings` and `lengths` both hold `count`
    // entries, each pointer valid for its length (given, so no NUL terminator is needed).
    let raw = unsafe {
        (api.clCreateProgramWithSource)(
            context.raw,
            count,
            strings.as_ptr(),
            lengths.as_ptr(),
            &mut code,
        )
    };
    if raw.is_null() || code != CL_SUCCESS {
        return Err(BuildError::new(
            code,
            format!("clCreateProgramWithSource: {} ({code})", status_name(code)),
        ));
    }
    Program { api, raw }.make(&[device.0], options, what)
}

/// `clCreateProgramWithBinary` + `clBuildProgram`, or for a compiled object the program
/// alone: it is linked as it is. The error is what the driver said about the binary; the
/// caller decides whether to fall back to the source.
pub(crate) fn build_from_binary(
    api: &'static Api,
    context: ContextRef<'_>,
    device: Device,
    binary: &[u8],
    options: &CString,
    what: Make<'_>,
) -> std::result::Result<Program, BuildError> {
    build_from_binaries(api, context, &[(device, binary)], options, what)
}

/// [`build_from_binary`] of one program for several devices of `context`, a binary each.
pub(crate) fn build_from_binaries(
    api: &'static Api,
    context: ContextRef<'_>,
    binaries: &[(Device, &[u8])],
    options: &CString,
    what: Make<'_>,
) -> std::result::Result<Program, BuildError> {
    let devices: Vec<cl_device_id> = binaries.iter().map(|(device, _)| device.0).collect();
    let lengths: Vec<usize> = binaries.iter().map(|(_, binary)| binary.len()).collect();
    let data: Vec<*const u8> = binaries.iter().map(|(_, binary)| binary.as_ptr()).collect();
    let mut binary_status = vec![CL_SUCCESS; binaries.len()];
    let mut code = CL_SUCCESS;
    // SAFETY: a live context and devices of it; as many binaries, each of its length in
    // readable bytes, and status outputs, one per device.
    let raw = unsafe {
        (api.clCreateProgramWithBinary)(
            context.raw,
            devices.len() as cl_uint,
            devices.as_ptr(),
            lengths.as_ptr(),
            data.as_ptr(),
            binary_status.as_mut_ptr(),
            &mut code,
        )
    };
    let program = (!raw.is_null()).then_some(Program { api, raw });
    if program.is_none() || code != CL_SUCCESS {
        let code = match code {
            CL_SUCCESS => binary_status
                .into_iter()
                .find(|&status| status != CL_SUCCESS)
                .unwrap_or(CL_INVALID_BINARY),
            code => code,
        };
        return Err(BuildError::new(
            code,
            format!("clCreateProgramWithBinary: {} ({code})", status_name(code)),
        ));
    }
    let program = program.expect("checked non-null above");
    match what {
        Make::Executable => program.make(&devices, options, what),
        Make::Object(_) => Ok(program),
    }
}
