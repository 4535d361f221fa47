//! kcache's OpenCL layer initialised in this process on a table of the ICD loader's exported
//! entry points (rather than by the loader through `OPENCL_LAYERS`), so that the benchmark can
//! time one call through the layer's table and the same call straight to the loader, side by
//! side in one process.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};
use std::path::Path;
use std::ptr;

use kcache::backend::opencl::{cl_device_id, cl_int, cl_program};
use kcache::{Error, Result};
use libloading::Library;

use crate::opencl::{BuiltProgram, Context};

type cl_uint = u32;

/// Slots of `struct _cl_icd_dispatch` (`CL/cl_icd.h`) that the layer reads or replaces, with
/// their entry point: the layer refuses a table with any of them empty.
const SLOTS: [(usize, &str); 21] = [
    (0, "clGetPlatformIDs"),
    (1, "clGetPlatformInfo"),
    (2, "clGetDeviceIDs"),
    (3, "clGetDeviceInfo"),
    (8, "clGetContextInfo"),
    (26, "clCreateProgramWithSource"),
    (27, "clCreateProgramWithBinary"),
    (28, "clRetainProgram"),
    (29, "clReleaseProgram"),
    (30, "clBuildProgram"),
    (32, "clGetProgramInfo"),
    (33, "clGetProgramBuildInfo"),
    (34, "clCreateKernel"),
    (35, "clCreateKernelsInProgram"),
    (37, "clReleaseKernel"),
    (39, "clGetKernelInfo"),
    (97, "clCreateProgramWithBuiltInKernels"),
    (98, "clCompileProgram"),
    (99, "clLinkProgram"),
    (137, "clCloneKernel"),
    (138, "clCreateProgramWithIL"),
];
/// Slots in the OpenCL 3.0 header's table.
const TABLE_LEN: usize = 149;
const GET_DEVICE_INFO: usize = 3;
const CREATE_PROGRAM_WITH_SOURCE: usize = 26;
const RELEASE_PROGRAM: usize = 29;
const BUILD_PROGRAM: usize = 30;
const GET_PROGRAM_BUILD_INFO: usize = 33;

const CL_DEVICE_MAX_COMPUTE_UNITS: cl_uint = 0x1002;
const CL_PROGRAM_BUILD_STATUS: cl_uint = 0x1181;

type InitLayer =
    unsafe extern "C" fn(cl_uint, *const c_void, *mut cl_uint, *mut *const c_void) -> cl_int;
type DeviceInfo =
    unsafe extern "C" fn(cl_device_id, cl_uint, usize, *mut c_void, *mut usize) -> cl_int;
type BuildInfo = unsafe extern "C" fn(
    cl_program,
    cl_device_id,
    cl_uint,
    usize,
    *mut c_void,
    *mut usize,
) -> cl_int;
type WithSource = unsafe extern "C" fn(
    *mut c_void,
    cl_uint,
    *const *const c_char,
    *const usize,
    *mut cl_int,
) -> cl_program;
type Build = unsafe extern "C" fn(
    cl_program,
    cl_uint,
    *const cl_device_id,
    *const c_char,
    Option<unsafe extern "C" fn(cl_program, *mut c_void)>,
    *mut c_void,
) -> cl_int;
type Release = unsafe extern "C" fn(cl_program) -> cl_int;

/// The loader's table and the layer's, both valid for the process.
pub struct LayerTable {
    loader: &'static [*const c_void],
    layer: &'static [*const c_void],
}

/// Reads slot `slot` of `table` as the function type `F`.
///
/// # Safety
/// `F` must be the type of the entry point the header puts in `slot`, and the slot filled.
unsafe fn entry<F: Copy>(table: &[*const c_void], slot: usize) -> F {
    // SAFETY: the caller's promise; function and data pointers have one size here.
    unsafe { std::mem::transmute_copy::<*const c_void, F>(&table[slot]) }
}

impl LayerTable {
    /// Opens the layer at `path` and initialises it on the loader's entry points.
    pub fn load(path: &Path) -> Result<LayerTable> {
        let failed =
            |what: &str, e: &dyn std::fmt::Display| Error::Unavailable(format!("{what}: {e}"));
        // SAFETY: the ICD loader and kcache's layer, whose initialisers are plain.
        let loader =
            unsafe { Library::new("libOpenCL.so.1") }.map_err(|e| failed("libOpenCL.so.1", &e))?;
        let mut table = vec![ptr::null::<c_void>(); TABLE_LEN];
        for (slot, name) in SLOTS {
            // SAFETY: read as an untyped address, only to be called with its own prototype.
            let symbol = unsafe { loader.get::<*const c_void>(name.as_bytes()) }
                .map_err(|e| failed(name, &e))?;
            table[slot] = *symbol;
        }
        // The loader stays loaded for the process, and both tables with it.
        std::mem::forget(loader);
        let loader: &'static [*const c_void] = Vec::leak(table);
        // SAFETY: as above.
        let layer = unsafe { Library::new(path) }.map_err(|e| failed("the layer", &e))?;
        // SAFETY: clInitLayer's prototype (CL/cl_layer.h).
        let init = *unsafe { layer.get::<InitLayer>(b"clInitLayer") }
            .map_err(|e| failed("clInitLayer", &e))?;
        let mut entries: cl_uint = 0;
        let mut out: *const c_void = ptr::null();
        // SAFETY: a table of TABLE_LEN slots valid for the process; both outputs writable.
        let code = unsafe {
            init(
                TABLE_LEN as cl_uint,
                loader.as_ptr().cast(),
                &mut entries,
                &mut out,
            )
        };
        if code != 0 || out.is_null() {
            return Err(Error::Backend(format!("clInitLayer failed: {code}")));
        }
        std::mem::forget(layer);
        // SAFETY: the layer's table of `entries` slots, kept for the process.
        let layer = unsafe { std::slice::from_raw_parts(out.cast(), entries as usize) };
        Ok(LayerTable { loader, layer })
    }

    fn table(&self, through_layer: bool) -> &'static [*const c_void] {
        if through_layer {
            self.layer
        } else {
            self.loader
        }
    }

    /// Whether the layer leaves `clGetDeviceInfo` to the loader's own entry point.
    pub fn passes_device_info_through(&self) -> bool {
        self.layer[GET_DEVICE_INFO] == self.loader[GET_DEVICE_INFO]
    }

    /// `source` created and built through the layer in `context`: a program the layer serves.
    pub fn build(&self, context: &Context, source: &str) -> Result<ServedProgram> {
        // SAFETY: the header's slots, filled by `load`.
        let (create, build): (WithSource, Build) = unsafe {
            (
                entry(self.layer, CREATE_PROGRAM_WITH_SOURCE),
                entry(self.layer, BUILD_PROGRAM),
            )
        };
        let strings = [source.as_ptr().cast::<c_char>()];
        let lengths = [source.len()];
        let mut code = 0;
        // SAFETY: a live context; one string of the given length.
        let raw = unsafe {
            create(
                context.context().raw(),
                1,
                strings.as_ptr(),
                lengths.as_ptr(),
                &mut code,
            )
        };
        if raw.is_null() {
            return Err(Error::Backend(format!("clCreateProgramWithSource: {code}")));
        }
        let program = ServedProgram {
            raw,
            table: self.layer,
        };
        // SAFETY: a live program of that context; no options, no callback.
        let code = unsafe { build(raw, 0, ptr::null(), ptr::null(), None, ptr::null_mut()) };
        if code != 0 {
            return Err(Error::Backend(format!("clBuildProgram: {code}")));
        }
        Ok(program)
    }

    /// `clGetProgramBuildInfo(CL_PROGRAM_BUILD_STATUS)` of `program`, a call the layer
    /// intercepts: through the layer for a program it served, straight to the loader for one
    /// the driver built ([`Context::build_uncached`]), so that both answers come from a built
    /// program.
    pub fn build_status(
        &self,
        through_layer: bool,
        program: &impl BuiltProgram,
        context: &Context,
    ) -> cl_int {
        // SAFETY: the header's slot.
        let query: BuildInfo = unsafe { entry(self.table(through_layer), GET_PROGRAM_BUILD_INFO) };
        let device = context.device().raw();
        answer(|size, value| {
            // SAFETY: a live program and device; `value` holds `size` bytes.
            unsafe {
                query(
                    program.raw(),
                    device,
                    CL_PROGRAM_BUILD_STATUS,
                    size,
                    value,
                    ptr::null_mut(),
                )
            }
        })
    }

    /// `clGetDeviceInfo(CL_DEVICE_MAX_COMPUTE_UNITS)`, a call the layer passes through.
    pub fn compute_units(&self, through_layer: bool, context: &Context) -> cl_uint {
        // SAFETY: the header's slot.
        let query: DeviceInfo = unsafe { entry(self.table(through_layer), GET_DEVICE_INFO) };
        let device = context.device().raw();
        answer(|size, value| {
            // SAFETY: a root device; `value` holds `size` bytes.
            unsafe {
                query(
                    device,
                    CL_DEVICE_MAX_COMPUTE_UNITS,
                    size,
                    value,
                    ptr::null_mut(),
                )
            }
        })
    }
}

/// The one value of type `T` an info query writes (`fill(size, value)`).
fn answer<T: Default>(fill: impl FnOnce(usize, *mut c_void) -> cl_int) -> T {
    let mut value = T::default();
    fill(size_of::<T>(), (&raw mut value).cast());
    value
}

/// A program built through the layer, released through it on drop.
pub struct ServedProgram {
    raw: cl_program,
    table: &'static [*const c_void],
}

impl BuiltProgram for ServedProgram {
    fn raw(&self) -> cl_program {
        self.raw
    }
}

impl Drop for ServedProgram {
    fn drop(&mut self) {
        // SAFETY: the header's slot; the one reference `build` created.
        unsafe {
            let release: Release = entry(self.table, RELEASE_PROGRAM);
            release(self.raw);
        }
    }
}
