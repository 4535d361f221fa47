//! Files kcache reads because an operator named them: the operator key, and the remote tier's
//! certificate authority, client certificate and client private key. Each path comes from the
//! environment or a configuration a program was given, so each gets the same checks before a
//! byte is read: an absolute path; opened without blocking, so a FIFO (or a device) put there
//! cannot hang the process that opens its cache; a regular file; a bounded size. A file that
//! holds a secret must also be private: owned by the effective user or root, with no
//! permission at all for group or others, since whoever can read it can impersonate the
//! process and whoever can replace it can make kcache trust what they chose.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use zeroize::Zeroizing;

use crate::error::{Error, Result};

/// Whether a file holds a secret, which must then be private to its user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    /// A certificate: anyone may read it.
    #[cfg_attr(
        not(feature = "remote"),
        allow(dead_code, reason = "only the remote tier uses it")
    )]
    Public,
    /// A key.
    Secret,
}

/// The whole content of the file `what` at `path`, at most `max_len` bytes, after the checks
/// above (symbolic links are followed: secrets are often mounted that way; the checks apply to
/// what they lead to, on the opened file). The content is read into one buffer sized from the
/// file and never grown, so no copy of a secret is left behind in freed memory; it is wiped
/// when dropped.
///
/// Errors: `InvalidArgument` (a relative path, a file over `max_len`), `Io` (cannot open or
/// read), `Untrusted` (not a regular file; for a secret, the wrong owner or permissions).
pub(crate) fn read(
    path: &Path,
    what: &str,
    content: Content,
    max_len: usize,
) -> Result<Zeroizing<Vec<u8>>> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(Error::InvalidArgument(format!(
            "{what} {shown} is a relative path"
        )));
    }
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| Error::Io(format!("cannot open {what} {shown}: {e}")))?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| Error::Io(format!("cannot read {what} {shown}: {e}")))?;
    let untrusted = |why: String| Error::Untrusted(format!("{what} {shown}: {why}"));
    if !meta.is_file() {
        return Err(untrusted("not a regular file".into()));
    }
    if content == Content::Secret {
        let euid = rustix::process::geteuid().as_raw();
        if meta.uid() != euid && meta.uid() != 0 {
            return Err(untrusted(format!(
                "owned by uid {}, neither the effective user {euid} nor root",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(untrusted(format!(
                "mode {:o} gives group or others access to a secret (chmod 600 it)",
                meta.mode() & 0o7777
            )));
        }
    }
    // One byte more than the file (or the limit) tells a longer file apart without ever
    // growing the buffer.
    let capacity = usize::try_from(meta.len())
        .unwrap_or(usize::MAX)
        .min(max_len)
        + 1;
    let mut bytes = Zeroizing::new(vec![0u8; capacity]);
    let mut filled = 0;
    let mut limited = file.take(capacity as u64);
    while filled < capacity {
        match limited.read(&mut bytes[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::Io(format!("cannot read {what} {shown}: {e}"))),
        }
    }
    if filled == capacity {
        return Err(Error::InvalidArgument(format!(
            "{what} {shown} is longer than {max_len} bytes or grew while read"
        )));
    }
    bytes.truncate(filled);
    Ok(bytes)
}
