//! kcache: a concurrency-safe cache of compiled GPU kernels.
//!
//! - [`memory`]: the L1 tier, live values behind leases, single-flight builds, per-device
//!   eviction and clear generations.
//! - `ffi`: the C ABI (`include/kcache.h`).

/// cbindgen:ignore
pub mod backend;
pub mod disk;
pub mod error;
pub mod ffi;
pub mod key;
pub mod memory;

pub use error::{BuildError, DestroyError, DeviceId, Error, Result};
