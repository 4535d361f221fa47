//! L2: the disk tier. Serialized binaries in a per-user directory, authenticated, written
//! atomically, size-capped with least-recently-used eviction.
//!
//! - [`config`]: the values a tier is opened with;
//!   [`settings`]: what an operator keeps in the directory for every process (`kcache.conf`).
//! - `dir`: trust checks on the directory.
//! - [`format`]: the entry encoding (see `docs/disk-format.md`); `descriptor`: what an entry
//!   says it holds (backend, device, name).
//! - `store`: `get`, `put`, `remove`; `evict`: the size and file-count caps; `gc`: collection
//!   of leftovers.
//! - `lock`: one build per entry across the processes sharing the directory; `heartbeat`: a
//!   holder's proof of life in its lock files; `liveness`: what a waiter makes of it;
//!   `budget`: one lookup's lock waits, which share one lock timeout.
//! - `writer`: writes made after the caller has its value, on a background thread;
//!   `write_back`: what it writes, and when; `exit`: what an exit without freeing still writes.
//! - `listing`: entries one at a time, for operators' tools: list, check, remove.
//! - `shards`: counters every process using the directory adds to, for operators' tools;
//!   `reported`: the figures the caches in front of the tier hand it for them.
//! - `unwritable`: a directory that takes no writes (full, read-only): said once, and on
//!   request.
//! - `seal`: what makes a payload an entry, and the check of every read, here and in the
//!   stores behind the tier; `behind`: what the tier tells those stores (`crate::persistence`).
//!
//! Every read and write goes through the directory descriptor opened (and checked) once at
//! [`crate::Persistence::open`], with `O_NOFOLLOW` on the entry name.

mod behind;
mod budget;
pub mod config;
mod descriptor;
mod dir;
mod evict;
mod exit;
pub mod format;
mod gc;
mod heartbeat;
mod listing;
mod liveness;
mod lock;
mod operator_key;
mod reported;
mod seal;
pub mod settings;
mod shards;
mod store;
mod units;
mod unwritable;
mod write_back;
mod writer;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub(crate) use behind::Behind;
pub(crate) use budget::one_lookup;
pub use config::{DEFAULT_MAX_SIZE, Durability, OperatorKey, parse_size};
pub use descriptor::{
    CUSTOM_BACKEND, Descriptor, MAX_BACKEND_LEN, MAX_DEVICE_LEN, MAX_ENCODED_LEN, MAX_NAME_LEN,
};
pub use exit::DEFAULT_EXIT_TIMEOUT;
pub use format::Fingerprint;
pub use gc::{DEFAULT_TEMP_MAX_AGE, GcReport};
pub use listing::{Check, EntryInfo};
pub use liveness::{DEFAULT_LOCK_LIVENESS, MIN_LOCK_LIVENESS};
pub use lock::DEFAULT_LOCK_TIMEOUT;
pub(crate) use lock::{Claim, KeyLock};
pub(crate) use reported::{Reported, Reporter};
pub use shards::{CounterRecord, DirectoryCounters, DirectoryStats, MAX_COUNTERS, SHARDS};
pub use store::MAX_ENTRY_SIZE;
pub use write_back::DiskBytes;
pub use writer::{POLL, QUEUE_BOUND, max_polled};

use crate::error::Result;
use crate::ffi::process;
use crate::key::{Key, parse_hex};
use crate::stats::{Baseline, Live, bump};
use format::TAG_LEN;
pub(crate) use seal::Sealer;

/// The disk tier, open: the first tier of every [`crate::Persistence`], which holds it and
/// the stores behind it. One writer thread, one set of locks, one set of counters for every
/// cache of the process; any number of processes may use the same directory at once.
pub struct Disk {
    inner: Arc<Inner>,
}

struct Inner {
    dir: OwnedFd,
    path: PathBuf,
    /// Seals what is written and verifies what is read, here and in the stores behind.
    sealer: Arc<Sealer>,
    durability: Durability,
    max_size: u64,
    /// `u64::MAX`: no limit.
    max_files: u64,
    lock_timeout: Duration,
    /// How long a holder's beat may stand still before a waiter takes its lock over.
    lock_liveness: Duration,
    counters: Counters,
    /// The counters at the last `reset_stats`.
    baseline: Baseline<DiskStats>,
    /// What this process has added to the directory's counters so far.
    persisted: shards::Persisted,
    index: evict::Index,
    writer: writer::Writer,
    /// The entry locks this process holds.
    held: lock::OwnLocks,
    /// What sits behind this tier, told of each entry published here (set once, at open).
    behind: OnceLock<Arc<dyn Behind>>,
}

crate::stats::statistics! {
    /// Counters since this `Disk` was opened or its statistics last reset (per process),
    /// plus what its index knows of the directory. `pending_writes`, `entries`, `bytes` and
    /// `scan_complete` are gauges, never reset. The directory's counters, all processes
    /// together, are [`Disk::directory_stats`].
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct DiskStats {
        counted hits,
        /// Every `get` that returned no entry: absent, rejected or failed.
        counted misses,
        counted puts,
        counted bytes_read,
        counted bytes_written,
        /// Entries refused by a read (bad tag, wrong key, truncated, too large, symlink,
        /// directory, …) and removed, and directories a write found at its entry's name and
        /// moved aside (then removed).
        counted integrity_rejects,
        counted io_errors,
        /// Entries removed by the size cap.
        counted evictions,
        /// Entries removed by `remove`.
        counted removes,
        /// Entries that verified but that the backend could not load (a driver update changed
        /// what it accepts, …), removed by `discard_unloadable`.
        counted load_failures,
        /// Misses that waited for another process building the same entry (its lock), then
        /// read what it published or, when it failed or died, built.
        counted lock_waits,
        /// Waits that reached the lock timeout; each of those misses built without waiting more.
        counted lock_timeouts,
        /// Misses that took the build over from a process that died building (its lock released
        /// without an entry) or stopped (its heartbeat stood still for the liveness window): they
        /// built.
        counted lock_takeovers,
        /// Background writes queued, held back or running now.
        gauge pending_writes,
        /// Background writes that failed: the value could not be serialized or written (the
        /// caller had its value already; the next process builds it again).
        counted failed_writes,
        /// Entry files and their bytes, as far as the index knows: complete once
        /// `scan_complete`, and then exact while no call is in flight and no other process
        /// changes the directory.
        gauge entries,
        gauge bytes,
        /// Whether the scan of the directory that `open` starts has finished
        /// ([`Disk::wait_scan`] waits for it).
        gauge scan_complete: bool,
    }
    /// What the tier counts, as it happens.
    live struct Counters {
        // Received from the caches in front of the tier, for the directory's counters only.
        memory_hits,
        memory_misses,
        builds,
        passed_through,
    }
}

impl DiskStats {
    /// `hits / (hits + misses)`; `None` before the first read.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.hits, self.misses)
    }
}

/// A verified entry. The payload is borrowed from the file's bytes, so a read copies once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    bytes: Vec<u8>,
    /// Where the payload starts: after the header, whose length depends on its format.
    payload_start: usize,
    build_time: Duration,
    descriptor: Option<Descriptor>,
}

impl Entry {
    pub fn payload(&self) -> &[u8] {
        &self.bytes[self.payload_start..self.bytes.len() - TAG_LEN]
    }

    pub fn into_payload(mut self) -> Vec<u8> {
        self.bytes.truncate(self.bytes.len() - TAG_LEN);
        self.bytes.drain(..self.payload_start);
        self.bytes
    }

    /// The whole entry as sealed: header, payload, tag (what a store behind the disk holds).
    pub(crate) fn sealed(&self) -> &[u8] {
        &self.bytes
    }

    /// How long the value took to build, as recorded by the writer.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }

    /// What the writer said the entry holds; `None` for an entry of format 1, which did not
    /// say.
    pub fn descriptor(&self) -> Option<&Descriptor> {
        self.descriptor.as_ref()
    }
}

/// Entries and bytes in the directory (entry files only, temporaries excluded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub entries: u64,
    pub bytes: u64,
}

impl Disk {
    /// Opens (creating if needed, mode 0700) and checks the directory `resolved` names.
    /// Refusals: `Untrusted` (with one warning per process, see [`crate::log`]), `Io`.
    pub(crate) fn open(resolved: config::Resolved) -> Result<Disk> {
        let dir = dir::open_trusted(&resolved.dir)?;
        let applied = resolved.with_settings(&settings::applied(&dir, &resolved.dir))?;
        let sealer = Arc::new(Sealer::new(resolved.key.as_ref(), resolved.key_schema));
        let inner = Arc::new(Inner {
            dir,
            path: resolved.dir,
            sealer,
            durability: resolved.durability,
            max_size: applied.max_size,
            max_files: applied.max_files,
            lock_timeout: applied.lock_timeout,
            lock_liveness: resolved.lock_liveness,
            counters: Counters::default(),
            baseline: Baseline::default(),
            persisted: shards::Persisted::default(),
            index: evict::Index::default(),
            writer: writer::Writer::default(),
            held: lock::OwnLocks::default(),
            behind: OnceLock::new(),
        });
        evict::start_scan(&inner);
        exit::register(&inner);
        process::lock_at_forks(Arc::downgrade(&inner) as _);
        let publishing = Arc::downgrade(&inner);
        inner.writer.every_few_seconds(Arc::new(move || {
            if let Some(inner) = publishing.upgrade() {
                shards::persist(&inner);
            }
        }));
        Ok(Disk { inner })
    }

    /// This tier's counters since it was opened, whatever `reset_stats` did, for as long as
    /// the returned function lives (the process's metrics, which count up).
    pub(crate) fn raw_stats_source(&self) -> impl Fn() -> DiskStats + Send + Sync + 'static {
        let inner = Arc::clone(&self.inner);
        move || inner.stats()
    }

    /// Hands the tier what sits behind it, before any entry is written.
    pub(crate) fn set_behind(&self, behind: Arc<dyn Behind>) {
        let _ = self.inner.behind.set(behind);
    }

    /// The sealer of this tier's entries, which the stores behind it share.
    pub(crate) fn sealer(&self) -> &Arc<Sealer> {
        &self.inner.sealer
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Where the entry for `key` lives (for operators and tests; all I/O goes through the
    /// directory descriptor, not this path).
    pub fn entry_path(&self, key: &Key) -> PathBuf {
        self.inner.path.join(self.inner.entry_name(key))
    }

    /// The file name of the entry for `key`, which messages about it give.
    pub(crate) fn entry_name(&self, key: &Key) -> String {
        self.inner.entry_name(key)
    }

    pub fn max_size(&self) -> u64 {
        self.inner.max_size
    }

    /// The file-count cap; `None` without one.
    pub fn max_files(&self) -> Option<u64> {
        (self.inner.max_files != u64::MAX).then_some(self.inner.max_files)
    }

    /// How long a miss waits for another process building the same entry.
    pub fn lock_timeout(&self) -> Duration {
        self.inner.lock_timeout
    }

    /// How long a miss waits for another process building the same entry once that process
    /// shows no sign of life (see [`crate::PersistenceConfig::lock_liveness`]).
    pub fn lock_liveness(&self) -> Duration {
        self.inner.lock_liveness
    }

    /// The largest entry file this cache writes or reads: the smaller of the size cap and
    /// [`MAX_ENTRY_SIZE`]. A larger file at an entry name is refused and removed unread.
    pub fn max_entry_size(&self) -> u64 {
        self.inner.max_entry_size()
    }

    /// Fingerprint of the operator key entries are written under (zero without a key).
    pub fn fingerprint(&self) -> Fingerprint {
        self.inner.sealer.tagger().fingerprint()
    }

    /// This process's counters since `open` or the last [`Disk::reset_stats`].
    pub fn stats(&self) -> DiskStats {
        self.inner.baseline.apply(&self.inner.stats())
    }

    /// Zeroes this handle's event counters (not the gauges, nor the directory's counters:
    /// see [`Disk::zero_directory_stats`]).
    pub fn reset_stats(&self) {
        self.inner.baseline.reset(self.inner.stats());
    }

    /// Waits for the scan of the directory that `open` starts (milliseconds even for a full
    /// cache). Until it finishes, `stats` counts only what this handle wrote, and writes wait
    /// for it; reads do not.
    pub fn wait_scan(&self) {
        evict::wait_seeded(&self.inner);
    }

    /// Entries and bytes in the directory. Waits for the background scan that seeds the size
    /// index after `open` (milliseconds even for a full cache): meant for reporting, not for
    /// a lookup path.
    pub fn usage(&self) -> Usage {
        evict::wait_seeded(&self.inner);
        self.inner.index.known_usage().0
    }

    /// Waits until every background write submitted so far has finished (written or
    /// failed), then adds what this process did since its last flush to the directory's
    /// counters ([`Disk::directory_stats`]). Dropping the disk tier flushes too. Called
    /// on the background writer's own thread (from a log hook), it cannot wait for that
    /// thread: the writes held back are queued and run once the hook returns.
    pub fn flush(&self) {
        self.inner.writer.flush();
        shards::persist(&self.inner);
    }

    /// Why the directory cannot take writes now (a read-only or full filesystem, no write
    /// permission), as far as its filesystem tells; `None` when it can. Where it cannot,
    /// nothing is cached in it, and processes say so once each (a warning).
    pub fn cannot_write(&self) -> Option<String> {
        unwritable::reason(&self.inner)
    }

    /// What a lookup that missed `key` does: build as the leader, read what another process
    /// just published, or build alone (see `lock`).
    pub(crate) fn claim(&self, key: &Key) -> Claim {
        lock::claim(&self.inner, key)
    }

    /// The lock of `key`'s entry, for a read-merge-write of it that no other process may
    /// interleave with (Vulkan's pipeline-cache data); `None` when it cannot be had in time.
    pub(crate) fn lock(&self, key: &Key) -> Option<KeyLock> {
        lock::exclusive(&self.inner, key)
    }
}

impl Drop for Disk {
    /// Pending writes are finished first: a value built in this process is not lost because
    /// the cache was dropped right after; then the directory's counters are brought up to date.
    fn drop(&mut self) {
        self.flush();
    }
}

// File names. Entries: `<fingerprint hex 16>-<key hex 64>.kce`; temporaries:
// `.<entry name>.<random hex 16>.tmp`. Nothing outside these two patterns is ever touched.
const ENTRY_SUFFIX: &str = ".kce";
const ENTRY_NAME_LEN: usize = 16 + 1 + 64 + ENTRY_SUFFIX.len();

impl Inner {
    fn stats(&self) -> DiskStats {
        let (usage, scan_complete) = self.index.known_usage();
        DiskStats {
            pending_writes: self.writer.pending(),
            entries: usage.entries,
            bytes: usage.bytes,
            scan_complete,
            ..self.counters.snapshot()
        }
    }

    fn entry_name(&self, key: &Key) -> String {
        self.sealer.entry_name(key)
    }

    fn max_entry_size(&self) -> u64 {
        self.max_size.min(MAX_ENTRY_SIZE)
    }
}

/// Parses an entry file name into its fingerprint and key.
fn parse_entry_name(name: &str) -> Option<(Fingerprint, Key)> {
    if name.len() != ENTRY_NAME_LEN || !name.ends_with(ENTRY_SUFFIX) || name.as_bytes()[16] != b'-'
    {
        return None;
    }
    let mut fp = [0u8; 8];
    let mut key = [0u8; 32];
    (parse_hex(&name[..16], &mut fp) && parse_hex(&name[17..81], &mut key))
        .then(|| (fp, Key::from_bytes(key)))
}

fn is_temp_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.').and_then(|r| r.strip_suffix(".tmp")) else {
        return false;
    };
    if rest.len() != ENTRY_NAME_LEN + 1 + 16 || rest.as_bytes()[ENTRY_NAME_LEN] != b'.' {
        return false;
    }
    let mut random = [0u8; 8];
    parse_entry_name(&rest[..ENTRY_NAME_LEN]).is_some()
        && parse_hex(&rest[ENTRY_NAME_LEN + 1..], &mut random)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::hex;

    #[test]
    fn names() {
        let key = Key::from_bytes([0xab; 32]);
        let name = format!("{}-{}{ENTRY_SUFFIX}", hex(&[1; 8]), key.to_hex());
        assert_eq!(parse_entry_name(&name), Some(([1; 8], key)));
        assert!(parse_entry_name(&name.to_uppercase()).is_none());
        assert!(parse_entry_name(&format!("{name}x")).is_none());
        let temp = format!(".{name}.{}.tmp", hex(&[2; 8]));
        assert!(is_temp_name(&temp));
        assert!(!is_temp_name(&format!(".{name}.tmp")));
        assert!(!is_temp_name("notes.txt"));
        let lock = lock::lock_name(&name);
        assert_eq!(lock, format!(".{name}.lock"));
        assert_eq!(lock::entry_of_lock(&lock), Some(name.as_str()));
        assert!(lock::entry_of_lock(&format!(".{name}")).is_none());
        assert!(lock::entry_of_lock(".notes.txt.lock").is_none());
        assert!(!is_temp_name(&lock) && parse_entry_name(&lock).is_none());
    }
}
