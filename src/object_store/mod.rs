//! A shared tier on an object store speaking the S3 API (AWS S3, MinIO, SeaweedFS, Ceph RGW,
//! ...), behind the disk tier, as the Redis tier is (`crate::remote`): entries in the disk
//! tier's authenticated format under `<prefix><entry name>`, every read bounded and verified
//! as a disk read is, every failure a miss, counted, and a breaker that skips a store that
//! keeps failing. Without an operator key it is off unless
//! [`ObjectStoreConfig::allow_unkeyed`] says otherwise.
//!
//! One build per cluster: a lease object per entry, created with a conditional write
//! (`If-None-Match: *`), renewed and taken over with `If-Match` (`tier::lease`).
//!
//! The tier is the cargo feature `object-store` (on by default):
//! - [`config`]: the settings, in every build.
//! - `tier`: the tier, with the feature: settings resolved, signed bounded requests, leases.
//! - `absent`: without it, a tier that is never open and a warning when one is configured.

pub mod config;
// The one place the `object-store` cargo feature shows: the tier itself, or its absence.
#[cfg(not(feature = "object-store"))]
mod absent;
#[cfg(feature = "object-store")]
mod tier;

#[cfg(not(feature = "object-store"))]
pub(crate) use absent::open;
pub use config::ObjectStoreConfig;
#[cfg(feature = "object-store")]
pub(crate) use tier::open;
