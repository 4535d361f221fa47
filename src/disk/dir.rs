//! Opening the cache directory and deciding whether to trust it.
//!
//! Entries are native code a driver will load, so a directory another user can write to would
//! let them substitute code. The directory must be a real directory (not a symlink), owned by
//! the effective user and not writable by group or others. Everything afterwards is done
//! relative to the directory descriptor opened here, so renaming or replacing the path later
//! cannot redirect reads and writes.

use std::fs::DirBuilder;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags};

use crate::error::{Error, Result};

static WARNED: AtomicBool = AtomicBool::new(false);

/// One line on stderr per process, however many caches are refused: the memory tier keeps
/// working, so repeating it would only be noise.
pub(crate) fn warn_untrusted(detail: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("kcache: disk tier disabled: {detail}");
    }
}

/// Creates the directory (mode 0700) if missing, opens it without following a final symlink
/// and checks ownership and permissions on the opened descriptor.
pub(crate) fn open_trusted(path: &Path) -> Result<OwnedFd> {
    match open_checked(path) {
        Err(Error::Untrusted(detail)) => {
            warn_untrusted(&detail);
            Err(Error::Untrusted(detail))
        }
        other => other,
    }
}

fn open_checked(path: &Path) -> Result<OwnedFd> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| io_error("create", parent, e))?;
    }
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error("create", path, e)),
    }
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => Error::Untrusted(format!(
            "{} is a symbolic link or not a directory",
            path.display()
        )),
        e => io_error("open", path, e.into()),
    })?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata()?;
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(Error::Untrusted(format!(
            "{} is owned by uid {}, not by the effective user {euid}",
            path.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Error::Untrusted(format!(
            "{} is writable by group or others (mode {:o})",
            path.display(),
            meta.mode() & 0o7777
        )));
    }
    Ok(file.into())
}

fn io_error(what: &str, path: &Path, e: io::Error) -> Error {
    Error::Io(format!("cannot {what} {}: {e}", path.display()))
}
