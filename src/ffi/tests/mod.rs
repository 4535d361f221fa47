//! The C ABI called from Rust as C calls it, with raw pointers: the layouts, allocation and
//! `bool` checks, and the `kc_cuda_*` functions against the test driver library.

mod abi;
mod cuda;
