//! Disk tier configuration: explicit values first, then the environment, then defaults.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::key::KEY_SCHEMA_VERSION;

/// Default size cap: 1 GiB.
pub const DEFAULT_MAX_SIZE: u64 = 1 << 30;

/// Operator keys shorter than this are refused: a short HMAC key is guessable.
pub const MIN_OPERATOR_KEY_LEN: usize = 16;
const MAX_OPERATOR_KEY_LEN: usize = 4096;

/// Whether a write is flushed to stable storage before `put` returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// fsync the entry before the rename and the directory after it: a completed `put`
    /// survives a power loss.
    #[default]
    Sync,
    /// Skip both fsyncs. Writes stay atomic (a reader sees a whole entry or none) and survive
    /// a process crash, but a power loss may lose recent entries.
    Relaxed,
}

/// The secret that authenticates entries with HMAC-SHA256. Anyone holding it can forge
/// entries, so it belongs in a file only the cache's user can read.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorKey(Vec<u8>);

impl OperatorKey {
    /// At least [`MIN_OPERATOR_KEY_LEN`] bytes, used exactly as given.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let bytes = bytes.into();
        if bytes.len() < MIN_OPERATOR_KEY_LEN || bytes.len() > MAX_OPERATOR_KEY_LEN {
            return Err(Error::InvalidArgument(format!(
                "an operator key must be {MIN_OPERATOR_KEY_LEN} to {MAX_OPERATOR_KEY_LEN} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(OperatorKey(bytes))
    }

    /// Reads the key from a file: its whole content, byte for byte (a trailing newline is
    /// part of the key). A file that group or others may write is refused, since whoever can
    /// replace the key can forge entries.
    pub fn from_file(path: &Path) -> Result<Self> {
        let mut file = File::open(path)
            .map_err(|e| Error::Io(format!("cannot open key file {}: {e}", path.display())))?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(Error::Untrusted(format!(
                "key file {} is not a regular file",
                path.display()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(Error::Untrusted(format!(
                "key file {} is writable by group or others",
                path.display()
            )));
        }
        let mut bytes = Vec::new();
        file.by_ref()
            .take(MAX_OPERATOR_KEY_LEN as u64 + 1)
            .read_to_end(&mut bytes)?;
        OperatorKey::new(bytes)
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

/// How to open a disk tier. Fields left `None` are taken from the environment when
/// `read_env` is set (the default), else from the defaults.
///
/// | field      | environment                                              | default          |
/// |------------|----------------------------------------------------------|------------------|
/// | `dir`      | `KCACHE_DIR`, `$XDG_CACHE_HOME/kcache`, `$HOME/.cache/kcache` | none: error |
/// | `max_size` | `KCACHE_MAX_SIZE` (bytes, or with a K/M/G/T suffix)      | 1 GiB            |
/// | `key`      | `KCACHE_KEY_FILE`                                        | none: BLAKE3     |
///
/// With `read_env`, `KCACHE_DISABLE=1` turns the tier off whatever else is configured.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    pub dir: Option<PathBuf>,
    pub max_size: Option<u64>,
    pub key: Option<OperatorKey>,
    pub durability: Durability,
    /// Entries record the key schema they were written under; `gc` removes other schemas.
    pub key_schema: u32,
    pub read_env: bool,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            dir: None,
            max_size: None,
            key: None,
            durability: Durability::Sync,
            key_schema: KEY_SCHEMA_VERSION,
            read_env: true,
        }
    }
}

impl DiskConfig {
    /// Everything from the environment.
    pub fn from_env() -> Self {
        Self::default()
    }

    /// A cache in `dir`, ignoring the environment entirely (tests, embedded uses).
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        DiskConfig {
            dir: Some(dir.into()),
            read_env: false,
            ..Self::default()
        }
    }

    pub(crate) fn resolve(&self) -> Result<Resolved> {
        let env = |name: &str| {
            if self.read_env {
                crate::env::var_os(name).filter(|v| !v.is_empty())
            } else {
                None
            }
        };
        if env("KCACHE_DISABLE").is_some_and(|v| v == "1") {
            return Err(Error::Unavailable(
                "the disk tier is disabled by KCACHE_DISABLE=1".into(),
            ));
        }
        let dir = match &self.dir {
            Some(dir) => dir.clone(),
            None => default_dir(env("KCACHE_DIR"), env("XDG_CACHE_HOME"), env("HOME"))?,
        };
        let max_size = match (self.max_size, env("KCACHE_MAX_SIZE")) {
            (Some(size), _) => size,
            (None, Some(text)) => parse_size(&text.to_string_lossy())?,
            (None, None) => DEFAULT_MAX_SIZE,
        };
        if max_size == 0 {
            return Err(Error::InvalidArgument(
                "the size cap must be positive".into(),
            ));
        }
        let key = match (&self.key, env("KCACHE_KEY_FILE")) {
            (Some(key), _) => Some(key.clone()),
            (None, Some(path)) => Some(OperatorKey::from_file(Path::new(&path))?),
            (None, None) => None,
        };
        Ok(Resolved {
            dir,
            max_size,
            key,
            durability: self.durability,
            key_schema: self.key_schema,
        })
    }
}

pub(crate) struct Resolved {
    pub dir: PathBuf,
    pub max_size: u64,
    pub key: Option<OperatorKey>,
    pub durability: Durability,
    pub key_schema: u32,
}

/// `KCACHE_DIR` > `$XDG_CACHE_HOME/kcache` > `$HOME/.cache/kcache`. Relative paths are
/// ignored (the XDG rule) so the cache never lands wherever the process happens to run, and
/// there is deliberately no fallback to a shared temporary directory.
fn default_dir(
    kcache_dir: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Result<PathBuf> {
    let absolute = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = absolute(kcache_dir) {
        return Ok(dir);
    }
    if let Some(xdg) = absolute(xdg) {
        return Ok(xdg.join("kcache"));
    }
    if let Some(home) = absolute(home) {
        return Ok(home.join(".cache").join("kcache"));
    }
    Err(Error::Unavailable(
        "no cache directory: set KCACHE_DIR, XDG_CACHE_HOME or HOME".into(),
    ))
}

/// Parses `123`, `64K`, `512M`, `1G`, `2T` (binary multiples; an optional trailing `B` or
/// `iB` is accepted, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64> {
    let invalid = || Error::InvalidArgument(format!("invalid size {text:?}"));
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    let t = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match t.as_bytes().last() {
        Some(b'K') => (&t[..t.len() - 1], 10),
        Some(b'M') => (&t[..t.len() - 1], 20),
        Some(b'G') => (&t[..t.len() - 1], 30),
        Some(b'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| invalid())?;
    n.checked_mul(1u64 << shift).ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn dir_precedence() {
        let s = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(
            default_dir(s("/a"), s("/x"), s("/h")).unwrap(),
            PathBuf::from("/a")
        );
        assert_eq!(
            default_dir(None, s("/x"), s("/h")).unwrap(),
            PathBuf::from("/x/kcache")
        );
        assert_eq!(
            default_dir(None, s("relative"), s("/h")).unwrap(),
            PathBuf::from("/h/.cache/kcache")
        );
        assert!(matches!(
            default_dir(None, None, None),
            Err(Error::Unavailable(_))
        ));
    }

    #[test]
    fn short_operator_key_is_refused() {
        assert!(OperatorKey::new(vec![7u8; 15]).is_err());
        assert!(OperatorKey::new(vec![7u8; 16]).is_ok());
    }
}
