//! kcache: a concurrency-safe cache of compiled GPU kernels.
//!
//! - [`memory`]: the L1 tier, live values behind leases, single-flight builds, per-device
//!   eviction and clear generations.
//! - [`key`], [`disk`], [`tiered`]: content keys, the L2 disk tier, L1 → L2 → build.
//! - [`persistence`]: the persistent tiers as one chain, the disk tier first, then the shared
//!   stores behind it ([`store`]: their one interface; [`remote`]: Redis).
//! - [`stats`]: the hit rate and the reset every cache's statistics share.
//! - [`log`]: configuration problems and, at `debug`, why each miss missed (`KCACHE_LOG`).
//! - [`metrics`]: every live cache's counters in the Prometheus text format.
//! - `ffi`: the C ABI (`include/kcache.h`).

/// cbindgen:ignore
pub mod backend;
/// cbindgen:ignore
mod directory_counters;
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
/// cbindgen:ignore
pub mod object_store;
mod operator_file;
/// cbindgen:ignore
pub mod persistence;
pub mod remote;
pub mod stats;
/// cbindgen:ignore
pub mod store;
mod thread_index;
/// cbindgen:ignore
pub mod tiered;

pub use error::{BuildError, DestroyError, DeviceId, Error, Result};
pub use persistence::{Persistence, PersistenceConfig};

// The README's Rust examples run as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
