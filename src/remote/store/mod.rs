//! The remote tier on Redis, built with the `remote` cargo feature (on by default).
//!
//! - `resolve`: the settings resolved into a server to reach.
//! - `client`: connections (standalone or Redis Cluster) and per-operation budgets.
//! - [`resp`]: replies, read within the entry size limit.
//! - `lease`: compile once across nodes, a per-entry lease in the store.

mod client;
mod lease;
mod resolve;
#[doc(hidden)]
/// cbindgen:ignore
pub mod resp;

use std::sync::Arc;
use std::time::Duration;

use crate::store::breaker::{Breaker, Change};
pub use lease::LEASE_TTL;

use super::RemoteConfig;
use crate::disk::Entry;
use crate::log::{self, Warning};
use crate::stats::{Baseline, Live, bump};
use crate::store::rejected::Rejected;
use crate::store::{Counters, RemoteStats};
use crate::store::{Flight, Store, StoreKind, Verify};

/// The Redis store `config` describes, for entries tagged with an operator key when `keyed`;
/// `None` when there is none or it cannot be used (warned about once).
pub(crate) fn open(config: RemoteConfig, keyed: bool) -> Option<Arc<dyn Store>> {
    Remote::open(config, keyed).map(|remote| Arc::new(Redis(Arc::new(remote))) as _)
}

/// The Redis tier as a store of the chain: shared, since a held lease renews it from a thread
/// of its own.
struct Redis(Arc<Remote>);

/// An open remote tier (connections are made on first use, so opening never waits).
pub(crate) struct Remote {
    client: client::Client,
    breaker: Breaker,
    read_only: bool,
    ttl: Duration,
    prefix: String,
    max_entry_size: u64,
    /// How long a miss waits for another node's build (zero: no leases).
    lease_wait: Duration,
    counters: Counters,
    baseline: Baseline<RemoteStats>,
    /// The entries refused lately, not verified again while unchanged.
    rejected: Rejected,
}

impl Remote {
    /// The remote `config` describes, for entries tagged with an operator key when `keyed`;
    /// `None` when there is none or it cannot be used (warned about once).
    fn open(config: RemoteConfig, keyed: bool) -> Option<Remote> {
        let r = config.resolve()?;
        if !keyed && !r.allow_unkeyed {
            log::warn_once(Warning::RemoteUnkeyed, || {
                "remote tier off: it needs an operator key (KCACHE_KEY_FILE), or \
                 KCACHE_REMOTE_ALLOW_UNKEYED=1 for a store nobody untrusted can write"
                    .into()
            });
            return None;
        }
        Some(Remote {
            client: client::Client::new(r.target, r.timeout, r.max_entry_size),
            breaker: Breaker::new(r.breaker_threshold, r.breaker_cooldown),
            read_only: r.read_only,
            ttl: r.ttl,
            prefix: r.prefix,
            max_entry_size: r.max_entry_size,
            lease_wait: r.lease_wait,
            counters: Counters::default(),
            baseline: Baseline::default(),
            rejected: Rejected::default(),
        })
    }

    /// Reads the entry `name` and hands its bytes to `verify`; what it accepts is a hit,
    /// what it refuses a reject (logged with its reason). Anything else is a miss.
    fn fetch<T>(&self, name: &str, verify: impl FnOnce(Vec<u8>) -> Result<T, String>) -> Option<T> {
        let found = self.peek(name, verify);
        bump(
            if found.is_some() {
                &self.counters.hits
            } else {
                &self.counters.misses
            },
            1,
        );
        if found.is_none() {
            log::debug(|| format!("remote miss: {name}"));
        }
        found
    }

    /// [`Remote::fetch`] without counting the hit or miss (a wait looks many times).
    /// An object refused already (and unchanged since) is a miss, not counted again.
    fn peek<T>(&self, name: &str, verify: impl FnOnce(Vec<u8>) -> Result<T, String>) -> Option<T> {
        let key = format!("{}{name}", self.prefix);
        let limit = self.max_entry_size;
        // GETRANGE bounds what a planted value of any size costs to read: one byte over the
        // limit tells it apart. An absent key reads as empty, and no entry is.
        let bytes: Vec<u8> = self.guarded(
            "read",
            name,
            &key,
            redis::cmd("GETRANGE").arg(&key).arg(0).arg(limit),
        )?;
        if bytes.is_empty() {
            return None;
        }
        bump(&self.counters.bytes_read, bytes.len() as u64);
        let checked = self.rejected.judge(name, bytes, limit, verify)?;
        checked
            .inspect_err(|why| {
                log::info(|| format!("remote entry {name} rejected: {why}"));
                bump(&self.counters.rejects, 1);
            })
            .ok()
    }

    /// Writes the entry `name` (unless read-only, or larger than the limit).
    fn store(&self, name: &str, entry: &[u8]) {
        if self.read_only {
            return;
        }
        let size = entry.len() as u64;
        if size > self.max_entry_size {
            log::debug(|| {
                format!(
                    "remote write of {name} skipped: {size} bytes exceed the entry size limit \
                     of {} bytes",
                    self.max_entry_size
                )
            });
            return;
        }
        let key = format!("{}{name}", self.prefix);
        let ttl = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key).arg(entry);
        if ttl > 0 {
            cmd.arg("PX").arg(ttl);
        }
        let written = self.guarded::<()>("write", name, &key, &cmd);
        if written.is_some() {
            bump(&self.counters.puts, 1);
            bump(&self.counters.bytes_written, size);
        }
    }

    /// Sends `cmd` about `key` unless the breaker is open, and counts and logs how it failed.
    fn guarded<T: redis::FromRedisValue>(
        &self,
        what: &str,
        name: &str,
        key: &str,
        cmd: &redis::Cmd,
    ) -> Option<T> {
        self.unless_open(what, name, key, cmd, true)
    }

    /// [`Remote::guarded`], `counts` saying whether a failure counts towards the breaker: not
    /// for the follow-up of an operation that just failed (one stalled server, one failure).
    fn unless_open<T: redis::FromRedisValue>(
        &self,
        what: &str,
        name: &str,
        key: &str,
        cmd: &redis::Cmd,
        counts: bool,
    ) -> Option<T> {
        if !self.breaker.allow() {
            bump(&self.counters.skipped, 1);
            return None;
        }
        self.attempt(what, name, key, cmd, counts)
    }

    /// [`Remote::guarded`] whatever the breaker says: for a held lease's renewals and release,
    /// which no lookup waits for, and whose skipping would leave the lease to lapse (another
    /// node then builds the entry too) or to stand until it expires (the others wait for it).
    /// `counts`: whether a failure counts toward tripping the breaker (not for the follow-up of
    /// an operation that just failed: one outage is one failure).
    fn attempt<T: redis::FromRedisValue>(
        &self,
        what: &str,
        name: &str,
        key: &str,
        cmd: &redis::Cmd,
        counts: bool,
    ) -> Option<T> {
        let c = &self.counters;
        match self.client.query(key, cmd) {
            Ok(value) => {
                if self.breaker.record(true) == Change::Closed {
                    log::info(|| "remote tier reachable again: breaker closed".into());
                }
                Some(value)
            }
            Err(e) => {
                bump(
                    if e.is_timeout() {
                        &c.timeouts
                    } else {
                        &c.errors
                    },
                    1,
                );
                log::debug(|| format!("remote {what} of {name} failed: {e}"));
                self.client.drop_idle();
                if counts && self.breaker.record(false) == Change::Tripped {
                    bump(&c.breaker_trips, 1);
                    log::info(|| format!("remote tier skipped for a while after failures: {e}"));
                }
                None
            }
        }
    }
}

impl Store for Redis {
    fn kind(&self) -> StoreKind {
        StoreKind::Redis
    }

    fn get(&self, name: &str, verify: Verify<'_>) -> Option<Entry> {
        self.0.fetch(name, verify)
    }

    fn writes(&self) -> bool {
        !self.0.read_only
    }

    fn put(&self, name: &str, entry: &[u8]) {
        self.0.store(name, entry);
    }

    fn flight(&self, name: &str, verify: Verify<'_>) -> Flight {
        self.0.lead_or_follow(name, verify)
    }

    fn stats(&self) -> RemoteStats {
        self.0.baseline.apply(&self.raw_stats())
    }

    fn raw_stats(&self) -> RemoteStats {
        RemoteStats {
            breaker_open: self.0.breaker.is_open(),
            ..self.0.counters.snapshot()
        }
    }

    fn reset_stats(&self) {
        self.0.baseline.reset(self.raw_stats());
    }
}
