//! GPU runtime adapters. Each loads its runtime at run time: no link dependency on any of them.
pub mod cuda;
pub mod opencl;
pub(crate) mod registry;
pub mod vulkan;
