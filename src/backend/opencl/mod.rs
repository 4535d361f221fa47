//! OpenCL: cached `cl_program`s per (context, device, sources, options), with program
//! binaries in the disk tier. The runtime is loaded at run time from `libOpenCL.so.1` (or the
//! library named by `KCACHE_OPENCL_LIBRARY`); without it every entry point returns
//! [`Error::Unavailable`](crate::Error::Unavailable).

mod cache;
pub mod layer;
mod pocl;
mod programs;
pub(crate) mod runtime;
pub(crate) mod sys;

pub use cache::{OpenClCache, OpenClOptions, OpenClStats, ProgramLease, program_disk_key};
pub(crate) use pocl::set_quiet;
pub use programs::context_devices;
pub use runtime::{ContextRef, Device, DeviceIdentity, Program};
pub use sys::{
    CL_BUILD_PROGRAM_FAILURE, cl_context, cl_device_id, cl_int, cl_program, status_name,
};
