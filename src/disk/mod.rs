//! L2: the disk tier. Serialized binaries in a per-user directory, authenticated, written
//! atomically, size-capped with least-recently-used eviction.
//!
//! - [`config`]: where the directory is and what key authenticates entries.
//! - `dir`: trust checks on the directory.
//! - [`format`]: the entry encoding (see `docs/disk-format.md`); `descriptor`: what an entry
//!   says it holds (backend, device, name).
//! - `store`: `get`, `put`, `remove`; `evict`: the size cap; `gc`: collection of leftovers.
//! - `lock`: one build per entry across the processes sharing the directory.
//! - `writer`: writes made after the caller has its value, on a background thread.
//! - `listing`: entries one at a time, for operators' tools: list, check, remove.
//!
//! Every read and write goes through the directory descriptor opened (and checked) once at
//! [`DiskCache::open`], with `O_NOFOLLOW` on the entry name.

pub mod config;
mod descriptor;
mod dir;
mod evict;
pub mod format;
mod gc;
mod listing;
mod lock;
mod store;
mod writer;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use config::{DEFAULT_MAX_SIZE, DirSource, DiskConfig, Durability, OperatorKey, parse_size};
pub use descriptor::{
    CUSTOM_BACKEND, Descriptor, MAX_BACKEND_LEN, MAX_DEVICE_LEN, MAX_ENCODED_LEN, MAX_NAME_LEN,
};
pub use format::Fingerprint;
pub use gc::{DEFAULT_TEMP_MAX_AGE, GcReport};
pub use listing::{Check, EntryInfo};
pub use lock::DEFAULT_LOCK_TIMEOUT;
pub(crate) use lock::{Claim, KeyLock};
pub use store::MAX_ENTRY_SIZE;
pub use writer::QUEUE_BOUND;

use crate::error::{BuildError, Result};
use crate::key::{Key, hex, parse_hex};
use crate::log;
use format::{TAG_LEN, Tagger};

/// An open disk tier. Share it between threads (and with a tiered cache) through an `Arc`;
/// any number of processes may use the same directory at once.
pub struct DiskCache {
    inner: Arc<Inner>,
}

struct Inner {
    dir: OwnedFd,
    path: PathBuf,
    tagger: Tagger,
    fingerprint_hex: String,
    schema: u32,
    durability: Durability,
    max_size: u64,
    lock_timeout: Duration,
    counters: Counters,
    index: evict::Index,
    writer: writer::Writer,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    puts: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    integrity_rejects: AtomicU64,
    io_errors: AtomicU64,
    evictions: AtomicU64,
    removes: AtomicU64,
    load_failures: AtomicU64,
    lock_waits: AtomicU64,
    lock_timeouts: AtomicU64,
    lock_takeovers: AtomicU64,
    failed_writes: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// Counters since this `DiskCache` was opened (per process), plus what its index knows of
/// the directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub hits: u64,
    /// Every `get` that returned no entry: absent, rejected or failed.
    pub misses: u64,
    pub puts: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Entries refused by a read (bad tag, wrong key, truncated, too large, symlink,
    /// directory, …) and removed, and directories a write found at its entry's name and
    /// removed.
    pub integrity_rejects: u64,
    pub io_errors: u64,
    /// Entries removed by the size cap.
    pub evictions: u64,
    /// Entries removed by `remove`.
    pub removes: u64,
    /// Entries that verified but that the backend could not load (a driver update changed
    /// what it accepts, …), removed by `discard_unloadable`.
    pub load_failures: u64,
    /// Misses that waited for another process building the same entry (its lock), then
    /// read what it published or, when it failed or died, built.
    pub lock_waits: u64,
    /// Waits that reached the lock timeout; each of those misses built without waiting more.
    pub lock_timeouts: u64,
    /// Misses that found the lock released by a process that died building: they built.
    pub lock_takeovers: u64,
    /// Background writes queued or running now.
    pub pending_writes: u64,
    /// Background writes that failed: the value could not be serialized or written (the
    /// caller had its value already; the next process builds it again).
    pub failed_writes: u64,
    /// Entry files and their bytes, as far as the index knows: complete once
    /// `scan_complete`, and then exact while no call is in flight and no other process
    /// changes the directory.
    pub entries: u64,
    pub bytes: u64,
    /// Whether the scan of the directory that `open` starts has finished
    /// ([`DiskCache::wait_scan`] waits for it).
    pub scan_complete: bool,
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

impl DiskCache {
    /// Opens (creating if needed, mode 0700) and checks the directory. Refusals:
    /// `Unavailable` (disabled, no directory configured), `Untrusted` (with one warning per
    /// process, see [`crate::log`]), `InvalidArgument` (bad size or key), `Io`. Every refusal
    /// is logged at `debug` (`disk tier off: …`).
    pub fn open(config: DiskConfig) -> Result<DiskCache> {
        Self::open_resolved(config).inspect_err(|e| log::debug(|| format!("disk tier off: {e}")))
    }

    fn open_resolved(config: DiskConfig) -> Result<DiskCache> {
        let resolved = config.resolve()?;
        let dir = dir::open_trusted(&resolved.dir)?;
        let tagger = Tagger::new(resolved.key.as_ref());
        let inner = Arc::new(Inner {
            dir,
            path: resolved.dir,
            fingerprint_hex: hex(&tagger.fingerprint()),
            tagger,
            schema: resolved.key_schema,
            durability: resolved.durability,
            max_size: resolved.max_size,
            lock_timeout: resolved.lock_timeout,
            counters: Counters::default(),
            index: evict::Index::default(),
            writer: writer::Writer::default(),
        });
        evict::start_scan(&inner);
        Ok(DiskCache { inner })
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

    /// How long a miss waits for another process building the same entry.
    pub fn lock_timeout(&self) -> Duration {
        self.inner.lock_timeout
    }

    /// The largest entry file this cache writes or reads: the smaller of the size cap and
    /// [`MAX_ENTRY_SIZE`]. A larger file at an entry name is refused and removed unread.
    pub fn max_entry_size(&self) -> u64 {
        self.inner.max_entry_size()
    }

    /// Fingerprint of the operator key entries are written under (zero without a key).
    pub fn fingerprint(&self) -> Fingerprint {
        self.inner.tagger.fingerprint()
    }

    pub fn stats(&self) -> DiskStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (usage, scan_complete) = self.inner.index.known_usage();
        DiskStats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            puts: get(&c.puts),
            bytes_read: get(&c.bytes_read),
            bytes_written: get(&c.bytes_written),
            integrity_rejects: get(&c.integrity_rejects),
            io_errors: get(&c.io_errors),
            evictions: get(&c.evictions),
            removes: get(&c.removes),
            load_failures: get(&c.load_failures),
            lock_waits: get(&c.lock_waits),
            lock_timeouts: get(&c.lock_timeouts),
            lock_takeovers: get(&c.lock_takeovers),
            pending_writes: self.inner.writer.pending(),
            failed_writes: get(&c.failed_writes),
            entries: usage.entries,
            bytes: usage.bytes,
            scan_complete,
        }
    }

    /// Waits for the scan of the directory that `open` starts (milliseconds even for a full
    /// cache). Until it finishes, `stats` counts only what this handle wrote, and writes wait
    /// for it; reads do not.
    pub fn wait_scan(&self) {
        self.inner.index.wait_seeded();
    }

    /// Entries and bytes in the directory. Waits for the background scan that seeds the size
    /// index after `open` (milliseconds even for a full cache): meant for reporting, not for
    /// a lookup path.
    pub fn usage(&self) -> Usage {
        self.inner.index.wait_seeded();
        self.inner.index.known_usage().0
    }

    /// Waits until every background write submitted so far has finished (written or
    /// failed). Dropping the disk tier flushes too.
    pub fn flush(&self) {
        self.inner.writer.flush();
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

    /// Writes the entry for `key`, described by `descriptor`, on the background writer, with
    /// the bytes `make` returns there, then releases `lock`; `done` learns whether it was
    /// written. A failure is counted in `failed_writes` and marked on the lock, so that
    /// waiting processes build rather than wait for an entry that will not come.
    pub(crate) fn write_back(
        &self,
        key: Key,
        build_time: Duration,
        descriptor: Descriptor,
        lock: Option<KeyLock>,
        make: impl FnOnce() -> std::result::Result<Vec<u8>, BuildError> + Send + 'static,
        done: impl FnOnce(bool) + Send + 'static,
    ) {
        let inner = Arc::clone(&self.inner);
        self.inner.writer.submit(move || {
            let written = make()
                .map_err(|e| format!("the value could not be serialized: {}", e.message))
                .and_then(|bytes| {
                    store::put(&inner, &key, &bytes, build_time, &descriptor)
                        .map_err(|e| e.to_string())
                });
            if let Err(why) = &written {
                log::info(|| format!("disk write of {} failed: {why}", inner.entry_name(&key)));
                bump(&inner.counters.failed_writes, 1);
                if let Some(lock) = lock {
                    lock.abandon();
                }
            }
            done(written.is_ok());
        });
    }
}

impl Drop for DiskCache {
    /// Pending writes are finished first: a value built in this process is not lost because
    /// the cache was dropped right after.
    fn drop(&mut self) {
        self.flush();
    }
}

// File names. Entries: `<fingerprint hex 16>-<key hex 64>.kce`; temporaries:
// `.<entry name>.<random hex 16>.tmp`. Nothing outside these two patterns is ever touched.
const ENTRY_SUFFIX: &str = ".kce";
const ENTRY_NAME_LEN: usize = 16 + 1 + 64 + ENTRY_SUFFIX.len();

impl Inner {
    fn entry_name(&self, key: &Key) -> String {
        format!("{}-{}{ENTRY_SUFFIX}", self.fingerprint_hex, key.to_hex())
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
