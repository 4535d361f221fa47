//! kcache's OpenCL layer: the ICD loader puts it between an unmodified program and the driver
//! (`OPENCL_LAYERS`), and it serves the program's `clBuildProgram` calls on source programs
//! from kcache's tiers, configured by the same `KCACHE_*` variables as the library.
//!
//! The layer library itself (`libkcache_opencl_layer.so`, the `layers/opencl` crate) only
//! exports [`layer_info`] and [`init_layer`] as `clGetLayerInfo` and `clInitLayer`.
//! `docs/opencl-layer.md` says what is intercepted, what is passed through, and why.

mod dispatch;
mod entry;
mod tracked;

use std::ffi::c_void;

use super::sys::{CL_INVALID_VALUE, CL_SUCCESS, cl_int, cl_uint};
use crate::log;

const CL_LAYER_API_VERSION: cl_uint = 0x4240;
const CL_LAYER_NAME: cl_uint = 0x4241;
const CL_LAYER_API_VERSION_100: cl_uint = 100;
/// What `clGetLayerInfo(CL_LAYER_NAME)` answers.
const LAYER_NAME: &[u8] = b"kcache OpenCL program cache\0";

/// `clGetLayerInfo`: the layer API version and the layer's name.
///
/// # Safety
/// As the specification has it: `value` is null or holds `size` writable bytes, and
/// `size_ret` is null or writable.
pub unsafe fn layer_info(
    param: cl_uint,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    let version = CL_LAYER_API_VERSION_100.to_ne_bytes();
    let answer: &[u8] = match param {
        CL_LAYER_API_VERSION => &version,
        CL_LAYER_NAME => LAYER_NAME,
        _ => return CL_INVALID_VALUE,
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { answer_info(answer, size, value, size_ret) }
}

/// Answers an info query (`clGet*Info`) with `answer`: copied into `value` when not null (and
/// `CL_INVALID_VALUE` when its `size` bytes cannot hold it), its length into `size_ret` when
/// not null.
///
/// # Safety
/// As the specification has it: `value` is null or holds `size` writable bytes, and
/// `size_ret` is null or writable.
unsafe fn answer_info(
    answer: &[u8],
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    if !value.is_null() && size < answer.len() {
        return CL_INVALID_VALUE;
    }
    // SAFETY: `value` holds at least `answer.len()` bytes (checked), `size_ret` is writable;
    // both only when not null.
    unsafe {
        if !value.is_null() {
            std::ptr::copy_nonoverlapping(answer.as_ptr(), value.cast(), answer.len());
        }
        if !size_ret.is_null() {
            *size_ret = answer.len();
        }
    }
    CL_SUCCESS
}

/// `clInitLayer`: copies the next dispatch table (`target`, `num_entries` slots) and hands
/// the loader the copy with the layer's entry points in it. A table too short for them, or a
/// second initialisation, gets the plain copy: every call then goes straight through.
///
/// # Safety
/// `target` must point to `num_entries` entry points that stay valid for the process, as
/// the loader's table does; the two outputs must be writable.
pub unsafe fn init_layer(
    num_entries: cl_uint,
    target: *const c_void,
    num_entries_ret: *mut cl_uint,
    layer_dispatch_ret: *mut *const c_void,
) -> cl_int {
    if target.is_null() || num_entries_ret.is_null() || layer_dispatch_ret.is_null() {
        return CL_INVALID_VALUE;
    }
    // SAFETY: the loader's table of `num_entries` slots, valid for the process.
    let next =
        unsafe { std::slice::from_raw_parts(target.cast::<*const c_void>(), num_entries as usize) };
    let mut table = next.to_vec();
    if table.len() < dispatch::NEEDED || !entry::install(&mut table) {
        log::info(|| "OpenCL layer: every call goes straight to the driver".to_string());
    }
    // The loader keeps the table for the rest of the process.
    let table: &'static [*const c_void] = Vec::leak(table);
    // SAFETY: both outputs are writable (checked non-null; the caller's promise).
    unsafe {
        *num_entries_ret = num_entries;
        *layer_dispatch_ret = table.as_ptr().cast();
    }
    CL_SUCCESS
}
