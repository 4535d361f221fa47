//! Compile once across nodes: a per-entry lease in the store. Of the nodes that miss an entry
//! at once, the one that sets `<prefix>lease:<entry name>` (`SET NX PX`) builds it; the others
//! wait for its entry to appear in the store, reading it when it does. The leader renews the
//! lease from a thread of its own while it builds, and releases it once its entry is in the
//! store (or its build failed); a leader that dies lets it expire.
//!
//! A follower also sets `<prefix>wanted:<entry name>` when it starts to wait, and the leader's
//! thread looks for that mark every [`WANTED_POLL`]: a leader that holds its entry's bytes back
//! (PoCL's binaries, see `disk::write_back`) writes them as soon as a node waits, and a lone
//! node writes them when it would without the remote tier. Until then it keeps the lease.
//!
//! Every failure opens the flight up rather than stalling it: a store that cannot be reached
//! means build here; a follower builds once the lease is gone without an entry (the leader
//! failed; it takes the lease itself if it can), and when its wait reaches the deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use super::{Remote, bump};
use crate::key::hex;
use crate::log;
use crate::store::{Flight, StoreLease, Verify, failed_open};

/// How long a lease lasts unless renewed: how long followers wait for a leader that died.
pub const LEASE_TTL: Duration = Duration::from_secs(10);
/// How often a follower looks for the entry (and the lease).
const POLL: Duration = Duration::from_millis(25);
/// How often a leader looks for a follower's mark until it finds one: one `EXISTS` per held
/// lease, and at most this much added to a waiting node's wait.
pub const WANTED_POLL: Duration = Duration::from_millis(50);

/// Deletes the lease only if it is still this holder's: an expired lease may be another's now.
const RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
/// Extends the lease only if it is still this holder's.
const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                     return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0";

/// A held lease, renewed until dropped, then released (by the dropping thread, so that the
/// lease is gone once the write that drops it has finished).
pub(super) struct LeaseGuard {
    remote: Arc<Remote>,
    lease: String,
    token: String,
    /// Set once another node has marked the entry as wanted (`mark`).
    wanted: Arc<AtomicBool>,
    mark: String,
    /// Dropping it stops the renewals.
    _renewing: mpsc::Sender<()>,
}

impl StoreLease for LeaseGuard {
    /// Whether another node waits for the entry, as the leader's thread last looked.
    fn wanted(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.wanted)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // A renewal running meanwhile finds the lease gone, or not this holder's: a no-op.
        self.remote.release(&self.lease, &self.token);
        // The entry is written (or failed): the mark has served (left, it expires).
        if self.wanted.load(Ordering::Relaxed) {
            let mark = &self.mark;
            self.remote.guarded::<i64>(
                "lease wanted mark",
                mark,
                mark,
                redis::cmd("DEL").arg(mark),
            );
        }
    }
}

impl Remote {
    /// Takes the lease on `name` or waits for the node holding it, as [`Flight`] says; `verify`
    /// checks what the store hands back, as for [`Remote::fetch`].
    pub(super) fn lead_or_follow(self: &Arc<Self>, name: &str, verify: Verify<'_>) -> Flight {
        if self.lease_wait.is_zero() {
            return Flight::Build;
        }
        let lease = format!("{}lease:{name}", self.prefix);
        let deadline = Instant::now() + self.lease_wait;
        let mut waited = false;
        let failed = |why: &str| failed_open(&self.counters, "remote", name, why);
        loop {
            let token = if self.read_only {
                // A reader never leads (it writes nothing), but it follows a writer that does.
                match self.lease_exists(&lease) {
                    Some(true) => None,
                    Some(false) => return Flight::Build,
                    None => return failed("the store could not be asked for the lease"),
                }
            } else {
                match self.acquire(&lease) {
                    Some(token) => token,
                    None => return failed("the store could not be asked for the lease"),
                }
            };
            if let Some(token) = token {
                // Another node may have written the entry just before it released the lease
                // (after this node's caller looked, or during its wait): the entry is written
                // before the lease is released, so one look now sees it. One read per build,
                // and no build twice; none when the caller's read refused what is there.
                let look = waited || !self.rejected.named(name);
                if let Some(found) = look.then(|| self.peek(name, verify)).flatten() {
                    bump(&self.counters.hits, 1);
                    self.release(&lease, &token);
                    return Flight::Found(found);
                }
                return match self.renew_while_held(name, lease, token) {
                    Some(guard) => Flight::Lead(Box::new(guard)),
                    None => failed("no thread could be started to renew the lease"),
                };
            }
            if !waited {
                waited = true;
                self.mark_wanted(name);
                bump(&self.counters.lease_waits, 1);
                log::debug(|| format!("remote lease: {name}: another node builds it: waiting"));
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
                        "remote lease: {name}: timed out after {:?} waiting for another node: \
                         building here too",
                        self.lease_wait
                    )
                });
                return Flight::Build;
            }
        }
    }

    /// `Some(Some(token))`: taken; `Some(None)`: another node holds it; `None`: the store
    /// failed. A `SET` whose reply was lost (its budget ran out on a busy machine) may have
    /// taken the lease all the same: this node would then build without it while the others
    /// waited for a lease nobody renews nor releases. So a failed `SET` is followed by one
    /// `GET`, which tells this node's token from another's, and by one more `SET` when the
    /// lease is free.
    fn acquire(&self, lease: &str) -> Option<Option<String>> {
        let token = token();
        let ttl = LEASE_TTL.as_millis() as u64;
        let set = || {
            self.guarded::<Option<String>>(
                "lease",
                lease,
                lease,
                redis::cmd("SET")
                    .arg(lease)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl),
            )
        };
        if let Some(set) = set() {
            return Some(set.map(|_| token.clone()));
        }
        // The follow-up of the failed SET: a stalled server fails it too, which is the same
        // outage, not one more failure towards the breaker.
        let holder: Option<String> =
            self.unless_open("lease", lease, lease, redis::cmd("GET").arg(lease), false)?;
        match holder {
            Some(holder) => Some((holder == token).then_some(token.clone())),
            None => set().map(|set| set.map(|_| token.clone())),
        }
    }

    /// Tells the leader that a node waits (best effort: a leader that misses it writes at its
    /// flush, and this node's wait may then time out).
    fn mark_wanted(&self, name: &str) {
        let wanted = self.wanted_mark(name);
        let ttl = LEASE_TTL.as_millis() as u64;
        self.guarded::<Option<String>>(
            "lease wanted mark",
            &wanted,
            &wanted,
            redis::cmd("SET").arg(&wanted).arg(1).arg("PX").arg(ttl),
        );
    }

    /// The key of the mark that a node waits for `name`.
    fn wanted_mark(&self, name: &str) -> String {
        format!("{}wanted:{name}", self.prefix)
    }

    fn lease_exists(&self, lease: &str) -> Option<bool> {
        self.guarded("lease", lease, lease, redis::cmd("EXISTS").arg(lease))
    }

    fn release(&self, lease: &str, token: &str) {
        self.attempt::<i64>(
            "lease release",
            lease,
            lease,
            redis::cmd("EVAL").arg(RELEASE).arg(1).arg(lease).arg(token),
            true,
        );
    }

    /// A thread that renews the lease until the guard is dropped, and looks for a follower's
    /// mark until it finds one; `None` (the lease released) when no thread can be started.
    fn renew_while_held(
        self: &Arc<Self>,
        name: &str,
        lease: String,
        token: String,
    ) -> Option<LeaseGuard> {
        bump(&self.counters.leases, 1);
        let (tx, rx) = mpsc::channel::<()>();
        let remote = Arc::clone(self);
        let ttl = LEASE_TTL.as_millis() as u64;
        let (held, mine) = (lease.clone(), token.clone());
        let mark = self.wanted_mark(name);
        let polled = mark.clone();
        let wanted = Arc::new(AtomicBool::new(false));
        let marked = Arc::clone(&wanted);
        let renewing = std::thread::Builder::new()
            .name("kcache-lease".into())
            .spawn(move || {
                let mut renewed = Instant::now();
                let tick = |marked: &AtomicBool| {
                    if marked.load(Ordering::Relaxed) {
                        LEASE_TTL / 3
                    } else {
                        WANTED_POLL
                    }
                };
                let lost = |why: &str| {
                    bump(&remote.counters.leases_lost, 1);
                    log::info(|| {
                        format!("remote lease {held}: lost ({why}): another node may build it too")
                    });
                };
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(tick(&marked)) {
                    if !marked.load(Ordering::Relaxed)
                        && remote.guarded::<bool>(
                            "lease wanted mark",
                            &polled,
                            &polled,
                            redis::cmd("EXISTS").arg(&polled),
                        ) == Some(true)
                    {
                        marked.store(true, Ordering::Relaxed);
                    }
                    if renewed.elapsed() < LEASE_TTL / 3 {
                        continue;
                    }
                    let renewal = remote.attempt::<i64>(
                        "lease renewal",
                        &held,
                        &held,
                        redis::cmd("EVAL")
                            .arg(RENEW)
                            .arg(1)
                            .arg(&held)
                            .arg(&mine)
                            .arg(ttl),
                        true,
                    );
                    match renewal {
                        Some(1) => renewed = Instant::now(),
                        Some(_) => return lost("expired, or taken by another node"),
                        // Tried again at the next tick, until the lease has expired.
                        None if renewed.elapsed() >= LEASE_TTL => {
                            return lost("not renewed within its time to live");
                        }
                        None => {}
                    }
                }
            });
        if renewing.is_err() {
            self.release(&lease, &token);
            return None;
        }
        Some(LeaseGuard {
            remote: Arc::clone(self),
            lease,
            token,
            wanted,
            mark,
            _renewing: tx,
        })
    }
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
