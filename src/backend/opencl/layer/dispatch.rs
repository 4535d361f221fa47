//! The ICD dispatch table (`struct _cl_icd_dispatch` of `CL/cl_icd.h`) as the loader hands it
//! to a layer: one entry point per slot, in the header's order. The layer copies the next
//! table whole and replaces only the slots it intercepts, so every other call goes from the
//! loader straight to the next table's entry, with nothing of the layer in between.

use std::ffi::c_void;

use crate::backend::opencl::sys::{Api, api_table};

/// Slots of the entry points the layer calls or replaces: their index in the header's struct,
/// under the name of its field.
#[allow(non_upper_case_globals)]
pub(super) mod slot {
    pub const clGetPlatformIDs: usize = 0;
    pub const clGetPlatformInfo: usize = 1;
    pub const clGetDeviceIDs: usize = 2;
    pub const clGetDeviceInfo: usize = 3;
    pub const clGetContextInfo: usize = 8;
    pub const clCreateCommandQueue: usize = 9;
    pub const clRetainCommandQueue: usize = 10;
    pub const clReleaseCommandQueue: usize = 11;
    pub const clCreateProgramWithSource: usize = 26;
    pub const clCreateProgramWithBinary: usize = 27;
    pub const clRetainProgram: usize = 28;
    pub const clReleaseProgram: usize = 29;
    pub const clBuildProgram: usize = 30;
    pub const clGetProgramInfo: usize = 32;
    pub const clGetProgramBuildInfo: usize = 33;
    pub const clCreateKernel: usize = 34;
    pub const clCreateKernelsInProgram: usize = 35;
    pub const clReleaseKernel: usize = 37;
    pub const clGetKernelInfo: usize = 39;
    pub const clGetEventInfo: usize = 42;
    pub const clReleaseEvent: usize = 44;
    pub const clFlush: usize = 46;
    pub const clEnqueueNDRangeKernel: usize = 59;
    pub const clEnqueueTask: usize = 60;
    pub const clCreateProgramWithBuiltInKernels: usize = 97;
    pub const clCompileProgram: usize = 98;
    pub const clLinkProgram: usize = 99;
    pub const clEnqueueMarkerWithWaitList: usize = 105;
    pub const clCreateCommandQueueWithProperties: usize = 123;
    pub const clCloneKernel: usize = 137;
    /// OpenCL 2.1: the last slot the layer needs.
    pub const clCreateProgramWithIL: usize = 138;
}

/// The fewest slots a loader's table must have for the layer to serve builds.
pub(super) const NEEDED: usize = slot::clCreateProgramWithIL + 1;

/// Copies the entry point in `slot` as the function type `F`; `None` when the slot is empty.
///
/// # Safety
/// `F` must be the function pointer type of the entry point the header puts in `slot`.
pub(super) unsafe fn entry<F: Copy>(table: &[*const c_void], slot: usize) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*const c_void>()) };
    let pointer = table[slot];
    // SAFETY: a non-null slot holds the entry point of type `F` (the caller's promise), and a
    // function pointer has the size of a data pointer (checked above).
    (!pointer.is_null()).then(|| unsafe { std::mem::transmute_copy::<*const c_void, F>(&pointer) })
}

/// kcache's own calls, on the next table: they must not come back through the loader into
/// the layer. `None` when a slot kcache calls is empty.
pub(super) fn next_api(table: &[*const c_void]) -> Option<Api> {
    macro_rules! next {
        ($name:ident) => {
            // SAFETY: the slot is the header's for the field of the same name, whose type is
            // that entry point's prototype.
            unsafe { entry(table, slot::$name) }?
        };
    }
    Some(api_table!(next))
}
