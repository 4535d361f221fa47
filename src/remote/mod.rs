//! L3: a shared tier on Redis (or Valkey), behind the disk tier. A lookup the disk cannot
//! answer asks the remote before building; a remote hit is written to the disk; a built value
//! is written to the disk and then, on the disk tier's background writer, to the remote.
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
//! - [`config`]: the settings and the environment.
//! - `client`: connections (standalone or Redis Cluster) and per-operation budgets.
//! - [`resp`]: replies, read within the entry size limit.
//! - `breaker`: the circuit breaker.
//! - `lease`: compile once across nodes, a per-entry lease in the store.

mod breaker;
mod client;
pub mod config;
mod lease;
#[doc(hidden)]
/// cbindgen:ignore
pub mod resp;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use breaker::{Breaker, Change};
pub use config::{RemoteConfig, masked_url};
pub use lease::LEASE_TTL;
pub(crate) use lease::{Flight, LeaseGuard};

use crate::log::{self, Warning};
use crate::stats::Baseline;

/// What the remote tier did, since it was opened or its statistics last reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Entries read and verified (a lookup that waited for another node's lease counts its
    /// first look as a miss, then the entry it got as a hit).
    pub hits: u64,
    /// Reads that returned no usable entry: absent, rejected, failed, timed out or skipped.
    pub misses: u64,
    /// Entries refused by verification (tampered, another key, truncated, too large).
    pub rejects: u64,
    /// Operations that failed (connection refused or lost, a server error), timeouts apart.
    pub errors: u64,
    /// Operations that ran past their budget.
    pub timeouts: u64,
    /// Operations skipped because the breaker was open.
    pub skipped: u64,
    /// Times the breaker opened after consecutive failures.
    pub breaker_trips: u64,
    /// Leases taken: builds this process led for every node.
    pub leases: u64,
    /// Misses that waited for another node holding the lease (then read its entry, or built).
    pub lease_waits: u64,
    /// Of those, waits that reached the deadline and built.
    pub lease_timeouts: u64,
    /// Entries written.
    pub puts: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Whether the breaker is open now (a gauge, never reset).
    pub breaker_open: bool,
}

crate::stats::events!(RemoteStats {
    hits,
    misses,
    rejects,
    errors,
    timeouts,
    skipped,
    breaker_trips,
    leases,
    lease_waits,
    lease_timeouts,
    puts,
    bytes_read,
    bytes_written,
});

impl RemoteStats {
    /// `hits / (hits + misses)`; `None` before the first read.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.hits, self.misses)
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    rejects: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    skipped: AtomicU64,
    breaker_trips: AtomicU64,
    leases: AtomicU64,
    lease_waits: AtomicU64,
    lease_timeouts: AtomicU64,
    puts: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

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
}

impl Remote {
    /// The remote `config` describes, for entries tagged with an operator key when `keyed`;
    /// `None` when there is none or it cannot be used (warned about once).
    pub(crate) fn open(config: RemoteConfig, keyed: bool) -> Option<Remote> {
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
        })
    }

    pub(crate) fn stats(&self) -> RemoteStats {
        self.baseline.apply(&self.raw_stats())
    }

    pub(crate) fn reset_stats(&self) {
        self.baseline.reset(self.raw_stats());
    }

    /// The counters since the remote was opened, whatever `reset_stats` did.
    pub(crate) fn raw_stats(&self) -> RemoteStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RemoteStats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            rejects: get(&c.rejects),
            errors: get(&c.errors),
            timeouts: get(&c.timeouts),
            skipped: get(&c.skipped),
            breaker_trips: get(&c.breaker_trips),
            leases: get(&c.leases),
            lease_waits: get(&c.lease_waits),
            lease_timeouts: get(&c.lease_timeouts),
            puts: get(&c.puts),
            bytes_read: get(&c.bytes_read),
            bytes_written: get(&c.bytes_written),
            breaker_open: self.breaker.is_open(),
        }
    }

    /// Reads the entry `name` and hands its bytes to `verify`; what it accepts is a hit,
    /// what it refuses a reject (logged with its reason). Anything else is a miss.
    pub(crate) fn fetch<T>(
        &self,
        name: &str,
        verify: impl FnOnce(Vec<u8>) -> Result<T, String>,
    ) -> Option<T> {
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
        let checked = if bytes.len() as u64 > limit {
            Err(format!("larger than the entry size limit of {limit} bytes"))
        } else {
            verify(bytes)
        };
        checked
            .inspect_err(|why| {
                log::info(|| format!("remote entry {name} rejected: {why}"));
                bump(&self.counters.rejects, 1);
            })
            .ok()
    }

    /// Whether [`Remote::store`] writes (the remote is not read-only).
    pub(crate) fn writes(&self) -> bool {
        !self.read_only
    }

    /// Writes the entry `name` (unless read-only, or larger than the limit).
    pub(crate) fn store(&self, name: &str, entry: &[u8]) {
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
        let c = &self.counters;
        if !self.breaker.allow() {
            bump(&c.skipped, 1);
            return None;
        }
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
                if self.breaker.record(false) == Change::Tripped {
                    bump(&c.breaker_trips, 1);
                    log::info(|| format!("remote tier skipped for a while after failures: {e}"));
                }
                None
            }
        }
    }
}
