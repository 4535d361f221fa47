//! Entry by entry: what an operator's tool needs to list, check and remove entries one at a
//! time (the `kcache` command). Nothing here counts in [`DiskStats`](super::DiskStats),
//! refreshes an entry's mtime or removes anything it only looked at: listing and checking a
//! directory changes nothing in it.

use std::fs::{File, Metadata};
use std::io::{Read, Seek};
use std::os::unix::fs::MetadataExt;
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{Mode, OFlags};

use super::evict::{Index, Unlinked, lstat_at};
use super::format::{self, Expect, Header, MAX_HEADER_LEN, OVERHEAD};
use super::store::read_bounded;
use super::{Disk, Fingerprint, Inner, parse_entry_name};
use crate::error::{Error, Result};
use crate::key::Key;

/// One name of the entry pattern in the directory, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryInfo {
    /// The file name, `<fingerprint hex>-<key hex>.kce`.
    pub name: String,
    /// The key generation it was written under, as its name says (all zero: unkeyed).
    pub fingerprint: Fingerprint,
    pub key: Key,
    /// Whether it is a regular file; anything else at an entry name is corrupt.
    pub regular: bool,
    /// Its size in bytes (0 unless `regular`).
    pub size: u64,
    /// Its mtime: when it was last written or read (reads refresh it at most once a minute),
    /// which is what the size cap's least-recently-used order follows.
    pub modified: SystemTime,
    /// The inode listed, so that a file a writer put at the name since is never taken for it.
    ino: u64,
}

/// What [`Disk::check`] found at an entry's name. A header of format 1 has no
/// descriptor (`Header::descriptor` is `None`): such entries are read, and `gc` removes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// An entry of this cache's key that verifies in full, as a read would accept it.
    Verified(Header),
    /// A well-formed entry of this cache's key written under another key schema: no lookup
    /// reaches it, and `gc` removes it.
    StaleSchema(Header),
    /// An entry of another key generation (operator key). Its tag cannot be checked without
    /// that key, so only its structure was (header fields against its name and size).
    OtherKey(Header),
    /// Refused, and why; a read would remove it, and so does `gc` (for other key generations
    /// only when their fingerprint is retained, else as stale).
    Corrupt(&'static str),
    /// Removed or replaced since it was listed: nothing to say about it.
    Gone,
}

impl EntryInfo {
    pub(super) fn new(
        name: &str,
        fingerprint: Fingerprint,
        key: Key,
        meta: &Metadata,
    ) -> EntryInfo {
        EntryInfo {
            name: name.to_owned(),
            fingerprint,
            key,
            regular: meta.is_file(),
            size: if meta.is_file() { meta.len() } else { 0 },
            modified: meta.modified().unwrap_or(UNIX_EPOCH),
            ino: meta.ino(),
        }
    }
}

/// Opens `name` for reading if it is still the file `ino`: `None` when it was removed or
/// replaced since it was looked at. Never follows a symbolic link nor blocks on a FIFO.
fn open_unchanged(inner: &Inner, name: &str, ino: u64) -> Option<File> {
    let fd = rustix::fs::openat(
        &inner.dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let file = File::from(fd);
    file.metadata()
        .is_ok_and(|meta| meta.ino() == ino)
        .then_some(file)
}

impl Disk {
    /// Every name of the entry pattern in the directory, of every key generation, in no
    /// particular order (temporaries, lock files and foreign files are not listed).
    pub fn entries(&self) -> Result<Vec<EntryInfo>> {
        let inner = &self.inner;
        let dir = rustix::fs::Dir::read_from(&inner.dir)
            .map_err(|e| Error::Io(format!("cannot list {}: {e}", inner.path.display())))?;
        let mut found = Vec::new();
        for entry in dir.flatten() {
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            let Some((fingerprint, key)) = parse_entry_name(name) else {
                continue;
            };
            // Gone since the listing: not there to report.
            if let Ok(meta) = lstat_at(&inner.dir, name) {
                found.push(EntryInfo::new(name, fingerprint, key, &meta));
            }
        }
        Ok(found)
    }

    /// The entry at `name` (an entry file name), listed alone; `Ok(None)` when there is
    /// none, `InvalidArgument` when `name` is not an entry name.
    pub fn entry(&self, name: &str) -> Result<Option<EntryInfo>> {
        let (fingerprint, key) = parse_entry_name(name)
            .ok_or_else(|| Error::InvalidArgument(format!("{name:?} is not an entry name")))?;
        match lstat_at(&self.inner.dir, name) {
            Ok(meta) => Ok(Some(EntryInfo::new(name, fingerprint, key, &meta))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Io(format!("cannot inspect {name}: {e}"))),
        }
    }

    /// Checks the listed `entry` as a read would (entries of this cache's key: the whole
    /// file, tag included, no larger than [`Disk::max_entry_size`]) or as `gc` does
    /// (other key generations: structure only). Reads, and nothing else: no counter, no mtime
    /// refresh, no removal.
    pub fn check(&self, entry: &EntryInfo) -> Check {
        let inner = &self.inner;
        if !entry.regular {
            return Check::Corrupt("not a regular file");
        }
        if entry.size < OVERHEAD {
            return Check::Corrupt("shorter than a header and a tag");
        }
        let Some(mut file) = open_unchanged(inner, &entry.name, entry.ino) else {
            return Check::Gone;
        };
        // The longest header there can be, or the whole file when shorter.
        let mut head = Vec::new();
        let limit = entry.size.min(MAX_HEADER_LEN as u64);
        if (&mut file).take(limit).read_to_end(&mut head).is_err() {
            return Check::Corrupt("cannot be read whole");
        }
        let header = match Header::decode(&head) {
            Ok(header) => header,
            Err(reason) => return Check::Corrupt(reason),
        };
        if header.fingerprint != entry.fingerprint || header.key != entry.key {
            return Check::Corrupt("header does not match the file name");
        }
        if header.payload_len.checked_add(header.overhead()) != Some(entry.size) {
            return Check::Corrupt("payload length does not match the file size");
        }
        if entry.fingerprint != inner.sealer.tagger().fingerprint() {
            return Check::OtherKey(header);
        }
        if entry.size > inner.max_entry_size() {
            return Check::Corrupt("larger than the entry size limit");
        }
        let Ok(bytes) = file
            .rewind()
            .and_then(|()| read_bounded(&mut file, entry.size))
        else {
            return Check::Corrupt("cannot be read whole");
        };
        let expect = |schema| Expect {
            tagger: inner.sealer.tagger(),
            schema,
            key: &entry.key,
        };
        match format::verify(&bytes, &expect(inner.sealer.schema())) {
            Ok(header) => Check::Verified(header),
            // Genuine (the tag checks out under its own schema), only unreachable.
            Err(_) if header.schema != inner.sealer.schema() => {
                match format::verify(&bytes, &expect(header.schema)) {
                    Ok(header) => Check::StaleSchema(header),
                    Err(reason) => Check::Corrupt(reason),
                }
            }
            Err(reason) => Check::Corrupt(reason),
        }
    }

    /// Removes the listed `entry`, unless its name now holds another file (a writer replaced
    /// it) or it was used (read or rewritten: its mtime moved) since it was listed. Returns
    /// whether it was removed. Counted nowhere: this is an operator's removal, not a read's.
    pub fn remove_listed(&self, entry: &EntryInfo) -> Result<bool> {
        let inner = &self.inner;
        let io = |e: std::io::Error| Error::Io(format!("cannot remove {}: {e}", entry.name));
        match lstat_at(&inner.dir, &entry.name) {
            Ok(meta)
                if meta.ino() == entry.ino
                    && meta.modified().unwrap_or(UNIX_EPOCH) <= entry.modified => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io(e)),
        }
        Index::unlink(inner, &entry.name, Some(entry.ino))
            .map(|outcome| outcome == Unlinked::Removed)
            .map_err(io)
    }
}
