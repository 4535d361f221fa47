//! `get`, `put` and `remove`.
//!
//! A write goes to a fresh temporary file in the cache directory (exclusive create, no
//! symlink following), is fsynced, renamed over the entry name and the directory is fsynced:
//! a reader opens either the previous complete entry or the new complete one, and a crash
//! leaves at most a temporary file that `gc` collects. A read checks the whole entry before
//! handing out a byte of it; anything wrong is a miss, counted, and the file is removed.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::evict::{Index, TOUCH_GRANULARITY, lstat_at, nanos_since_epoch};
use super::format::{self, Expect, FORMAT_VERSION, Header, OVERHEAD};
use super::{DiskCache, Durability, Entry, Inner, bump};
use crate::error::{Error, Result};
use crate::key::{Key, hex};

impl DiskCache {
    /// Reads and verifies the entry for `key`. `Ok(None)`: no entry. `Err(Integrity)`: an
    /// entry was there but failed verification and has been removed. `Err(Io)`: it could not
    /// be read. All three count as misses.
    pub fn get(&self, key: &Key) -> Result<Option<Entry>> {
        let inner = &self.inner;
        let name = inner.entry_name(key);
        let outcome = read_entry(inner, &name, key);
        let c = &inner.counters;
        match &outcome {
            Ok(Some(entry)) => {
                bump(&c.hits, 1);
                bump(&c.bytes_read, entry.bytes.len() as u64);
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
        outcome
    }

    /// Writes the entry for `key`, replacing any previous one. Concurrent writers of one key
    /// each write their own temporary file; the last rename wins and no reader sees a mix.
    /// A payload larger than the size cap is refused with `InvalidArgument`.
    pub fn put(&self, key: &Key, payload: &[u8], build_time: Duration) -> Result<()> {
        let inner = &self.inner;
        let size = payload.len() as u64 + OVERHEAD;
        if size > inner.max_size {
            return Err(Error::InvalidArgument(format!(
                "an entry of {size} bytes exceeds the size cap of {} bytes",
                inner.max_size
            )));
        }
        let header = Header {
            version: FORMAT_VERSION,
            algorithm: inner.tagger.algorithm(),
            schema: inner.schema,
            fingerprint: inner.tagger.fingerprint(),
            key: *key,
            payload_len: payload.len() as u64,
            build_nanos: u64::try_from(build_time.as_nanos()).unwrap_or(u64::MAX),
        }
        .encode();
        let tag = inner.tagger.tag(&[&header, payload]);
        let name = inner.entry_name(key);
        match write_entry(inner, &name, &[&header, payload, &tag]) {
            Ok(meta) => {
                bump(&inner.counters.puts, 1);
                bump(&inner.counters.bytes_written, size);
                Index::record(inner, name, &meta);
                Ok(())
            }
            Err(e) => {
                bump(&inner.counters.io_errors, 1);
                Err(Error::Io(format!(
                    "cannot write {} in {}: {e}",
                    name,
                    inner.path.display()
                )))
            }
        }
    }

    /// Removes the entry for `key`; `Ok(false)` when there was none.
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
        inner.index.forget(&name);
        match rustix::fs::unlinkat(&inner.dir, name.as_str(), AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => {
                bump(&inner.counters.io_errors, 1);
                Err(Error::Io(format!("cannot remove {name}: {e}")))
            }
        }
    }
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
        Err(Errno::LOOP) => return Err(reject(inner, name, None, "the entry is a symbolic link")),
        Err(e) => return Err(Error::Io(format!("cannot open {name}: {e}"))),
    };
    let mut file = File::from(fd);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(reject(inner, name, Some(meta.ino()), "not a regular file"));
    }
    let size = meta.len();
    // Bounds before allocating: a valid entry is never larger than the cap.
    if size < OVERHEAD || size > inner.max_size {
        return Err(reject(inner, name, Some(meta.ino()), "size out of bounds"));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    (&mut file).take(size + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != size {
        return Err(reject(inner, name, Some(meta.ino()), "changed while read"));
    }
    let expect = Expect {
        tagger: &inner.tagger,
        schema: inner.schema,
        key,
    };
    let header = match format::verify(&bytes, &expect) {
        Ok(header) => header,
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
    Ok(Some(Entry {
        bytes,
        build_time: Duration::from_nanos(header.build_nanos),
    }))
}

/// Removes a refused entry, unless the name now holds another file (a writer replaced it
/// meanwhile), and returns the error for the caller.
fn reject(inner: &Inner, name: &str, ino: Option<u64>, reason: &str) -> Error {
    let still_there = match lstat_at(&inner.dir, name) {
        Ok(meta) => ino.is_none_or(|ino| meta.ino() == ino),
        Err(_) => false,
    };
    if still_there {
        let _ = rustix::fs::unlinkat(&inner.dir, name, AtFlags::empty());
    }
    inner.index.forget(name);
    Error::Integrity(format!("{name}: {reason}"))
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary name no other writer (thread or process) will pick; creation is exclusive
/// anyway, so a collision only costs a retry.
fn temp_name(entry: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(&TEMP_COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(&nanos_since_epoch(SystemTime::now()).to_le_bytes());
    h.update(format!("{:?}", std::thread::current().id()).as_bytes());
    format!(".{entry}.{}.tmp", hex(&h.finalize().as_bytes()[..8]))
}

fn write_entry(inner: &Inner, name: &str, parts: &[&[u8]]) -> io::Result<std::fs::Metadata> {
    let (temp, mut file) = create_temp(inner, name)?;
    let written = (|| {
        for part in parts {
            file.write_all(part)?;
        }
        let sync = inner.durability == Durability::Sync;
        if sync {
            file.sync_data()?;
        }
        let meta = file.metadata()?;
        rustix::fs::renameat(&inner.dir, temp.as_str(), &inner.dir, name)?;
        if sync {
            rustix::fs::fsync(&inner.dir)?;
        }
        Ok(meta)
    })();
    if written.is_err() {
        // After a failed rename the temporary is still there; after a failed directory
        // fsync it is already gone and this is a no-op.
        let _ = rustix::fs::unlinkat(&inner.dir, temp.as_str(), AtFlags::empty());
    }
    written
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
