//! Opening the cache directory and deciding whether to trust it.
//!
//! Entries are native code a driver will load, so a directory another user can write to would
//! let them substitute code. The directory must be a real directory (not a symlink), owned by
//! the effective user and not writable by group or others. Everything afterwards is done
//! relative to the directory descriptor opened here, so renaming or replacing the path later
//! cannot redirect reads and writes.
//!
//! It also removes whatever is found at a name kcache owns in the directory ([`remove_any`]):
//! a file, a link, or a whole directory tree, never following a symbolic link.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::log::{Warning, warn_once};

/// Refuses the directory with one warning per process, however many caches are refused: the
/// memory tier keeps working, so repeating it would only be noise.
pub(crate) fn warn_untrusted(detail: &str) {
    warn_once(Warning::UntrustedDirectory, || {
        format!("disk tier disabled: {detail}")
    });
}

/// Creates the directory if missing, opens it without following a final symlink and checks
/// ownership and permissions on the opened descriptor.
pub(crate) fn open_trusted(path: &Path) -> Result<OwnedFd> {
    match open_checked(path) {
        Err(Error::Untrusted(detail)) => {
            warn_untrusted(&detail);
            Err(Error::Untrusted(detail))
        }
        other => other,
    }
}

/// The private mode of every directory kcache creates.
const PRIVATE: u32 = 0o700;

/// Creates the directory `name` in `parent` unless it exists. A directory kcache creates gets
/// mode 0700 exactly, whatever the umask: `mkdir` only ever removes bits from the mode it is
/// given, so a permissive umask cannot widen it, and the `chmod` undoes a restrictive one.
/// An existing directory is left as it is (another process may have just created it).
fn create_private(parent: &OwnedFd, name: &OsStr, path: &Path) -> Result<()> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(PRIVATE)) {
        Ok(()) => rustix::fs::chmodat(parent, name, Mode::from_raw_mode(PRIVATE), AtFlags::empty())
            .map_err(|e| io_error("set the mode of", path, e.into())),
        Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(io_error("create", path, e.into())),
    }
}

/// Opens (`O_PATH`: search permission is enough) the directory `name` in `parent`, first
/// creating it private when missing. Existing directories may be reached through symlinks (a
/// `~/.cache` linked elsewhere); only the cache directory itself must not be one.
fn open_or_create(parent: &OwnedFd, name: &OsStr, path: &Path) -> Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::openat(parent, name, flags, Mode::empty()) {
        Err(Errno::NOENT) => create_private(parent, name, path)?,
        other => return other.map_err(|e| io_error("open", path, e.into())),
    }
    rustix::fs::openat(parent, name, flags, Mode::empty())
        .map_err(|e| io_error("open", path, e.into()))
}

/// The parent of the cache directory, each missing component created private (see
/// [`open_or_create`]). `create_dir_all` is not used: it creates parents with the umask's
/// mode, which a umask of 000 makes world-writable.
fn open_parent(path: &Path) -> Result<OwnedFd> {
    let root = Path::new("/");
    let mut dir = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error("open", root, e.into()))?;
    let mut walked = root.to_path_buf();
    for component in path.components() {
        let name = match component {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => OsStr::new(".."),
            Component::Normal(name) => name,
            Component::Prefix(_) => unreachable!("no path prefixes on Unix"),
        };
        walked.push(name);
        dir = open_or_create(&dir, name, &walked)?;
    }
    Ok(dir)
}

fn open_checked(path: &Path) -> Result<OwnedFd> {
    if !path.is_absolute() {
        return Err(Error::InvalidArgument(format!(
            "the cache directory {} is a relative path",
            path.display()
        )));
    }
    let denied = |e: Errno| match e {
        Errno::LOOP | Errno::NOTDIR => Error::Untrusted(format!(
            "{} is a symbolic link or not a directory",
            path.display()
        )),
        e => io_error("open", path, e.into()),
    };
    let read_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = open_parent(parent)?;
            create_private(&parent, name, path)?;
            rustix::fs::openat(&parent, name, read_flags, Mode::empty()).map_err(denied)?
        }
        // `/` or a path ending in `..`: nothing to create.
        _ => rustix::fs::open(path, read_flags, Mode::empty()).map_err(denied)?,
    };
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

/// How deep [`remove_any`] goes into a directory tree: one descriptor is open per level, so
/// this bounds what a planted tree can cost. A deeper tree is left in place (`ENOTEMPTY`):
/// a write steps around it and `gc`, `clear` report it.
pub(crate) const MAX_REMOVE_DEPTH: usize = 16;

/// Removes what is at `name` in `dir`, whatever it is: a file, a symbolic link (the link,
/// never its target), a FIFO or socket, or a directory with everything in it. Each directory
/// of the tree is opened `O_NOFOLLOW` relative to its parent's descriptor, so a link swapped
/// in meanwhile is unlinked, not followed. `NOENT` when nothing is there.
pub(crate) fn remove_any(dir: &OwnedFd, name: &str) -> io::Result<()> {
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    remove_at(dir, &name, 0).map_err(io::Error::from)
}

fn remove_at(dir: &impl AsFd, name: &CStr, depth: usize) -> rustix::io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        // Linux's answer for a directory (and POSIX's `EPERM`).
        Err(Errno::ISDIR | Errno::PERM) => remove_tree(dir, name, depth),
        other => other,
    }
}

/// Empties the directory `name` in `dir`, depth first, then removes it. Every name in it is
/// tried even when one fails; the first failure is returned.
fn remove_tree(dir: &impl AsFd, name: &CStr, depth: usize) -> rustix::io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Err(Errno::NOTEMPTY | Errno::EXIST) if depth < MAX_REMOVE_DEPTH => {}
        other => return other,
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let inner = rustix::fs::openat(dir, name, flags, Mode::empty())?;
    // Listed first, then removed: removing while reading a directory may skip names.
    let names: Vec<CString> = rustix::fs::Dir::read_from(&inner)?
        .flatten()
        .map(|entry| entry.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    let mut first_error = None;
    for child in &names {
        match remove_at(&inner, child, depth + 1) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_dir(path: &Path) -> OwnedFd {
        rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    #[test]
    fn removes_trees_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let root = tmp.path().join("root");
        let tree = root.join("tree");
        std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
        std::fs::write(tree.join("a/b/c/file"), b"x").unwrap();
        std::fs::write(tree.join("a/file"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let dir = open_dir(&root);
        remove_any(&dir, "tree").unwrap();
        remove_any(&dir, "link").unwrap();
        assert!(!tree.exists());
        assert!(std::fs::symlink_metadata(root.join("link")).is_err());
        assert!(
            outside.join("keep").exists(),
            "a link's target is never touched"
        );
        assert_eq!(
            remove_any(&dir, "tree").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn leaves_a_tree_deeper_than_the_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let mut deep = tmp.path().join("deep");
        for _ in 0..=MAX_REMOVE_DEPTH + 1 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let dir = open_dir(tmp.path());
        assert!(remove_any(&dir, "deep").is_err());
        assert!(tmp.path().join("deep").exists());
        // Within the bound: removed.
        let mut shallow = tmp.path().join("shallow");
        for _ in 0..MAX_REMOVE_DEPTH {
            shallow.push("d");
        }
        std::fs::create_dir_all(&shallow).unwrap();
        remove_any(&dir, "shallow").unwrap();
        assert!(!tmp.path().join("shallow").exists());
    }
}
