//! The program-creating entry points: a program from source is remembered with its context
//! and source, so that its build can be served; any other kind of program makes the layer
//! forget whatever it knew at the returned handle.

use std::ffi::{CStr, c_char, c_void};

use super::layer;
use crate::backend::opencl::sys::*;

/// The concatenated source strings of `clCreateProgramWithSource`, if they are text.
///
/// # Safety
/// The arguments must be as the specification says, which the driver checked.
unsafe fn source_text(
    count: cl_uint,
    strings: *const *const c_char,
    lengths: *const usize,
) -> Option<String> {
    let mut text = Vec::new();
    for i in 0..count as usize {
        // SAFETY: `strings` holds `count` pointers, `lengths` (if not null) `count` lengths;
        // a length of 0 marks a NUL-terminated string.
        let bytes = unsafe {
            let string = *strings.add(i);
            match if lengths.is_null() {
                0
            } else {
                *lengths.add(i)
            } {
                0 => CStr::from_ptr(string).to_bytes(),
                length => std::slice::from_raw_parts(string.cast::<u8>(), length),
            }
        };
        text.extend_from_slice(bytes);
    }
    String::from_utf8(text).ok()
}

pub(super) unsafe extern "C" fn create_program_with_source(
    context: cl_context,
    count: cl_uint,
    strings: *const *const c_char,
    lengths: *const usize,
    errcode_ret: *mut cl_int,
) -> cl_program {
    let layer = layer();
    // SAFETY: the application's call, passed on.
    let program = unsafe {
        (layer.api.clCreateProgramWithSource)(context, count, strings, lengths, errcode_ret)
    };
    if !program.is_null() {
        // SAFETY: the driver accepted the strings.
        match unsafe { source_text(count, strings, lengths) } {
            Some(text) => layer.tracked.add(program as usize, context as usize, text),
            None => {
                layer.tracked.forget(program as usize);
            }
        }
    }
    program
}

/// Forgets what was known of a handle the driver reused for a program not from source.
pub(super) fn not_from_source(program: cl_program) -> cl_program {
    if !program.is_null() {
        layer().tracked.forget(program as usize);
    }
    program
}

pub(super) unsafe extern "C" fn create_program_with_binary(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    lengths: *const usize,
    binaries: *const *const u8,
    binary_status: *mut cl_int,
    errcode_ret: *mut cl_int,
) -> cl_program {
    // SAFETY: the application's call, passed on.
    not_from_source(unsafe {
        (layer().api.clCreateProgramWithBinary)(
            context,
            num_devices,
            device_list,
            lengths,
            binaries,
            binary_status,
            errcode_ret,
        )
    })
}

pub(super) unsafe extern "C" fn create_program_with_built_ins(
    context: cl_context,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    kernel_names: *const c_char,
    errcode_ret: *mut cl_int,
) -> cl_program {
    // SAFETY: the application's call, passed on.
    not_from_source(unsafe {
        (layer().next.with_built_ins)(context, num_devices, device_list, kernel_names, errcode_ret)
    })
}

pub(super) unsafe extern "C" fn create_program_with_il(
    context: cl_context,
    il: *const c_void,
    length: usize,
    errcode_ret: *mut cl_int,
) -> cl_program {
    // SAFETY: the application's call, passed on.
    not_from_source(unsafe { (layer().next.with_il)(context, il, length, errcode_ret) })
}
