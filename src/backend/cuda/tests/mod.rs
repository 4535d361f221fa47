//! The CUDA backend against test libraries that stand in for the driver and NVRTC (see
//! [`support`]). They live inside the crate because driving the stand-ins takes raw calls.

mod cache;
mod nvrtc;
pub(crate) mod support;
