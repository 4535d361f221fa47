//! The ICD dispatch table (`struct _cl_icd_dispatch` of `CL/cl_icd.h`) as the loader hands it
//! to a layer: one entry point per slot, in the header's order. The layer copies the next
//! table whole and replaces only the slots it intercepts, so every other call goes from the
//! loader straight to the next table's entry, with nothing of the layer in between.

use std::ffi::c_void;

use crate::backend::opencl::sys::Api;

/// Slots of the entry points the layer calls or replaces (their index in the header's struct).
pub(super) mod slot {
    pub const GET_PLATFORM_IDS: usize = 0;
    pub const GET_PLATFORM_INFO: usize = 1;
    pub const GET_DEVICE_IDS: usize = 2;
    pub const GET_DEVICE_INFO: usize = 3;
    pub const GET_CONTEXT_INFO: usize = 8;
    pub const CREATE_PROGRAM_WITH_SOURCE: usize = 26;
    pub const CREATE_PROGRAM_WITH_BINARY: usize = 27;
    pub const RETAIN_PROGRAM: usize = 28;
    pub const RELEASE_PROGRAM: usize = 29;
    pub const BUILD_PROGRAM: usize = 30;
    pub const GET_PROGRAM_INFO: usize = 32;
    pub const GET_PROGRAM_BUILD_INFO: usize = 33;
    pub const CREATE_KERNEL: usize = 34;
    pub const CREATE_KERNELS_IN_PROGRAM: usize = 35;
    pub const RELEASE_KERNEL: usize = 37;
    pub const GET_KERNEL_INFO: usize = 39;
    pub const CREATE_PROGRAM_WITH_BUILT_IN_KERNELS: usize = 97;
    pub const COMPILE_PROGRAM: usize = 98;
    pub const LINK_PROGRAM: usize = 99;
    pub const CLONE_KERNEL: usize = 137;
    /// OpenCL 2.1: the last slot the layer needs.
    pub const CREATE_PROGRAM_WITH_IL: usize = 138;
}

/// The fewest slots a loader's table must have for the layer to serve builds.
pub(super) const NEEDED: usize = slot::CREATE_PROGRAM_WITH_IL + 1;

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
        ($slot:ident) => {
            // SAFETY: the slot is the header's for the field of the same name, whose type is
            // that entry point's prototype.
            unsafe { entry(table, slot::$slot) }?
        };
    }
    Some(Api {
        clGetPlatformIDs: next!(GET_PLATFORM_IDS),
        clGetPlatformInfo: next!(GET_PLATFORM_INFO),
        clGetDeviceIDs: next!(GET_DEVICE_IDS),
        clGetDeviceInfo: next!(GET_DEVICE_INFO),
        clGetContextInfo: next!(GET_CONTEXT_INFO),
        clCreateProgramWithSource: next!(CREATE_PROGRAM_WITH_SOURCE),
        clCreateProgramWithBinary: next!(CREATE_PROGRAM_WITH_BINARY),
        clBuildProgram: next!(BUILD_PROGRAM),
        clGetProgramInfo: next!(GET_PROGRAM_INFO),
        clGetProgramBuildInfo: next!(GET_PROGRAM_BUILD_INFO),
        clRetainProgram: next!(RETAIN_PROGRAM),
        clReleaseProgram: next!(RELEASE_PROGRAM),
        _library: None,
    })
}
