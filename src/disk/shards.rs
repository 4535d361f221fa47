//! Counters that outlive a process: what every process did with a directory, added up.
//!
//! A process adds what it did since its last write to one of [`SHARDS`] small files in the
//! directory, `.stats-0` … `.stats-f`, the one its process id picks, at
//! [`Persistence::flush`] and when the disk tier is dropped; never on a lookup. Readers (`kcache
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
use super::{Inner, Persistence};
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

macro_rules! directory_counters {
    ($($(#[$doc:meta])* $field:ident,)+) => {
        /// What the processes using a directory did with it, added up over every process since
        /// the counters were last zeroed. Each process counts what its own caches did; the
        /// memory-tier figures come from the caches that use this disk tier.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct DirectoryCounters {
            $($(#[$doc])* pub $field: u64,)+
        }

        impl DirectoryCounters {
            const LEN: usize = [$(stringify!($field)),+].len();

            fn to_array(self) -> [u64; Self::LEN] {
                [$(self.$field),+]
            }

            fn from_array(values: [u64; Self::LEN]) -> Self {
                let [$($field),+] = values;
                DirectoryCounters { $($field),+ }
            }

            /// Every counter with its field's name, in the fields' order.
            pub fn named(self) -> [(&'static str, u64); Self::LEN] {
                [$((stringify!($field), self.$field)),+]
            }
        }
    };
}

directory_counters! {
    /// Lookups a memory tier answered (from caches that report to this disk tier).
    memory_hits,
    /// Lookups a memory tier did not answer.
    memory_misses,
    /// Reads of this directory that returned a verified entry.
    disk_hits,
    /// Reads that returned none: absent, rejected or failed.
    disk_misses,
    /// Values built because neither tier had them.
    builds,
    /// Entries written.
    disk_writes,
    /// Entries refused by a read (and removed).
    integrity_rejects,
    /// Entries removed by the size cap.
    evictions,
    /// Misses that waited for another process building the same entry.
    lock_waits,
    /// Waits that reached the lock timeout.
    lock_timeouts,
    /// Builds taken over from a process that died building.
    lock_takeovers,
    /// Background writes that failed.
    failed_writes,
    // The remote tier's counters (`RemoteStats`, its breaker's state apart), appended to the
    // first layout: a shorter record's missing counters are zero.
    /// Remote entries read and verified.
    remote_hits,
    /// Remote reads that returned no usable entry.
    remote_misses,
    /// Remote entries refused by verification.
    remote_rejects,
    /// Remote operations that failed, timeouts apart.
    remote_errors,
    /// Remote operations that ran past their budget.
    remote_timeouts,
    /// Remote operations skipped while the breaker was open.
    remote_skipped,
    /// Times the breaker opened.
    remote_breaker_trips,
    /// Leases taken: builds led for every node.
    remote_leases,
    /// Misses that waited for another node holding the lease.
    remote_lease_waits,
    /// Of those, waits that reached the deadline.
    remote_lease_timeouts,
    /// Entries written to the remote.
    remote_puts,
    /// Bytes read from the remote.
    remote_bytes_read,
    /// Bytes written to the remote.
    remote_bytes_written,
    // Appended to the second layout, as the remote tier's were to the first.
    /// Builds a backend could not key (a computed `#include` it cannot expand, an
    /// option that reads a file): compiled and cached nowhere.
    passed_through,
}

impl DirectoryCounters {
    fn zip(self, other: Self, f: impl Fn(u64, u64) -> u64) -> Self {
        let (a, b) = (self.to_array(), other.to_array());
        DirectoryCounters::from_array(std::array::from_fn(|i| f(a[i], b[i])))
    }

    /// `memory_hits / (memory_hits + memory_misses)`; `None` without lookups.
    pub fn memory_hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.memory_hits, self.memory_misses)
    }

    /// `disk_hits / (disk_hits + disk_misses)`; `None` without reads.
    pub fn disk_hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.disk_hits, self.disk_misses)
    }

    /// `remote_hits / (remote_hits + remote_misses)`; `None` without remote reads.
    pub fn remote_hit_rate(&self) -> Option<f64> {
        crate::stats::hit_rate(self.remote_hits, self.remote_misses)
    }
}

/// The directory's counters as [`Persistence::directory_stats`] read them.
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
/// of the entry locks this process holds, which every lookup that waits for a lock reads.
impl ForkLocked for Inner {
    fn lock_for_fork(&self) -> Box<dyn Held + '_> {
        Box::new((
            self.persisted
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            self.held.lock_for_fork(),
        ))
    }
}

/// This process's figures since the disk tier was opened.
fn current(inner: &Inner) -> DirectoryCounters {
    let c = &inner.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    // Raw counts, not the handle's reset view: a reset must not make the deltas negative.
    let r = inner
        .remote
        .as_ref()
        .map(|r| r.raw_stats())
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
        ..crate::remote::flattened!(DirectoryCounters, r)
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

impl Persistence {
    /// The directory's counters: every process's figures since the last
    /// [`Persistence::zero_directory_stats`], added up from the shard files. This process's
    /// figures are included up to its last [`Persistence::flush`], or to the background
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
    fn records_round_trip_and_refuse_damage() {
        let record = CounterRecord {
            zeroed_ns: 7,
            values: (1..=DirectoryCounters::LEN as u64).collect(),
        };
        let bytes = record.encode();
        let back = CounterRecord::decode(&bytes).unwrap();
        assert_eq!(back.zeroed_ns, 7);
        assert_eq!(back.counters().memory_hits, 1);
        assert_eq!(back.counters().failed_writes, 12);
        assert_eq!(back.counters().remote_bytes_written, 25);
        assert_eq!(
            back.counters().passed_through,
            DirectoryCounters::LEN as u64
        );
        for i in [0, 9, 20, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(CounterRecord::decode(&bad).is_none(), "byte {i}");
        }
        assert!(CounterRecord::decode(&bytes[..bytes.len() - 1]).is_none());
        assert!(CounterRecord::decode(b"").is_none());
        assert!(CounterRecord::decode(b"hello, world").is_none());
    }

    #[test]
    fn an_older_shorter_record_reads_its_missing_counters_as_zero() {
        // The first layout: twelve counters, before the remote tier's were appended.
        let first = 12;
        let record = CounterRecord {
            zeroed_ns: 3,
            values: (1..=first as u64).collect(),
        };
        let back = CounterRecord::decode(&record.encode()).unwrap();
        let c = back.counters();
        assert_eq!((c.memory_hits, c.failed_writes), (1, 12));
        assert_eq!((c.remote_hits, c.remote_bytes_written), (0, 0));
        // A longer record of the current layout counts the remote tier.
        let full = CounterRecord {
            zeroed_ns: 0,
            values: (1..=DirectoryCounters::LEN as u64).collect(),
        };
        let c = CounterRecord::decode(&full.encode()).unwrap().counters();
        assert_eq!(c.remote_hits, first as u64 + 1);
        assert_eq!(c.remote_bytes_written, 25);
        assert_eq!(c.passed_through, DirectoryCounters::LEN as u64);
    }

    #[test]
    fn the_remote_tiers_counters_land_in_their_own_fields() {
        let remote = crate::remote::RemoteStats {
            hits: 1,
            misses: 2,
            rejects: 3,
            errors: 4,
            timeouts: 5,
            skipped: 6,
            breaker_trips: 7,
            leases: 8,
            lease_waits: 9,
            lease_timeouts: 10,
            puts: 11,
            bytes_read: 12,
            bytes_written: 13,
            breaker_open: true,
        };
        let named = crate::remote::flattened!(DirectoryCounters, remote).named();
        let (flat, rest): (Vec<_>, Vec<_>) = named
            .iter()
            .partition(|(name, _)| name.starts_with("remote_"));
        // In the remote tier's order, each from its own counter; nothing else touched.
        let values: Vec<u64> = flat.iter().map(|&(_, v)| v).collect();
        assert_eq!(values, (1..=13).collect::<Vec<u64>>());
        assert!(rest.iter().all(|&(_, v)| v == 0), "{rest:?}");
    }

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
