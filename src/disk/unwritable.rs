//! A directory that cannot take writes (full, over quota, read-only, not writable): nothing is
//! cached in it, which a process says once and operators' tools say when asked, rather than
//! leave users to find out from counts that stay at zero.

use std::io;

use rustix::fs::{Access, AtFlags, StatVfsMountFlags};

use super::Inner;
use crate::log::{self, Warning};

/// Whether `e`, of a write in the directory, means that the directory takes no writes at all
/// (as opposed to one write that failed).
fn means_unwritable(e: &io::Error) -> bool {
    let unwritable = [
        rustix::io::Errno::NOSPC,
        rustix::io::Errno::DQUOT,
        rustix::io::Errno::ROFS,
        rustix::io::Errno::ACCESS,
        rustix::io::Errno::PERM,
    ];
    e.raw_os_error()
        .is_some_and(|code| unwritable.iter().any(|errno| errno.raw_os_error() == code))
}

/// Notes a write in the directory that failed with `e`: one warning per process when it means
/// that nothing can be cached there.
pub(super) fn note(inner: &Inner, e: &io::Error) {
    if means_unwritable(e) {
        warned(inner, &e.to_string());
    }
}

/// Warns, once per process, that the directory cannot be written, for `why`.
pub(super) fn warned(inner: &Inner, why: &str) {
    log::warn_once(Warning::CannotWrite, || {
        format!(
            "{} cannot be written ({why}): nothing is cached there; builds go on without it",
            inner.path.display()
        )
    });
}

/// Why the directory cannot take writes now, as far as its filesystem and permissions tell:
/// mounted read-only, no space or no inode left for this user, or no write permission.
/// `None` when it can (a write may still fail).
pub(super) fn reason(inner: &Inner) -> Option<String> {
    if let Ok(fs) = rustix::fs::fstatvfs(&inner.dir) {
        if fs.f_flag.contains(StatVfsMountFlags::RDONLY) {
            return Some("a read-only filesystem".into());
        }
        if fs.f_bavail == 0 {
            return Some("no space left on its filesystem".into());
        }
        // Filesystems without inode counts report zero files in all.
        if fs.f_files != 0 && fs.f_favail == 0 {
            return Some("no inode left on its filesystem".into());
        }
    }
    // As the effective user, whom the directory must belong to.
    match rustix::fs::accessat(&inner.dir, ".", Access::WRITE_OK, AtFlags::EACCESS) {
        Err(e) => Some(format!("no write permission: {e}")),
        Ok(()) => None,
    }
}
