//! The kernel entry points: kernels of a served program are made from the served build and
//! linked back to the application's program, so that `CL_KERNEL_PROGRAM` names its handle and
//! a kernel keeps that handle alive as a driver's kernel would.

use std::ffi::{c_char, c_void};
use std::ptr;

use super::{
    CL_KERNEL_PROGRAM, CL_KERNEL_REFERENCE_COUNT, Layer, answer_info, cl_kernel, last_reference,
    layer,
};
use crate::backend::opencl::sys::*;

/// The program kernels are made from: the served build of the application's `program` when
/// there is one, which the kernels made are then linked back to, else `program` itself.
struct Origin {
    layer: &'static Layer,
    program: cl_program,
    target: cl_program,
}

impl Origin {
    fn of(program: cl_program) -> Self {
        let layer = layer();
        Origin {
            layer,
            program,
            target: layer.built_or(program),
        }
    }

    /// Links `kernels`, made from the target, to the application's program (when the target
    /// is its served build).
    fn link(&self, kernels: &[cl_kernel]) {
        let served = self.target != self.program;
        self.layer.link(self.program, served, kernels);
    }
}

pub(super) unsafe extern "C" fn create_kernel(
    program: cl_program,
    name: *const c_char,
    errcode_ret: *mut cl_int,
) -> cl_kernel {
    let origin = Origin::of(program);
    // SAFETY: the application's call, on the program that answers it.
    let kernel = unsafe { (origin.layer.next.create_kernel)(origin.target, name, errcode_ret) };
    if !kernel.is_null() {
        origin.link(&[kernel]);
    }
    kernel
}

pub(super) unsafe extern "C" fn create_kernels_in_program(
    program: cl_program,
    num_kernels: cl_uint,
    kernels: *mut cl_kernel,
    num_kernels_ret: *mut cl_uint,
) -> cl_int {
    let origin = Origin::of(program);
    let mut made: cl_uint = 0;
    // SAFETY: the application's call, on the program that answers it.
    let code = unsafe {
        (origin.layer.next.create_kernels)(origin.target, num_kernels, kernels, &mut made)
    };
    if !num_kernels_ret.is_null() {
        // SAFETY: the application's output, which it passed.
        unsafe { *num_kernels_ret = made };
    }
    if code == CL_SUCCESS && !kernels.is_null() {
        // SAFETY: the driver wrote `made` kernels into the application's array.
        origin.link(unsafe { std::slice::from_raw_parts(kernels, made as usize) });
    }
    code
}

pub(super) unsafe extern "C" fn clone_kernel(
    source: cl_kernel,
    errcode_ret: *mut cl_int,
) -> cl_kernel {
    let layer = layer();
    // SAFETY: the application's call, passed on.
    let kernel = unsafe { (layer.next.clone_kernel)(source, errcode_ret) };
    if !kernel.is_null() {
        match layer.tracked.program_of(source as usize) {
            Some(program) => layer.link(program as cl_program, true, &[kernel]),
            None => layer.link(ptr::null_mut(), false, &[kernel]),
        }
    }
    kernel
}

pub(super) unsafe extern "C" fn release_kernel(kernel: cl_kernel) -> cl_int {
    let layer = layer();
    let Some(program) = layer.tracked.program_of(kernel as usize) else {
        // SAFETY: the application's call, passed on.
        return unsafe { (layer.next.release_kernel)(kernel) };
    };
    let last = last_reference(layer.next.kernel_info, kernel, CL_KERNEL_REFERENCE_COUNT);
    if last {
        // Before the release: the driver may hand the handle out again right after it.
        layer.tracked.unlink_kernel(kernel as usize);
    }
    // SAFETY: the application's call, passed on.
    let released = unsafe { (layer.next.release_kernel)(kernel) };
    if last {
        layer.release_program(program as cl_program);
    }
    released
}

pub(super) unsafe extern "C" fn get_kernel_info(
    kernel: cl_kernel,
    param: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    let layer = layer();
    let linked = match param {
        CL_KERNEL_PROGRAM => layer.tracked.program_of(kernel as usize),
        _ => None,
    };
    match linked {
        // The application's program, not the served build the kernel was made from.
        // SAFETY: the application's outputs, as the specification has them.
        Some(program) => unsafe { answer_info(&program.to_ne_bytes(), size, value, size_ret) },
        // SAFETY: the application's call, passed on.
        None => unsafe { (layer.next.kernel_info)(kernel, param, size, value, size_ret) },
    }
}
