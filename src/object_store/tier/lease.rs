//! Compile once across nodes: a lease object per entry, `<prefix>lease/<entry name>`, taken
//! with a conditional write. Of the nodes that miss an entry at once, the one whose
//! `PUT If-None-Match: *` creates the lease builds it; the others get 412 and wait for its
//! entry to appear, reading it when it does. The lease holds a random token and its expiry
//! (wall-clock milliseconds); the leader renews it from a thread of its own with
//! `PUT If-Match: <its version>` and deletes it (`If-Match` again) once its entry is in the
//! store or its build failed. A leader that dies lets it expire: a follower that finds it
//! expired takes it over with `PUT If-Match: <the stale version>`, which one node wins.
//!
//! A follower also writes `<prefix>wanted/<entry name>` (with an expiry) when it starts to
//! wait, and the leader's thread looks for that mark every [`WANTED_POLL`], as the Redis
//! tier's does (`disk::write_back` says why a leader may hold its entry back).
//!
//! Every failure opens the flight up rather than stalling it: a store that cannot be reached
//! means build here; a follower builds once the lease is gone without an entry (taking the
//! lease itself if it can), and when its wait reaches the deadline; each such build is counted
//! (`lease_failures`, `lease_timeouts`) and logged. A server that ignores conditional writes
//! would let every racing node lead: a probe finds it out before the first lease
//! (`Inner::honours_conditions`), and its leases are then not used.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use super::http::Condition;
use super::{Inner, bump};
use crate::key::hex;
use crate::log::{self, Warning};
use crate::store::{Flight, StoreLease, Verify, failed_open};

/// How long a lease lasts unless renewed: how long followers wait for a leader that died.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(10);
/// How often a follower looks for the entry (and the lease): two reads per look.
const POLL: Duration = Duration::from_millis(40);
/// How often a leader looks for a follower's mark until it finds one.
pub(crate) const WANTED_POLL: Duration = Duration::from_millis(50);
/// The largest lease or mark object read: they are a few dozen bytes.
const SMALL: u64 = 1024;

/// What the lease object of an entry says.
enum Look {
    Absent,
    /// Held by a node within its expiry.
    Live,
    /// Past its expiry (or not a lease kcache wrote): its version, to take it over with.
    Stale(Option<String>),
}

impl Inner {
    /// Takes the lease on `name` or waits for the node holding it, as [`Flight`] says.
    pub(super) fn flight(self: &Arc<Self>, name: &str, verify: Verify<'_>) -> Flight {
        if self.lease_wait.is_zero() {
            return Flight::Build;
        }
        let failed = |why: &str| failed_open(&self.counters, "object store", name, why);
        if !self.read_only {
            match self.honours_conditions() {
                Some(true) => {}
                Some(false) => return failed("the store ignores conditional writes"),
                None => return failed("the store could not be probed for conditional writes"),
            }
        }
        let lease = format!("{}lease/{name}", self.prefix);
        let deadline = Instant::now() + self.lease_wait;
        let mut waited = false;
        loop {
            let taken = if self.read_only {
                // A reader never leads (it writes nothing), but it follows a writer that does.
                match self.look(&lease) {
                    Some(Look::Live) => None,
                    Some(Look::Absent | Look::Stale(_)) => return Flight::Build,
                    None => return failed("the store could not be asked for the lease"),
                }
            } else {
                // The first try creates the lease at once (one request when nobody holds it);
                // a waiting node reads it first, and writes only when it is gone or stale.
                match self.take(&lease, waited) {
                    Some(taken) => taken,
                    None => return failed("the store could not be asked for the lease"),
                }
            };
            if let Some((token, etag)) = taken {
                // Another leader may have written the entry just before it released the lease
                // (after this node's caller looked, or during its wait): the entry is written
                // before the lease is deleted, and the store reads after its writes, so one
                // look now sees it. One read per build, and no build twice; none when the
                // caller's read refused what is there.
                let look = waited || !self.rejected.named(name);
                if let Some(found) = look.then(|| self.peek(name, verify)).flatten() {
                    bump(&self.counters.hits, 1);
                    self.release(&lease, &etag);
                    return Flight::Found(found);
                }
                return match self.renew_while_held(name, lease, token, etag) {
                    Some(guard) => Flight::Lead(Box::new(guard)),
                    None => failed("no thread could be started to renew the lease"),
                };
            }
            if !waited {
                waited = true;
                self.mark_wanted(name);
                bump(&self.counters.lease_waits, 1);
                log::debug(|| format!("object store lease: {name}: another node builds it"));
            }
            std::thread::sleep(POLL);
            if let Some(found) = self.peek(name, verify) {
                bump(&self.counters.hits, 1);
                return Flight::Found(found);
            }
            if Instant::now() >= deadline {
                bump(&self.counters.lease_timeouts, 1);
                log::info(|| {
                    format!(
                        "object store lease: {name}: timed out after {:?} waiting for another \
                         node: building here too",
                        self.lease_wait
                    )
                });
                return Flight::Build;
            }
        }
    }

    /// Whether the store honours `If-None-Match: *` and `If-Match`, which its leases stand
    /// on; `None` while that cannot be told (the store failed). Probed once per process on
    /// the first lease a writer asks for (a lookup that comes meanwhile waits for the probe):
    /// an object of a name nobody else picks is created with `If-None-Match: *`, which must
    /// then refuse a second create (412 or 409), and a write with `If-Match` of a version it
    /// never had must be refused too; then it is deleted. Four requests. A store that
    /// writes either (a proxy that drops the headers, a server without conditional writes)
    /// would let every racing node lead: it is warned about once, counted, and its leases go
    /// unused (each build is then a `lease_failures`).
    fn honours_conditions(&self) -> Option<bool> {
        let mut known = self.conditional.lock();
        if let Some(known) = *known {
            return Some(known);
        }
        let probe = format!("{}probe/{}", self.prefix, token());
        let body = b"kcache conditional-write probe";
        let what = "conditional-write probe";
        let put = |condition| self.guarded(what, &probe, |c| c.put(&probe, body, condition));
        let created = put(Condition::Absent)?;
        let honoured = created.is_some()
            && put(Condition::Absent)?.is_none()
            && put(Condition::Matches("\"kcache-no-such-version\""))?.is_none();
        self.guarded(what, &probe, |c| c.delete(&probe, None));
        if !honoured {
            bump(&self.counters.conditional_writes_ignored, 1);
            log::warn_once(Warning::ObjectStoreUnconditional, || {
                "object store: it ignores conditional writes (If-None-Match, If-Match): its \
                 leases are not used, and nodes that miss an entry at once each build it"
                    .into()
            });
        }
        *known = Some(honoured);
        Some(honoured)
    }

    /// `Some(Some((token, version)))`: taken; `Some(None)`: another node holds it; `None`: the
    /// store failed. With `look_first`, reads the lease before any write.
    fn take(&self, lease: &str, look_first: bool) -> Option<Option<(String, String)>> {
        let look = if look_first {
            self.look(lease)?
        } else {
            Look::Absent
        };
        let token = token();
        let body = stamp(&token, self.lease_ttl);
        let condition = match &look {
            Look::Live => return Some(None),
            Look::Absent => Condition::Absent,
            Look::Stale(Some(etag)) => Condition::Matches(etag),
            // No version to match (a server that sends no ETag): delete it, and the next look
            // creates it anew; racing nodes may then both lead, a build more.
            Look::Stale(None) => {
                self.release(lease, "");
                return Some(None);
            }
        };
        match self.guarded("lease", lease, |c| c.put(lease, &body, condition))? {
            Some(etag) => {
                if let Look::Stale(_) = look {
                    log::debug(|| format!("object store lease {lease}: expired, taken over"));
                }
                Some(Some((token, etag)))
            }
            // Created by another node meanwhile: is it stale already (its holder died)?
            None if !look_first => self.take(lease, true),
            None => Some(None),
        }
    }

    /// What the lease object says; `None` when the store failed.
    fn look(&self, lease: &str) -> Option<Look> {
        Some(
            match self.guarded("lease", lease, |c| c.get(lease, SMALL))? {
                None => Look::Absent,
                Some(found) if live(&found.bytes) => Look::Live,
                Some(found) => Look::Stale(found.etag),
            },
        )
    }

    /// Tells the leader that a node waits (best effort: a leader that misses it writes at its
    /// flush, and this node's wait may then time out).
    fn mark_wanted(&self, name: &str) {
        let mark = self.wanted_mark(name);
        let body = stamp("", self.lease_ttl);
        self.guarded("lease wanted mark", &mark, |c| {
            c.put(&mark, &body, Condition::Always)
        });
    }

    /// The object that marks that a node waits for `name`.
    fn wanted_mark(&self, name: &str) -> String {
        format!("{}wanted/{name}", self.prefix)
    }

    /// Deletes the lease if it is still version `etag` (this holder's).
    fn release(&self, lease: &str, etag: &str) {
        let etag = (!etag.is_empty()).then_some(etag);
        self.attempt("lease release", lease, |c| c.delete(lease, etag));
    }

    /// A thread that renews the lease until the guard is dropped, and looks for a follower's
    /// mark until it finds one; `None` (the lease released) when no thread can be started.
    fn renew_while_held(
        self: &Arc<Self>,
        name: &str,
        lease: String,
        token: String,
        etag: String,
    ) -> Option<LeaseGuard> {
        bump(&self.counters.leases, 1);
        let (tx, rx) = mpsc::channel::<()>();
        let inner = Arc::clone(self);
        let version = Arc::new(Mutex::new(etag));
        let held = Arc::clone(&version);
        let key = lease.clone();
        let mark = self.wanted_mark(name);
        let polled = mark.clone();
        let wanted = Arc::new(AtomicBool::new(false));
        let marked = Arc::clone(&wanted);
        let renewing = std::thread::Builder::new()
            .name("kcache-s3-lease".into())
            .spawn(move || {
                let ttl = inner.lease_ttl;
                let mut renewed = Instant::now();
                let tick = |marked: &AtomicBool| {
                    if marked.load(Ordering::Relaxed) {
                        ttl / 3
                    } else {
                        WANTED_POLL.min(ttl / 3)
                    }
                };
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(tick(&marked)) {
                    if !marked.load(Ordering::Relaxed) {
                        let found =
                            inner.guarded("lease wanted mark", &polled, |c| c.get(&polled, SMALL));
                        if let Some(Some(mark)) = found
                            && live(&mark.bytes)
                        {
                            marked.store(true, Ordering::Relaxed);
                        }
                    }
                    if renewed.elapsed() < ttl / 3 {
                        continue;
                    }
                    let body = stamp(&token, ttl);
                    let current = held.lock().clone();
                    let condition = match current.as_str() {
                        "" => Condition::Always,
                        etag => Condition::Matches(etag),
                    };
                    let lost = |why: &str| {
                        bump(&inner.counters.leases_lost, 1);
                        log::info(|| {
                            format!(
                                "object store lease {key}: lost ({why}): another node may build \
                                 it too"
                            )
                        });
                    };
                    match inner.attempt("lease renewal", &key, |c| c.put(&key, &body, condition)) {
                        Some(Some(etag)) => {
                            renewed = Instant::now();
                            *held.lock() = etag;
                        }
                        // Taken over: this node's lease expired while it was unreachable.
                        Some(None) => return lost("taken over by another node"),
                        // Tried again at the next tick, until the lease has expired.
                        None if renewed.elapsed() >= ttl => {
                            return lost("not renewed within its time to live");
                        }
                        None => {}
                    }
                }
            });
        let Ok(renewing) = renewing else {
            self.release(&lease, &version.lock());
            return None;
        };
        Some(LeaseGuard {
            inner: Arc::clone(self),
            lease,
            version,
            wanted,
            mark,
            renewing: Some((tx, renewing)),
        })
    }
}

/// A held lease, renewed until dropped, then deleted (by the dropping thread, so that the
/// lease is gone once the write that drops it has finished).
pub(crate) struct LeaseGuard {
    inner: Arc<Inner>,
    lease: String,
    /// The lease object's version now (the renewals change it).
    version: Arc<Mutex<String>>,
    /// Set once another node has marked the entry as wanted (`mark`).
    wanted: Arc<AtomicBool>,
    mark: String,
    /// Dropping the sender stops the renewals; the thread is joined so that no renewal can
    /// recreate the lease after its deletion.
    renewing: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

impl StoreLease for LeaseGuard {
    fn wanted(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.wanted)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.renewing.take() {
            drop(stop);
            let _ = thread.join();
        }
        self.inner.release(&self.lease, &self.version.lock());
        // The entry is written (or failed): the mark has served.
        if self.wanted.load(Ordering::Relaxed) {
            let mark = &self.mark;
            self.inner
                .guarded("lease wanted mark", mark, |c| c.delete(mark, None));
        }
    }
}

/// Milliseconds since the epoch, by this node's clock (nodes sharing a store need clocks
/// within a fraction of [`LEASE_TTL`] of each other, as every NTP-synchronised host has).
fn now_ms() -> u64 {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

/// The body of a lease (or a mark, with no token): `kcache-lease <token> <expiry ms>`.
fn stamp(token: &str, ttl: Duration) -> Vec<u8> {
    let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    format!("kcache-lease {token} {}", now_ms().saturating_add(ttl)).into_bytes()
}

/// Whether a lease (or mark) body is one kcache wrote and within its expiry.
fn live(body: &[u8]) -> bool {
    let Some(text) = std::str::from_utf8(body).ok() else {
        return false;
    };
    let mut words = text.split(' ');
    let expiry = match (words.next(), words.next(), words.next(), words.next()) {
        (Some("kcache-lease"), Some(_token), Some(expiry), None) => expiry.parse::<u64>().ok(),
        _ => None,
    };
    expiry.is_some_and(|expiry| expiry > now_ms())
}

static TOKENS: AtomicU64 = AtomicU64::new(0);

/// A value no other holder (thread, process or node) will pick.
fn token() -> String {
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(&TOKENS.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    hex(&h.finalize().as_bytes()[..16])
}
