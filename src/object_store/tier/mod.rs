//! The object-store tier, built with the `object-store` cargo feature (on by default).
//!
//! - `resolve`: the settings resolved into a bucket, a prefix and credentials.
//! - `http`: signed requests, each bounded by one deadline, bodies read within a limit.
//! - `lease`: compile once across nodes, a lease object per entry.

mod http;
mod lease;
mod resolve;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use http::{Client, Condition, Failure};

use crate::disk::Entry;
use crate::log::{self, Warning};
use crate::object_store::ObjectStoreConfig;
use crate::stats::{Baseline, Live, bump};
use crate::store::breaker::{Breaker, Change};
use crate::store::rejected::Rejected;
use crate::store::{Counters, RemoteStats};
use crate::store::{Flight, Store, StoreKind, Verify};

/// An open object-store tier (connections are made on first use, so opening never waits).
pub(crate) struct ObjectStore {
    inner: Arc<Inner>,
}

/// What the store's operations share with the thread that renews a lease.
struct Inner {
    client: Client,
    breaker: Breaker,
    read_only: bool,
    prefix: String,
    max_entry_size: u64,
    /// How long a miss waits for another node's build (zero: no leases).
    lease_wait: Duration,
    /// How long a lease lasts unless renewed ([`lease::LEASE_TTL`]; shorter in tests).
    lease_ttl: Duration,
    counters: Counters,
    baseline: Baseline<RemoteStats>,
    /// The entries refused lately, not verified again while unchanged.
    rejected: Rejected,
    /// Whether the store honours conditional writes, once a probe has told (`lease::Probe`).
    conditional: parking_lot::Mutex<Option<bool>>,
}

/// The object store `config` describes, for entries tagged with an operator key when
/// `keyed`; `None` when there is none or it cannot be used (warned about once).
pub(crate) fn open(config: ObjectStoreConfig, keyed: bool) -> Option<Arc<dyn Store>> {
    ObjectStore::open(config, keyed).map(|store| Arc::new(store) as _)
}

impl ObjectStore {
    /// The store `config` describes, for entries tagged with an operator key when `keyed`;
    /// `None` when there is none or it cannot be used (warned about once).
    pub(crate) fn open(config: ObjectStoreConfig, keyed: bool) -> Option<ObjectStore> {
        let r = config.resolve()?;
        if !keyed && !r.allow_unkeyed {
            log::warn_once(Warning::ObjectStoreUnkeyed, || {
                "object-store tier off: it needs an operator key (KCACHE_KEY_FILE), or \
                 KCACHE_S3_ALLOW_UNKEYED=1 for a bucket nobody untrusted can write"
                    .into()
            });
            return None;
        }
        Some(ObjectStore {
            inner: Arc::new(Inner {
                client: Client::new(r.bucket, r.credentials, r.timeout),
                breaker: Breaker::new(r.breaker_threshold, r.breaker_cooldown),
                read_only: r.read_only,
                prefix: r.prefix,
                max_entry_size: r.max_entry_size,
                lease_wait: r.lease_wait,
                lease_ttl: lease::LEASE_TTL,
                counters: Counters::default(),
                baseline: Baseline::default(),
                rejected: Rejected::default(),
                conditional: parking_lot::Mutex::new(None),
            }),
        })
    }
}

impl Inner {
    /// The object of the entry `name`.
    fn object(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Reads the entry `name` and hands its bytes to `verify`, without counting a hit or a
    /// miss (a wait looks many times); what it refuses is a reject, logged with its reason
    /// (once: an object refused already, unchanged since, is a miss not counted again).
    fn peek(&self, name: &str, verify: Verify<'_>) -> Option<Entry> {
        let limit = self.max_entry_size;
        let object = self.object(name);
        let found = self.guarded("read", name, |c| c.get(&object, limit))??;
        if found.bytes.is_empty() {
            return None;
        }
        bump(&self.counters.bytes_read, found.bytes.len() as u64);
        let checked = self.rejected.judge(name, found.bytes, limit, verify)?;
        checked
            .inspect_err(|why| {
                log::info(|| format!("object store entry {name} rejected: {why}"));
                bump(&self.counters.rejects, 1);
            })
            .ok()
    }

    /// Runs `op` unless the breaker is open, and counts and logs how it failed. Outages (no
    /// answer, a timeout, a 5xx) feed the breaker; a refusal (403, ...) is counted as an error
    /// but is an answer: the store is up.
    fn guarded<T>(
        &self,
        what: &str,
        name: &str,
        op: impl FnOnce(&Client) -> Result<T, Failure>,
    ) -> Option<T> {
        if !self.breaker.allow() {
            bump(&self.counters.skipped, 1);
            return None;
        }
        self.attempt(what, name, op)
    }

    /// [`Inner::guarded`] whatever the breaker says: for a held lease's renewals and deletion,
    /// which no lookup waits for, and whose skipping would leave the lease to lapse (another
    /// node then builds the entry too) or to stand until it expires (the others wait for it).
    fn attempt<T>(
        &self,
        what: &str,
        name: &str,
        op: impl FnOnce(&Client) -> Result<T, Failure>,
    ) -> Option<T> {
        let c = &self.counters;
        let result = op(&self.client);
        let ok = match &result {
            Ok(_) => true,
            Err(e) => !e.is_outage(),
        };
        match self.breaker.record(ok) {
            Change::Closed => log::info(|| "object store reachable again: breaker closed".into()),
            Change::Tripped => {
                bump(&c.breaker_trips, 1);
                log::info(|| "object store skipped for a while after failures".into());
            }
            Change::None => {}
        }
        result
            .inspect_err(|e| {
                let counter = match e {
                    Failure::Timeout => &c.timeouts,
                    _ => &c.errors,
                };
                bump(counter, 1);
                log::debug(|| format!("object store {what} of {name} failed: {e}"));
            })
            .ok()
    }
}

impl Store for ObjectStore {
    fn kind(&self) -> StoreKind {
        StoreKind::ObjectStore
    }

    fn get(&self, name: &str, verify: Verify<'_>) -> Option<Entry> {
        let found = self.inner.peek(name, verify);
        let c = &self.inner.counters;
        bump(if found.is_some() { &c.hits } else { &c.misses }, 1);
        if found.is_none() {
            log::debug(|| format!("object store miss: {name}"));
        }
        found
    }

    fn writes(&self) -> bool {
        !self.inner.read_only
    }

    fn put(&self, name: &str, entry: &[u8]) {
        let inner = &self.inner;
        if inner.read_only {
            return;
        }
        let size = entry.len() as u64;
        if size > inner.max_entry_size {
            log::debug(|| {
                format!(
                    "object store write of {name} skipped: {size} bytes exceed the entry size \
                     limit of {} bytes",
                    inner.max_entry_size
                )
            });
            return;
        }
        let object = inner.object(name);
        let written = inner.guarded("write", name, |c| c.put(&object, entry, Condition::Always));
        if written.is_some() {
            bump(&inner.counters.puts, 1);
            bump(&inner.counters.bytes_written, size);
        }
    }

    fn flight(&self, name: &str, verify: Verify<'_>) -> Flight {
        self.inner.flight(name, verify)
    }

    fn stats(&self) -> RemoteStats {
        self.inner.baseline.apply(&self.raw_stats())
    }

    fn raw_stats(&self) -> RemoteStats {
        RemoteStats {
            breaker_open: self.inner.breaker.is_open(),
            ..self.inner.counters.snapshot()
        }
    }

    fn reset_stats(&self) {
        self.inner.baseline.reset(self.raw_stats());
    }
}
