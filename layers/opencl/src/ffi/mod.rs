//! The layer's exported entry points (`CL/cl_layer.h`).

use std::ffi::c_void;

use kcache::backend::opencl::layer;

/// # Safety
/// As `clGetLayerInfo` in the specification: see [`layer::layer_info`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetLayerInfo(
    param_name: u32,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> i32 {
    // SAFETY: the loader's call, whose contract is the function's.
    unsafe {
        layer::layer_info(
            param_name,
            param_value_size,
            param_value,
            param_value_size_ret,
        )
    }
}

/// # Safety
/// As `clInitLayer` in the specification: see [`layer::init_layer`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clInitLayer(
    num_entries: u32,
    target_dispatch: *const c_void,
    num_entries_ret: *mut u32,
    layer_dispatch_ret: *mut *const c_void,
) -> i32 {
    // SAFETY: the loader's call, whose contract is the function's.
    unsafe {
        layer::init_layer(
            num_entries,
            target_dispatch,
            num_entries_ret,
            layer_dispatch_ret,
        )
    }
}
