//! kcache: a concurrency-safe cache of compiled GPU kernels.
//!
//! - [`memory`]: the L1 tier, live values behind leases, single-flight builds, per-device
//!   eviction and clear generations.
//! - [`key`], [`disk`], [`tiered`]: content keys, the L2 disk tier, L1 → L2 → build.
//! - [`stats`]: the hit rate and the reset every cache's statistics share.
//! - [`log`]: configuration problems and, at `debug`, why each miss missed (`KCACHE_LOG`).
//! - [`metrics`]: every live cache's counters in the Prometheus text format.
//! - `ffi`: the C ABI (`include/kcache.h`).

/// cbindgen:ignore
pub mod backend;
/// cbindgen:ignore
pub mod disk;
/// cbindgen:ignore
pub mod env;
/// cbindgen:ignore
pub mod error;
pub mod ffi;
mod headers;
/// cbindgen:ignore
pub mod key;
/// cbindgen:ignore
pub mod log;
/// cbindgen:ignore
pub mod memory;
/// cbindgen:ignore
pub mod metrics;
pub mod object_store;
mod operator_file;
pub mod persistence;
pub mod remote;
pub mod stats;
/// cbindgen:ignore
pub mod tiered;

pub use disk::{Persistence, PersistenceConfig};
pub use error::{BuildError, DestroyError, DeviceId, Error, Result};

// The README's Rust examples run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
