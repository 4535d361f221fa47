//! Running a 1-D OpenCL kernel, which is what the tests and the demo need to prove that a cached
//! program really works. Through kcache's loaded runtime, so that the kernel runs in the same
//! OpenCL library as the program was built by.

use std::ffi::CString;
use std::ptr;

use kcache::backend::opencl::Program;
use kcache::backend::opencl::runtime::Context;
use kcache::backend::opencl::sys::{
    Api, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE, CL_SUCCESS, CL_TRUE, cl_command_queue, cl_int,
    cl_kernel, cl_mem, cl_uint, status_name,
};
use kcache::{Error, Result};

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

/// One argument of [`run_kernel`].
pub enum KernelArg<'a> {
    /// Copied to a device buffer before the launch and read back into the slice after it.
    Floats(&'a mut [f32]),
    Float(f32),
    Int(i32),
}

/// Runs `kernel` of `program` (built in `context`) over `global` work items on a queue of its
/// own, and waits for it; float buffers are read back into their slices.
pub fn run_kernel(
    context: &Context,
    program: &Program,
    kernel: &str,
    args: &mut [KernelArg<'_>],
    global: usize,
) -> Result<()> {
    let api = Api::get()?;
    let name = CString::new(kernel)
        .map_err(|_| Error::InvalidArgument("kernel name contains a NUL byte".into()))?;
    let mut code = CL_SUCCESS;
    // SAFETY: `context` owns a live context on its device; no queue properties.
    let queue = unsafe {
        (api.clCreateCommandQueue)(
            context.context().raw(),
            context.device().raw(),
            0,
            &mut code,
        )
    };
    check(code, "clCreateCommandQueue")?;
    // SAFETY: `program` is live (it owns a reference); `name` is a C string.
    let k = unsafe { (api.clCreateKernel)(program.raw(), name.as_ptr(), &mut code) };
    let result = check(code, "clCreateKernel").and_then(|()| {
        let mut buffers: Vec<cl_mem> = Vec::new();
        let result = launch(api, context, queue, k, args, global, &mut buffers);
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
    global: usize,
    buffers: &mut Vec<cl_mem>,
) -> Result<()> {
    let mut code = CL_SUCCESS;
    for (index, arg) in args.iter_mut().enumerate() {
        let index = cl_uint::try_from(index)
            .map_err(|_| Error::InvalidArgument("too many kernel arguments".into()))?;
        let code = match arg {
            KernelArg::Floats(data) => {
                // SAFETY: COPY_HOST_PTR reads `size_of_val(data)` bytes from `data` during the
                // call and keeps no pointer to it.
                let mem = unsafe {
                    (api.clCreateBuffer)(
                        context.context().raw(),
                        CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                        size_of_val(*data),
                        data.as_mut_ptr().cast(),
                        &mut code,
                    )
                };
                check(code, "clCreateBuffer")?;
                buffers.push(mem);
                // SAFETY: a buffer argument is passed as a pointer to the cl_mem handle.
                unsafe {
                    (api.clSetKernelArg)(
                        kernel,
                        index,
                        size_of::<cl_mem>(),
                        (&raw const mem).cast(),
                    )
                }
            }
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
    // SAFETY: one dimension, `global` points to one size_t; no events.
    let code = unsafe {
        (api.clEnqueueNDRangeKernel)(
            queue,
            kernel,
            1,
            ptr::null(),
            &global,
            ptr::null(),
            0,
            ptr::null(),
            ptr::null_mut(),
        )
    };
    check(code, "clEnqueueNDRangeKernel")?;
    let mut next = buffers.iter();
    for arg in args.iter_mut() {
        if let KernelArg::Floats(data) = arg {
            let mem = *next.next().expect("one buffer was created per float slice");
            // SAFETY: a blocking read of exactly the bytes the buffer was created with, into
            // the slice they came from.
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
    }
    // SAFETY: the queue is live; waiting makes the results visible before returning.
    check(unsafe { (api.clFinish)(queue) }, "clFinish")
}
