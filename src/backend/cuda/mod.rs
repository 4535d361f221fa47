//! CUDA: cached `CUmodule`s per (context, PTX, JIT options), with the cubins the driver linked
//! kept in the disk tier so a warm start skips the PTX JIT. The driver is loaded at run time
//! from `libcuda.so.1` (or `KCACHE_CUDA_LIBRARY`); without one every call is
//! [`Error::Unavailable`](crate::Error::Unavailable).

mod build_id;
mod cache;
mod driver;
mod jit;
mod module;
mod nvrtc;
mod runtime;

pub use cache::{CudaCache, CudaOptions, CudaStats};
pub use driver::{CUcontext, CUdevice, CUfunction, CUmodule, CUresult, Driver};
pub use jit::JitOption;
pub use module::{Context, Module, ModuleLease};
pub use nvrtc::Nvrtc;
