//! `get`, `put` and `remove`.
//!
//! A write goes to a fresh temporary file in the cache directory (exclusive create, no
//! symlink following), is fsynced, renamed over the entry name and the directory is fsynced:
//! a reader opens either the previous complete entry or the new complete one, and a crash
//! leaves at most a temporary file that `gc` collects. A read checks the whole entry before
//! handing out a byte of it; anything wrong is a miss, counted, and the file is removed.
//!
//! No entry is larger than [`MAX_ENTRY_SIZE`] (or the cap, if smaller): a read refuses a
//! larger file before allocating, and allocates fallibly, so a planted sparse file of any
//! declared size is a miss, never an abort.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::evict::{Index, TOUCH_GRANULARITY, Unlinked, lstat_at, nanos_since_epoch};
use super::format::{DESCRIPTOR_LEN_FIELD, HEADER_LEN, OVERHEAD, TAG_LEN};
use super::{Descriptor, Disk, Durability, Entry, Inner, bump};
use crate::error::{Error, Result};
use crate::key::{Key, hex};
use crate::log;

/// Largest entry file (header, payload and tag) written or read, whatever the cap: a read
/// holds a whole entry in memory, so this bounds what one read can allocate.
pub const MAX_ENTRY_SIZE: u64 = 1 << 30;

impl Disk {
    /// Reads and verifies the entry for `key`. `Ok(None)`: no entry. `Err(Integrity)`: an
    /// entry was there but failed verification (bad content, larger than
    /// [`Disk::max_entry_size`], not a regular file) and has been removed (a directory
    /// with everything in it, never following a link). `Err(Io)`: it could not be read (or
    /// its size could not be allocated). All three count as misses.
    pub fn get(&self, key: &Key) -> Result<Option<Entry>> {
        let inner = &self.inner;
        let name = inner.entry_name(key);
        let outcome = read_entry(inner, &name, key);
        let c = &inner.counters;
        match &outcome {
            Ok(Some(entry)) => {
                bump(&c.hits, 1);
                bump(&c.bytes_read, entry.bytes.len() as u64);
                return outcome;
            }
            Ok(None) => bump(&c.misses, 1),
            Err(Error::Integrity(_)) => {
                bump(&c.misses, 1);
                bump(&c.integrity_rejects, 1);
            }
            Err(_) => {
                bump(&c.misses, 1);
                bump(&c.io_errors, 1);
            }
        }
        log::debug(|| match &outcome {
            Err(e) => format!("disk miss: {e}"),
            _ => format!("disk miss: {name}: absent"),
        });
        outcome
    }

    /// Writes the entry for `key`, replacing any previous one. Concurrent writers of one key
    /// each write their own temporary file; the last rename wins and no reader sees a mix.
    /// Room is made (least recently used entries evicted) before the entry appears, so this
    /// process's writes never take the directory over the cap; a write made right after
    /// `open` waits for the opening scan to know what is there. An entry larger than
    /// [`Disk::max_entry_size`] is refused with `InvalidArgument`, from its length, before
    /// a byte of it is read. A directory at the entry's name is moved aside and removed with
    /// everything in it (counted in `integrity_rejects`): the write takes its place. The
    /// entry's descriptor is the default one (backend `custom`, no device, no name);
    /// [`Disk::put_described`] gives one.
    pub fn put(&self, key: &Key, payload: &[u8], build_time: Duration) -> Result<()> {
        self.put_described(key, payload, build_time, &Descriptor::default())
    }

    /// [`Disk::put`], with what the entry holds (`kcache ls` shows it, `kcache evict`
    /// selects by it).
    pub fn put_described(
        &self,
        key: &Key,
        payload: &[u8],
        build_time: Duration,
        descriptor: &Descriptor,
    ) -> Result<()> {
        put(&self.inner, key, payload, build_time, descriptor)
    }

    /// Refuses (`InvalidArgument`, as [`Disk::put_described`] would) a payload of `len`
    /// bytes too large for an entry with `descriptor`, from its length alone: for a caller
    /// that has only a length yet (a C buffer, a serializer's announced size).
    pub fn check_payload_len(&self, len: usize, descriptor: &Descriptor) -> Result<()> {
        check_payload_len(&self.inner, len, descriptor)
    }

    /// Removes the entry for `key` (or whatever else is at its name, a directory with
    /// everything in it); `Ok(false)` when there was none.
    pub fn remove(&self, key: &Key) -> Result<bool> {
        let removed = self.unlink(key)?;
        if removed {
            bump(&self.inner.counters.removes, 1);
        }
        Ok(removed)
    }

    /// Removes an entry whose payload verified but could not be loaded by its consumer, and
    /// counts it as a load failure: rebuilding then overwrites it with one that loads.
    pub fn discard_unloadable(&self, key: &Key) -> Result<bool> {
        bump(&self.inner.counters.load_failures, 1);
        self.unlink(key)
    }

    fn unlink(&self, key: &Key) -> Result<bool> {
        let inner = &self.inner;
        let name = inner.entry_name(key);
        match Index::unlink(inner, &name, None) {
            Ok(outcome) => Ok(outcome == Unlinked::Removed),
            Err(e) => {
                bump(&inner.counters.io_errors, 1);
                Err(Error::Io(format!("cannot remove {name}: {e}")))
            }
        }
    }
}

/// The payload size of the entry for `key` as its header says, unverified and uncounted: for
/// deciding whether to rewrite it, not for trusting it.
pub(super) fn stored_len(inner: &Inner, key: &Key) -> Option<u64> {
    let name = inner.entry_name(key);
    let meta = lstat_at(&inner.dir, &name).ok()?;
    if !meta.is_file() {
        return None;
    }
    let fd = rustix::fs::openat(
        &inner.dir,
        name.as_str(),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut head = [0u8; HEADER_LEN];
    File::from(fd).read_exact(&mut head).ok()?;
    // The fixed part holds the payload length in every format.
    Some(u64::from_le_bytes(head[56..64].try_into().ok()?))
}

/// [`Disk::put`], for the background writer too.
pub(super) fn put(
    inner: &Arc<Inner>,
    key: &Key,
    payload: &[u8],
    build_time: Duration,
    descriptor: &Descriptor,
) -> Result<()> {
    // Before a byte of the payload is hashed: an oversized one is refused at once.
    check_payload_len(inner, payload.len(), descriptor)?;
    let (header, tag) = inner.sealer.seal(key, payload, build_time, descriptor);
    let size = (payload.len() + header.len() + tag.len()) as u64;
    let name = inner.entry_name(key);
    match write_entry(inner, &name, &[&header, payload, &tag]) {
        Ok(()) => {
            bump(&inner.counters.puts, 1);
            bump(&inner.counters.bytes_written, size);
            Ok(())
        }
        Err(e) => {
            bump(&inner.counters.io_errors, 1);
            super::unwritable::note(inner, &e);
            Err(Error::Io(format!(
                "cannot write {} in {}: {e}",
                name,
                inner.path.display()
            )))
        }
    }
}

/// Bytes an entry with `descriptor` adds to its payload: the format 2 header and the tag.
fn entry_overhead(descriptor: &Descriptor) -> u64 {
    (HEADER_LEN + DESCRIPTOR_LEN_FIELD + descriptor.encoded_len() + TAG_LEN) as u64
}

/// Refuses (`InvalidArgument`) a payload of `len` bytes whose entry, with `descriptor`, would
/// be larger than the entry size limit. It looks at the length alone, so a caller can check a
/// length before it reads or allocates anything of that size.
pub(super) fn check_payload_len(inner: &Inner, len: usize, descriptor: &Descriptor) -> Result<()> {
    let size = (len as u64).saturating_add(entry_overhead(descriptor));
    if size > inner.max_entry_size() {
        return Err(Error::InvalidArgument(format!(
            "an entry of {size} bytes exceeds the entry size limit of {} bytes",
            inner.max_entry_size()
        )));
    }
    Ok(())
}

fn read_entry(inner: &Inner, name: &str, key: &Key) -> Result<Option<Entry>> {
    // NONBLOCK: a FIFO planted under an entry name must not hang the reader.
    let fd = match rustix::fs::openat(
        &inner.dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::LOOP) => {
            // The link itself, so that a file a writer renamed over it meanwhile is kept.
            let ino = lstat_at(&inner.dir, name).ok().map(|m| m.ino());
            return Err(reject(inner, name, ino, "the entry is a symbolic link"));
        }
        Err(e) => return Err(Error::Io(format!("cannot open {name}: {e}"))),
    };
    let mut file = File::from(fd);
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(reject(inner, name, Some(meta.ino()), "a directory"));
    }
    if !meta.is_file() {
        return Err(reject(inner, name, Some(meta.ino()), "not a regular file"));
    }
    let size = meta.len();
    // Bounds before allocating: a valid entry is never larger than the entry size limit.
    if size < OVERHEAD || size > inner.max_entry_size() {
        return Err(reject(inner, name, Some(meta.ino()), "size out of bounds"));
    }
    let bytes =
        read_bounded(&mut file, size).map_err(|e| Error::Io(format!("cannot read {name}: {e}")))?;
    if bytes.len() as u64 != size {
        return Err(reject(inner, name, Some(meta.ino()), "changed while read"));
    }
    let entry = match inner.sealer.verify(key, bytes) {
        Ok(entry) => entry,
        Err(reason) => return Err(reject(inner, name, Some(meta.ino()), reason)),
    };
    let now = SystemTime::now();
    let stale = meta.modified().is_ok_and(|m| {
        now.duration_since(m)
            .is_ok_and(|age| age > TOUCH_GRANULARITY)
    });
    if stale && file.set_modified(now).is_ok() {
        inner.index.touch(name, nanos_since_epoch(now));
    }
    Ok(Some(entry))
}

/// Reads a whole file of `size` bytes (as its metadata said), allocating fallibly: a file
/// whose size cannot be allocated is an I/O error, not an abort. At most `size + 1` bytes are
/// read, so a file that grew meanwhile shows as a length mismatch instead of being read on.
pub(super) fn read_bounded(file: &mut File, size: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    usize::try_from(size)
        .ok()
        .and_then(|n| bytes.try_reserve_exact(n).ok())
        .ok_or_else(|| io::Error::other(format!("cannot allocate {size} bytes")))?;
    file.take(size + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Removes a refused entry (a file, or a directory and what it holds), unless the name now
/// holds another file (a writer replaced it meanwhile), and returns the error for the caller.
fn reject(inner: &Inner, name: &str, ino: Option<u64>, reason: &str) -> Error {
    match ino.map(|ino| Index::unlink(inner, name, Some(ino))) {
        Some(Err(e)) => Error::Integrity(format!("{name}: {reason}; cannot remove it: {e}")),
        _ => Error::Integrity(format!("{name}: {reason}")),
    }
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary name no other writer (thread or process) will pick; creation is exclusive
/// anyway, so a collision only costs a retry.
pub(super) fn temp_name(entry: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(&TEMP_COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(&nanos_since_epoch(SystemTime::now()).to_le_bytes());
    h.update(format!("{:?}", std::thread::current().id()).as_bytes());
    format!(".{entry}.{}.tmp", hex(&h.finalize().as_bytes()[..8]))
}

fn write_entry(inner: &Arc<Inner>, name: &str, parts: &[&[u8]]) -> io::Result<()> {
    let (temp, mut file) = create_temp(inner, name)?;
    let sync = inner.durability == Durability::Sync;
    let published = (|| {
        for part in parts {
            file.write_all(part)?;
        }
        if sync {
            file.sync_data()?;
        }
        let meta = file.metadata()?;
        Index::publish(inner, &temp, name, &meta)
    })();
    if published.is_err() {
        // Not renamed: the temporary is still there.
        let _ = rustix::fs::unlinkat(&inner.dir, temp.as_str(), AtFlags::empty());
        return published;
    }
    if sync {
        rustix::fs::fsync(&inner.dir)?;
    }
    Ok(())
}

fn create_temp(inner: &Inner, name: &str) -> io::Result<(String, File)> {
    let mut attempts = 0;
    loop {
        let temp = temp_name(name);
        match rustix::fs::openat(
            &inner.dir,
            temp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => return Ok((temp, File::from(fd))),
            Err(Errno::EXIST) if attempts < 8 => attempts += 1,
            Err(e) => return Err(e.into()),
        }
    }
}
