//! A shared store on Redis (or Valkey), behind the disk tier in the chain of stores
//! (`crate::persistence`). A lookup the disk cannot answer asks the remote before building; a
//! remote hit is written to the disk; a built value is written to the disk and then, on the
//! disk tier's background writer, to the remote.
//!
//! The remote stores entries in the disk tier's authenticated format under
//! `<prefix><entry name>`, and every read is verified exactly as a disk read is: the store is
//! not trusted, only the operator key is. Without a key the remote is off unless
//! [`RemoteConfig::allow_unkeyed`] says otherwise (see `docs/remote.md`).
//!
//! The remote never fails a lookup: an operation that fails or runs past its budget is a miss
//! (or a skipped write), counted and logged, and after a few in a row the breaker skips the
//! remote for a while.
//!
//! The tier is the cargo feature `remote` (on by default):
//! - [`config`]: the settings and the environment, in every build.
//! - `store`: the tier, with the feature: Redis connections, replies, the breaker, leases.
//! - `absent`: without it, a tier that is never open and a warning when one is configured.

pub mod config;
// The one place the `remote` cargo feature shows: the tier itself, or its absence.
#[cfg(not(feature = "remote"))]
mod absent;
#[cfg(feature = "remote")]
mod store;

pub use crate::store::RemoteStats;
#[cfg(not(feature = "remote"))]
pub(crate) use absent::open;
pub use config::{RemoteConfig, masked_url};
#[cfg(feature = "remote")]
pub(crate) use store::open;
#[cfg(feature = "remote")]
pub use store::{LEASE_TTL, resp};
