//! kcache's own test support, kept out of the library: the libraries that stand in for the CUDA
//! driver and NVRTC, and what tests, examples and benchmarks need to run a cached kernel or
//! drive the C ABI as C does. Not published; a dev-dependency of `kcache`.

pub mod cuda;
pub mod ffi;
pub mod opencl;
pub mod vulkan;
