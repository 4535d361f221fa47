//! The one interface of the shared stores behind the disk tier (Redis, an object store):
//! bounded reads handed to the caller's check, writes, a lease for one build across nodes
//! where the store has one, and counters. The chain (`crate::persistence`) asks them in
//! order; each store's module (`crate::remote`) implements it.
//!
//! - `stats`: the counters every store keeps; `breaker`: the circuit breaker they share;
//!   `rejected`: the refused objects a lookup's later looks do not verify again.
//!
//! A store never fails a lookup: an operation that fails or runs past its deadline is a miss
//! (or a skipped write), counted, and its breaker skips the store for a while after a few.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

#[cfg(any(feature = "remote", feature = "object-store"))]
pub(crate) mod breaker;
#[cfg(any(feature = "remote", feature = "object-store"))]
pub(crate) mod rejected;
#[cfg(any(feature = "remote", feature = "object-store"))]
pub(crate) mod settings;
mod stats;

#[cfg(any(feature = "remote", feature = "object-store"))]
pub(crate) use stats::Counters;
pub use stats::RemoteStats;
pub(crate) use stats::flattened;

use crate::disk::Entry;

/// What a store hands a read's bytes to: the entry they are, verified, or why they are
/// refused (a reject, logged with the reason).
pub(crate) type Verify<'a> = &'a dyn Fn(Vec<u8>) -> Result<Entry, String>;

/// Which kind of store, as statistics, metrics and messages name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// Redis or Valkey (`crate::remote`).
    Redis,
    /// An object store speaking the S3 API (`crate::object_store`).
    ObjectStore,
}

impl StoreKind {
    /// Every kind, in the chain's default order: the faster store first.
    pub const ALL: [StoreKind; 2] = [StoreKind::Redis, StoreKind::ObjectStore];

    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::ObjectStore => "s3",
        }
    }

    /// The kind `name` names (`redis`, `s3`), as `KCACHE_STORE_ORDER` lists them.
    pub fn from_name(name: &str) -> Option<StoreKind> {
        StoreKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The chain's order from a list such as `s3,redis`: the kinds named, in that order, then
    /// the others in the default order; why not, for a name that is no kind or is repeated.
    pub fn parse_order(text: &str) -> Result<Vec<StoreKind>, String> {
        let mut order = Vec::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let kind = StoreKind::from_name(name)
                .ok_or_else(|| format!("{name:?} is no store (redis, s3)"))?;
            if order.contains(&kind) {
                return Err(format!("{name:?} is named twice"));
            }
            order.push(kind);
        }
        Ok(StoreKind::completed(order))
    }

    /// `order` (its first mention of each kind), then the kinds it leaves out, in the default
    /// order.
    pub fn completed(order: Vec<StoreKind>) -> Vec<StoreKind> {
        let mut all = Vec::with_capacity(StoreKind::ALL.len());
        for kind in order.into_iter().chain(StoreKind::ALL) {
            if !all.contains(&kind) {
                all.push(kind);
            }
        }
        all
    }
}

/// A shared store of entries, named by their entry names (`disk::Sealer::entry_name`).
pub(crate) trait Store: Send + Sync {
    fn kind(&self) -> StoreKind;

    /// The entry `name`, read within the store's entry size limit (one byte over it tells a
    /// larger object apart, which is refused unread past that) and accepted by `verify`: a
    /// hit; anything else is a miss, counted.
    fn get(&self, name: &str, verify: Verify<'_>) -> Option<Entry>;

    /// Whether [`Store::put`] writes (the store is not read-only).
    fn writes(&self) -> bool;

    /// Writes the sealed entry `name`, unless read-only or larger than the limit. Failures
    /// are counted and logged, never returned: the caller has its value already.
    fn put(&self, name: &str, entry: &[u8]);

    /// After a miss everywhere: lead the build of `name` for every node sharing the store, or
    /// get the entry another node built meanwhile, or build without a lease. A store without
    /// leases answers [`Flight::Build`] at once.
    fn flight(&self, name: &str, verify: Verify<'_>) -> Flight;

    /// The counters since the store was opened or [`Store::reset_stats`] last ran.
    fn stats(&self) -> RemoteStats;

    /// The counters since the store was opened, whatever `reset_stats` did (for the
    /// directory's counters, which add deltas).
    fn raw_stats(&self) -> RemoteStats;

    fn reset_stats(&self);
}

/// What a node that missed an entry everywhere does.
#[cfg_attr(
    not(feature = "remote"),
    allow(
        dead_code,
        reason = "only a store leads or finds, and this build has none"
    )
)]
pub(crate) enum Flight {
    /// Build it: this node holds the store's lease until the guard is dropped (once the
    /// entry is in the store, or the build failed).
    Lead(Box<dyn StoreLease>),
    /// Another node built it meanwhile: here it is, verified.
    Found(Entry),
    /// Build it without a lease (no lease to be had, the leader failed, or the wait ran out).
    Build,
}

/// [`Flight::Build`] after a lease operation failed (`why`): counted in `lease_failures` and
/// logged, since this build may be a second one of the same entry.
#[cfg(any(feature = "remote", feature = "object-store"))]
pub(crate) fn failed_open(counters: &Counters, store: &str, name: &str, why: &str) -> Flight {
    crate::stats::bump(&counters.lease_failures, 1);
    crate::log::info(|| format!("{store} lease: {name}: {why}: building without it"));
    Flight::Build
}

/// A lease held on a store, renewed until dropped, then released.
pub(crate) trait StoreLease: Send {
    /// Set once another node waits for the entry: a write held back is then wanted (see
    /// `disk::write_back`).
    fn wanted(&self) -> Arc<AtomicBool>;
}

#[cfg(test)]
mod tests {
    use super::StoreKind::{self, ObjectStore, Redis};

    #[test]
    fn orders_name_kinds_first_then_the_rest_in_the_default_order() {
        assert_eq!(
            StoreKind::parse_order("s3,redis"),
            Ok(vec![ObjectStore, Redis])
        );
        assert_eq!(StoreKind::parse_order(" s3 "), Ok(vec![ObjectStore, Redis]));
        assert_eq!(
            StoreKind::parse_order("redis"),
            Ok(vec![Redis, ObjectStore])
        );
        assert_eq!(StoreKind::parse_order(""), Ok(StoreKind::ALL.to_vec()));
        let twice = StoreKind::parse_order("s3,s3").unwrap_err();
        assert!(twice.contains("named twice"), "{twice}");
        let unknown = StoreKind::parse_order("redis,gcs").unwrap_err();
        assert!(unknown.contains("\"gcs\" is no store"), "{unknown}");
    }
}
