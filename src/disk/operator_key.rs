//! The operator key: the secret that authenticates entries with HMAC-SHA256.

use std::fmt;
use std::path::Path;

use zeroize::ZeroizeOnDrop;

use crate::error::{Error, Result};
use crate::operator_file::{self, Content};

/// Operator keys shorter than this are refused: a short HMAC key is guessable.
pub const MIN_OPERATOR_KEY_LEN: usize = 16;
/// Operator keys longer than this are refused; it also bounds what reading a key file reads.
pub const MAX_OPERATOR_KEY_LEN: usize = 4096;

/// The secret that authenticates entries with HMAC-SHA256. Anyone holding it can forge
/// entries, so it belongs in a file only the cache's user can read. Its bytes are wiped when
/// it is dropped, and it cannot be cloned, so no copy outlives it unnoticed.
#[derive(ZeroizeOnDrop)]
pub struct OperatorKey(Vec<u8>);

impl OperatorKey {
    /// [`MIN_OPERATOR_KEY_LEN`] to [`MAX_OPERATOR_KEY_LEN`] bytes, used exactly as given. A
    /// refused key is wiped too.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        OperatorKey(bytes.into()).checked()
    }

    /// A second wiped copy, for the one holder that must outlive the configuration (the
    /// disk's tagger). Deliberately not `Clone`, so copies are made only here.
    pub(crate) fn duplicate(&self) -> Self {
        OperatorKey(self.0.clone())
    }

    fn checked(self) -> Result<Self> {
        let len = self.0.len();
        if !(MIN_OPERATOR_KEY_LEN..=MAX_OPERATOR_KEY_LEN).contains(&len) {
            return Err(Error::InvalidArgument(format!(
                "an operator key must be {MIN_OPERATOR_KEY_LEN} to {MAX_OPERATOR_KEY_LEN} bytes, got {len}"
            )));
        }
        Ok(self)
    }

    /// Reads the key from a file: its whole content, byte for byte (a trailing newline is
    /// part of the key). The file gets the checks of every secret an operator names (see
    /// `operator_file`): an absolute path; symbolic links followed (secrets are often mounted
    /// that way) to a regular file owned by the effective user or root that grants group and
    /// others no permission at all, since whoever can read the key can forge entries, and
    /// whoever can replace it can make kcache trust their entries; opened without blocking (a
    /// FIFO is refused rather than waited on). The key is read into one buffer sized from the
    /// file, never reallocated, and wiped when refused.
    ///
    /// Errors: `InvalidArgument` (relative path, wrong length), `Io` (cannot open or read),
    /// `Untrusted` (not a regular file, wrong owner, group or other permissions).
    pub fn from_file(path: &Path) -> Result<Self> {
        let mut bytes =
            operator_file::read(path, "key file", Content::Secret, MAX_OPERATOR_KEY_LEN)?;
        // Moved out, not copied: the buffer's one copy of the key is now the key's.
        OperatorKey(std::mem::take(&mut *bytes)).checked()
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for OperatorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OperatorKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_operator_key_is_refused() {
        assert!(OperatorKey::new(vec![7u8; 15]).is_err());
        assert!(OperatorKey::new(vec![7u8; 16]).is_ok());
    }
}
