//! Counters that outlive a process: what every process did with a directory, added up.
//!
//! A process adds what it did since its last write to one of [`SHARDS`] small files in the
//! directory, `.stats-0` … `.stats-f`, the one its process id picks, at
//! [`Disk::flush`] and when the disk tier is dropped; never on a lookup. Readers (`kcache
//! stats`) add the shards up; `kcache zero-stats` rewrites each with zeros. Several files
//! rather than one, as ccache does, so that processes ending at once rarely wait for the same
//! lock.
//!
//! Each shard is opened through the directory descriptor with `O_NOFOLLOW` and `O_NONBLOCK`,
//! must be a regular file, and is read, added to and rewritten in place under its `flock`
//! (waited for [`LOCK_WAIT`] at most: past that the delta stays in the process for its next
//! write). It is never unlinked, so every process locks the same inode. Content that is not a
//! shard of this format (foreign, truncated, torn by a crash: its checksum fails) counts as
//! zero and is overwritten by the next write. A directory the process cannot write keeps no
//! shard, silently (at `debug`).
//!
//! Layout (little-endian): magic `KCSTATS\n`, format version (u16, 1), reserved (u16, 0),
//! counter count `n` (u32, at most [`MAX_COUNTERS`]), time of the last zeroing (u64, ns since
//! the Unix epoch, 0: never), `n` counters (u64, in [`DirectoryCounters`] field order; counters
//! past those this version knows are kept as they are), BLAKE3 of everything before it (32).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use super::evict::nanos_since_epoch;
use super::{Disk, Inner};
pub use crate::directory_counters::DirectoryCounters;
use crate::error::Result;
use crate::ffi::process::{ForkLocked, Held};
use crate::log;

/// Shard files per directory.
pub const SHARDS: u32 = 16;

/// The longest wait for a shard's lock.
const LOCK_WAIT: Duration = Duration::from_secs(2);

const MAGIC: [u8; 8] = *b"KCSTATS\n";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 24;
const SUM_LEN: usize = 32;
/// Counters a shard may hold: bounds what a read allocates, whatever is in the file.
pub const MAX_COUNTERS: usize = 64;

/// The file name of shard `index`.
fn shard_name(index: u32) -> String {
    format!(".stats-{index:x}")
}

/// The directory's counters as [`Disk::directory_stats`] read them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectoryStats {
    pub counters: DirectoryCounters,
    /// When `zero_directory_stats` last ran (the latest zeroing of any shard); `None`: never.
    pub last_zeroed: Option<SystemTime>,
    /// Shard files read and added.
    pub shards: u32,
    /// Shard files that were not valid shards (foreign or damaged content, not a regular file,
    /// locked too long): counted as zero.
    pub shards_ignored: u32,
}

/// What this process has written to its shard so far. The standard library's lock, which a
/// fork takes first (see the `ForkLocked` implementation below): parking_lot's waits in a
/// table the whole process shares.
#[derive(Default)]
pub(super) struct Persisted(Mutex<DirectoryCounters>);

/// A fork waits for a persist in progress and takes its lock: a child that inherited it held
/// by a thread it does not have would wait forever at its first flush. The same for the table
/// of the entry locks this process holds, which every lookup that waits for a lock reads, and
/// for the writer's line, which every write takes.
impl ForkLocked for Inner {
    fn lock_for_fork(&self) -> Box<dyn Held + '_> {
        Box::new((
            self.persisted
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            self.held.lock_for_fork(),
            self.writer.lock_for_fork(),
        ))
    }
}

/// This process's figures since the disk tier was opened.
fn current(inner: &Inner) -> DirectoryCounters {
    let c = &inner.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    // Raw counts, not the handle's reset view: a reset must not make the deltas negative.
    let behind = inner
        .behind
        .get()
        .map(|behind| behind.counters())
        .unwrap_or_default();
    DirectoryCounters {
        memory_hits: get(&c.memory_hits),
        memory_misses: get(&c.memory_misses),
        disk_hits: get(&c.hits),
        disk_misses: get(&c.misses),
        builds: get(&c.builds),
        disk_writes: get(&c.puts),
        integrity_rejects: get(&c.integrity_rejects),
        evictions: get(&c.evictions),
        lock_waits: get(&c.lock_waits),
        lock_timeouts: get(&c.lock_timeouts),
        lock_takeovers: get(&c.lock_takeovers),
        failed_writes: get(&c.failed_writes),
        passed_through: get(&c.passed_through),
        ..behind
    }
}

/// Adds what this process did since its last write to its shard. A failure keeps the delta
/// for the next write.
pub(super) fn persist(inner: &Inner) {
    let mut last = inner
        .persisted
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let now = current(inner);
    let delta = now.zip(*last, u64::saturating_sub);
    if delta == DirectoryCounters::default() {
        return;
    }
    let index = std::process::id() % SHARDS;
    let added = add(inner, index, delta);
    if added.is_ok() {
        *last = now;
    }
    // Logged unlocked: a log callback may flush, which persists.
    drop(last);
    if let Err(e) = added {
        log::debug(|| {
            format!(
                "statistics not persisted in {} ({}): {e}",
                inner.path.display(),
                shard_name(index)
            )
        });
    }
}

/// A counter file's content (the layout above): the last zeroing and its counters, this
/// version's and any later ones. Public for tools that read counter files and for the fuzz
/// target of [`CounterRecord::decode`], which parses bytes any process of the user may have
/// written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterRecord {
    /// Nanoseconds since the Unix epoch of the last zeroing; 0: never.
    pub zeroed_ns: u64,
    /// The counters, in [`DirectoryCounters`] field order, then any a later version appended;
    /// at most [`MAX_COUNTERS`] of them.
    pub values: Vec<u64>,
}

impl CounterRecord {
    fn zero(zeroed_ns: u64) -> CounterRecord {
        CounterRecord {
            zeroed_ns,
            values: vec![0; DirectoryCounters::LEN],
        }
    }

    /// The counters this version knows: the first values, those a shorter (older) record
    /// lacks being zero.
    pub fn counters(&self) -> DirectoryCounters {
        let mut known = [0u64; DirectoryCounters::LEN];
        for (k, v) in known.iter_mut().zip(&self.values) {
            *k = *v;
        }
        DirectoryCounters::from_array(known)
    }

    /// The record's bytes, checksum included.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_LEN + 8 * self.values.len() + SUM_LEN);
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&0u16.to_le_bytes());
        bytes.extend_from_slice(&(self.values.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&self.zeroed_ns.to_le_bytes());
        for v in &self.values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let sum = blake3::hash(&bytes);
        bytes.extend_from_slice(sum.as_bytes());
        bytes
    }

    /// `None` for anything but a whole, undamaged record of this format: exactly the header,
    /// its count of counters (at most [`MAX_COUNTERS`]) and a matching checksum.
    pub fn decode(bytes: &[u8]) -> Option<CounterRecord> {
        let u64_at = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
        let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(SUM_LEN)?)?;
        if body.len() < HEADER_LEN
            || body[..8] != MAGIC
            || body[8..10] != VERSION.to_le_bytes()
            || body[10..12] != [0, 0]
        {
            return None;
        }
        let count = u32::from_le_bytes(body[12..16].try_into().ok()?) as usize;
        if count > MAX_COUNTERS || body.len() != HEADER_LEN + 8 * count {
            return None;
        }
        // Not secret: a plain comparison.
        if blake3::hash(body).as_bytes() != sum {
            return None;
        }
        Some(CounterRecord {
            zeroed_ns: u64_at(16)?,
            values: (0..count)
                .map(|i| u64_at(HEADER_LEN + 8 * i))
                .collect::<Option<_>>()?,
        })
    }
}

/// Opens shard `index` (created private when `create`), never through a symbolic link nor
/// blocking on a FIFO; anything but a regular file is refused. When creating, anything but a
/// regular file found at the name (a directory, a link, a FIFO) is removed first, a directory
/// with everything in it: no process could keep counters there otherwise.
fn open(inner: &Inner, index: u32, create: bool) -> io::Result<File> {
    match open_file(inner, index, create) {
        Err(Foreign::NotFile) if create => {
            super::dir::remove_any(&inner.dir, &shard_name(index))?;
            open_file(inner, index, create).map_err(io::Error::from)
        }
        other => other.map_err(io::Error::from),
    }
}

/// Why a shard could not be opened: something else is at its name, or another error.
enum Foreign {
    NotFile,
    Io(io::Error),
}

impl From<Foreign> for io::Error {
    fn from(f: Foreign) -> io::Error {
        match f {
            Foreign::NotFile => io::Error::other("not a regular file"),
            Foreign::Io(e) => e,
        }
    }
}

fn open_file(inner: &Inner, index: u32, create: bool) -> Result<File, Foreign> {
    let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    if create {
        flags |= OFlags::CREATE;
    }
    let fd = match rustix::fs::openat(
        &inner.dir,
        shard_name(index).as_str(),
        flags,
        Mode::from_raw_mode(0o600),
    ) {
        Ok(fd) => fd,
        // A directory, a symbolic link, a device or socket nobody serves.
        Err(Errno::ISDIR | Errno::LOOP | Errno::NXIO) => return Err(Foreign::NotFile),
        Err(e) => return Err(Foreign::Io(e.into())),
    };
    let file = File::from(fd);
    match file.metadata() {
        Ok(meta) if meta.is_file() => Ok(file),
        Ok(_) => Err(Foreign::NotFile),
        Err(e) => Err(Foreign::Io(e)),
    }
}

/// Locks `file` (`exclusive` or shared), waiting [`LOCK_WAIT`] at most.
fn lock(file: &File, exclusive: bool) -> io::Result<()> {
    let op = if exclusive {
        FlockOperation::NonBlockingLockExclusive
    } else {
        FlockOperation::NonBlockingLockShared
    };
    let deadline = Instant::now() + LOCK_WAIT;
    let mut pause = Duration::from_micros(250);
    loop {
        match rustix::fs::flock(file, op) {
            Ok(()) => return Ok(()),
            Err(Errno::WOULDBLOCK) | Err(Errno::INTR) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(Errno::WOULDBLOCK) => return Err(io::Error::other("locked too long")),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The shard's record; `None` when its content is not one.
fn read(file: &File) -> io::Result<Option<CounterRecord>> {
    let max = HEADER_LEN + 8 * MAX_COUNTERS + SUM_LEN;
    let mut bytes = vec![0u8; max + 1];
    let mut len = 0;
    loop {
        match file.read_at(&mut bytes[len..], len as u64)? {
            0 => break,
            n => len += n,
        }
        if len > max {
            return Ok(None);
        }
    }
    Ok(CounterRecord::decode(&bytes[..len]))
}

fn write(file: &File, record: &CounterRecord) -> io::Result<()> {
    let bytes = record.encode();
    file.write_all_at(&bytes, 0)?;
    file.set_len(bytes.len() as u64)
}

/// Adds `delta` to shard `index`, under its lock.
fn add(inner: &Inner, index: u32, delta: DirectoryCounters) -> io::Result<()> {
    let file = open(inner, index, true)?;
    lock(&file, true)?;
    let mut record = read(&file)?.unwrap_or_else(|| CounterRecord::zero(0));
    if record.values.len() < DirectoryCounters::LEN {
        record.values.resize(DirectoryCounters::LEN, 0);
    }
    for (value, d) in record.values.iter_mut().zip(delta.to_array()) {
        *value = value.saturating_add(d);
    }
    write(&file, &record).inspect_err(|e| {
        super::unwritable::note(inner, e);
        // A file this write created and could not fill (a full filesystem) is no shard:
        // removed, under its lock, rather than left empty for every tool to skip.
        if file.metadata().is_ok_and(|meta| meta.len() == 0) {
            let _ = rustix::fs::unlinkat(&inner.dir, shard_name(index).as_str(), AtFlags::empty());
        }
    })
}

impl Disk {
    /// The directory's counters: every process's figures since the last
    /// [`Disk::zero_directory_stats`], added up from the shard files. This process's
    /// figures are included up to its last [`Disk::flush`], or to the background
    /// writer's last periodic publication ([`super::writer::PUBLISH`]).
    pub fn directory_stats(&self) -> Result<DirectoryStats> {
        let inner = &self.inner;
        let mut stats = DirectoryStats::default();
        let mut sum = DirectoryCounters::default();
        let mut zeroed = 0;
        for index in 0..SHARDS {
            let record = match open(inner, index, false) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(_) => None,
                Ok(file) => lock(&file, false).and_then(|()| read(&file)).ok().flatten(),
            };
            let Some(record) = record else {
                stats.shards_ignored += 1;
                continue;
            };
            stats.shards += 1;
            sum = sum.zip(record.counters(), u64::saturating_add);
            zeroed = zeroed.max(record.zeroed_ns);
        }
        stats.counters = sum;
        stats.last_zeroed = (zeroed > 0).then(|| UNIX_EPOCH + Duration::from_nanos(zeroed));
        Ok(stats)
    }

    /// Zeroes every shard of the directory (each under its lock), recording when; anything
    /// but a regular file at a shard's name is removed and a zeroed shard written in its
    /// place. Processes running meanwhile add only what they do afterwards. Every shard is
    /// tried: the shards that could not be zeroed are returned (name and why), none when all
    /// were.
    pub fn zero_directory_stats(&self) -> Vec<(String, String)> {
        let inner = &self.inner;
        let now = nanos_since_epoch(SystemTime::now()).max(1);
        let mut failed = Vec::new();
        for index in 0..SHARDS {
            let zeroed = open(inner, index, true).and_then(|file| {
                lock(&file, true).and_then(|()| write(&file, &CounterRecord::zero(now)))
            });
            if let Err(e) = zeroed {
                failed.push((shard_name(index), e.to_string()));
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_counters_are_kept() {
        let record = CounterRecord {
            zeroed_ns: 0,
            values: vec![5; DirectoryCounters::LEN + 3],
        };
        let back = CounterRecord::decode(&record.encode()).unwrap();
        assert_eq!(back.values.len(), DirectoryCounters::LEN + 3);
        assert_eq!(back.counters().builds, 5);
    }

    #[test]
    fn names() {
        assert_eq!(shard_name(0), ".stats-0");
        assert_eq!(shard_name(SHARDS - 1), ".stats-f");
        for i in 0..SHARDS {
            let name = shard_name(i);
            assert!(super::super::parse_entry_name(&name).is_none());
            assert!(!super::super::is_temp_name(&name));
            assert!(super::super::lock::entry_of_lock(&name).is_none());
        }
    }
}
