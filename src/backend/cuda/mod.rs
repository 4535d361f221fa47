//! CUDA: cached `CUmodule`s per (context, PTX, JIT options), with the cubins the driver linked
//! kept in the disk tier so a warm start skips the PTX JIT. The driver is loaded at run time
//! from `libcuda.so.1` (or `KCACHE_CUDA_LIBRARY`); without one every call is
//! [`Error::Unavailable`](crate::Error::Unavailable).

pub mod cache;
pub mod driver;
pub mod nvrtc;

pub use cache::{Context, CudaCache, CudaOptions, CudaStats, JitOption, Module, ModuleLease};
pub use driver::{CUcontext, CUdevice, CUfunction, CUmodule, Driver};
pub use nvrtc::Nvrtc;
