//! How the persistent tiers are configured: explicit values first, then the environment,
//! then the directory's settings, then defaults.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::disk::config::{Resolved, key_required, parse_wait, saturate};
use crate::disk::{
    DEFAULT_LOCK_LIVENESS, DEFAULT_LOCK_TIMEOUT, Durability, MIN_LOCK_LIVENESS, OperatorKey,
    parse_size,
};
use crate::error::{Error, Result};
use crate::key::KEY_SCHEMA_VERSION;
use crate::log::Warning;
use crate::object_store::ObjectStoreConfig;
use crate::remote::RemoteConfig;
use crate::store::StoreKind;

/// How to open a disk tier. Fields left `None` are taken from the environment when
/// `read_env` is set (the default), else from the directory's settings (`kcache.conf`, see
/// [`crate::disk::settings`]: `max_size`, `max_files`, `lock_timeout`, `require_key`), else from
/// the defaults.
///
/// | field         | environment                                                   | directory      | default      |
/// |---------------|---------------------------------------------------------------|----------------|--------------|
/// | `dir`         | `KCACHE_DIR`, `$XDG_CACHE_HOME/kcache`, `$HOME/.cache/kcache` |                | none: error  |
/// | `max_size`    | `KCACHE_MAX_SIZE` (a size: `5G`, `1.5Gi`, see [`parse_size`]) | `max-size`     | 1 GiB        |
/// | `max_files`   | `KCACHE_MAX_FILES` (entry files; 0: no limit)                 | `max-files`    | no limit     |
/// | `key`         | `KCACHE_KEY_FILE`                                             |                | none: BLAKE3 |
/// | `require_key` | `KCACHE_REQUIRE_KEY=1` (any of code, environment, directory)  | `require-key`  | not required |
/// | `lock_timeout`| `KCACHE_LOCK_TIMEOUT` (seconds, decimals allowed; up to a century) | `lock-timeout` | 120 s  |
/// | `lock_liveness`| `KCACHE_LOCK_LIVENESS` (seconds, decimals allowed; at least 1 s) |            | 5 s          |
///
/// With `read_env`, `KCACHE_DISABLE=1` turns the tier off whatever else is configured.
///
/// Environment values kcache cannot use are warned about once per process (see
/// [`crate::log`]): a relative `KCACHE_DIR` is ignored; an invalid `KCACHE_LOCK_TIMEOUT` leaves
/// the default; an invalid `KCACHE_MAX_SIZE` or `KCACHE_MAX_FILES` or an empty, relative,
/// missing or unusable `KCACHE_KEY_FILE` turns the tier off (`Unavailable`, `Untrusted`)
/// rather than falling back to a cap or to unkeyed entries the operator did not ask for. A
/// directory's settings file that cannot be used is ignored, with one warning (see
/// [`crate::disk::settings`]).
///
/// In a secure-execution process (setuid, setgid, file capabilities) no variable but
/// `KCACHE_DISABLE` and `KCACHE_REQUIRE_KEY` is read (see [`crate::env`]): the tier is off
/// unless `dir` is set, and entries are keyed only by an explicit `key`.
#[derive(Debug)]
pub struct PersistenceConfig {
    /// An absolute path; a relative or empty one is refused (`InvalidArgument`) rather than
    /// resolved against whatever the working directory happens to be.
    pub dir: Option<PathBuf>,
    /// Positive; `Some(0)` is refused.
    pub max_size: Option<u64>,
    /// The most entry files the directory holds, evicted least recently used first as the
    /// size cap's are; `Some(0)`: no limit.
    pub max_files: Option<u64>,
    pub key: Option<OperatorKey>,
    /// Refuse to open (`Untrusted`) without an operator key, instead of writing unkeyed
    /// entries that anyone who can write the directory can forge.
    pub require_key: bool,
    /// How long a miss waits for another process that is building the same entry before it
    /// builds too ([`DEFAULT_LOCK_TIMEOUT`]); `Some(Duration::ZERO)` never waits. Any longer
    /// than [`LONGEST_WAIT`](crate::disk::config::LONGEST_WAIT) (`Duration::MAX` for "forever") is taken as that.
    pub lock_timeout: Option<Duration>,
    /// How long a miss waits for another process building the same entry once that process
    /// shows no sign of life (its heartbeat stands still: stopped, or gone while a process it
    /// forked keeps its lock): then this process takes the build over
    /// ([`DEFAULT_LOCK_LIVENESS`]; at least [`MIN_LOCK_LIVENESS`]; one longer than the lock
    /// timeout changes nothing). A process that still builds keeps its waiters, up to the
    /// lock timeout.
    pub lock_liveness: Option<Duration>,
    pub durability: Durability,
    /// Entries record the key schema they were written under; `gc` removes other schemas.
    pub key_schema: u32,
    pub read_env: bool,
    /// The remote tier behind the disk; `None` takes it from the environment when `read_env`
    /// is set (`KCACHE_REMOTE_URL`, see [`RemoteConfig`]), else none.
    pub remote: Option<RemoteConfig>,
    /// The object store behind the disk (the S3 API); `None` takes it from the environment
    /// when `read_env` is set (`KCACHE_S3_URL`, see [`ObjectStoreConfig`]), else none.
    pub object_store: Option<ObjectStoreConfig>,
    /// The order in which a lookup asks the stores behind the disk (kinds not listed follow
    /// in the default order: Redis, then the object store); `None`: `KCACHE_STORE_ORDER`
    /// (`s3,redis`) when `read_env`, else the default.
    pub store_order: Option<Vec<StoreKind>>,
    /// Whether an entry found in a store is copied to the stores before it in the chain that
    /// take writes (the disk tier always gets its copy); `None`: `KCACHE_STORE_BACKFILL`
    /// (`0` or `1`) when `read_env`, else yes.
    pub backfill: Option<bool>,
}

impl Default for PersistenceConfig {
    fn default() -> Self {
        PersistenceConfig {
            dir: None,
            max_size: None,
            max_files: None,
            key: None,
            require_key: false,
            lock_timeout: None,
            lock_liveness: None,
            durability: Durability::Sync,
            key_schema: KEY_SCHEMA_VERSION,
            read_env: true,
            remote: None,
            object_store: None,
            store_order: None,
            backfill: None,
        }
    }
}

/// Why a secure-execution process has no disk tier by default.
const SECURE_NEEDS_DIR: &str =
    "secure-execution process: the disk tier needs an explicit directory";

impl PersistenceConfig {
    /// Everything from the environment.
    pub fn from_env() -> Self {
        Self::default()
    }

    /// A cache in `dir` (absolute), ignoring the environment entirely (tests, embedded uses).
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        PersistenceConfig {
            dir: Some(dir.into()),
            read_env: false,
            ..Self::default()
        }
    }

    /// The directory this configuration names and where it comes from, as [`Persistence::open`]
    /// resolves it, without opening or checking it and whatever else is configured (a tier
    /// that `KCACHE_DISABLE=1` or a bad key turns off still has a directory to report).
    ///
    /// [`Persistence::open`]: crate::Persistence::open
    pub fn locate_dir(&self) -> Result<(PathBuf, DirSource)> {
        let non_empty = |name: &str| {
            self.read_env
                .then(|| crate::env::var_os(name))
                .flatten()
                .filter(|v| !v.is_empty())
        };
        match &self.dir {
            Some(dir) if dir.as_os_str().is_empty() => Err(Error::InvalidArgument(
                "the cache directory is an empty path".into(),
            )),
            Some(dir) if !dir.is_absolute() => Err(Error::InvalidArgument(format!(
                "the cache directory {} is a relative path",
                dir.display()
            ))),
            Some(dir) => Ok((dir.clone(), DirSource::Explicit)),
            None if self.read_env && crate::env::secure_execution() => {
                Err(Error::Unavailable(SECURE_NEEDS_DIR.into()))
            }
            None => default_dir(
                non_empty("KCACHE_DIR"),
                non_empty("XDG_CACHE_HOME"),
                non_empty("HOME"),
            ),
        }
    }

    /// The disk tier's values and the stores' configurations.
    pub(crate) fn resolve(self) -> Result<(Resolved, Stores)> {
        let read_env = self.read_env;
        let env = |name: &str| {
            if read_env {
                crate::env::var_os(name)
            } else {
                None
            }
        };
        let non_empty = |name: &str| env(name).filter(|v| !v.is_empty());
        if read_env && crate::env::disk_disabled() {
            return Err(Error::Unavailable(
                "the disk tier is disabled by KCACHE_DISABLE=1".into(),
            ));
        }
        let (dir, _) = self.locate_dir()?;
        let max_size = match (self.max_size, non_empty("KCACHE_MAX_SIZE")) {
            (Some(0), _) => {
                return Err(Error::InvalidArgument(
                    "the size cap must be positive".into(),
                ));
            }
            (Some(size), _) => Some(size),
            (None, Some(text)) => Some(env_max_size(&text)?),
            (None, None) => None,
        };
        let max_files = match (self.max_files, non_empty("KCACHE_MAX_FILES")) {
            (Some(files), _) => Some(files),
            (None, Some(text)) => Some(env_max_files(&text)?),
            (None, None) => None,
        };
        // An empty KCACHE_KEY_FILE is a mistake to report, not "unset": it usually comes from
        // a variable that failed to expand, and ignoring it would silently drop the key.
        let key = match (self.key, env("KCACHE_KEY_FILE")) {
            (Some(key), _) => Some(key),
            (None, Some(path)) => Some(env_key_file(&path)?),
            (None, None) => None,
        };
        // Read in a secure-execution process too: it only ever takes the tier away.
        let require_key =
            self.require_key || env_require_key(read_env.then(crate::env::require_key).flatten());
        // Checked before the directory is opened (or created) when code or environment require
        // a key; again by `with_settings` for a directory that does.
        if require_key && key.is_none() {
            return Err(key_required(
                "an operator key is required (require_key or KCACHE_REQUIRE_KEY=1) and none is \
                 configured",
            ));
        }
        let lock_timeout = self.lock_timeout.map(saturate).or_else(|| {
            let text = non_empty("KCACHE_LOCK_TIMEOUT")?;
            let default = DEFAULT_LOCK_TIMEOUT;
            env_lock_wait("KCACHE_LOCK_TIMEOUT", &text, default, Warning::LockTimeout)
        });
        let lock_liveness = self
            .lock_liveness
            .map(saturate)
            .or_else(|| {
                let text = non_empty("KCACHE_LOCK_LIVENESS")?;
                let default = DEFAULT_LOCK_LIVENESS;
                env_lock_wait(
                    "KCACHE_LOCK_LIVENESS",
                    &text,
                    default,
                    Warning::LockLiveness,
                )
            })
            .unwrap_or(DEFAULT_LOCK_LIVENESS)
            .max(MIN_LOCK_LIVENESS);
        let disk = Resolved {
            dir,
            max_size,
            max_files,
            lock_timeout,
            lock_liveness,
            key,
            durability: self.durability,
            key_schema: self.key_schema,
        };
        let stores = Stores {
            remote: self
                .remote
                .or_else(|| read_env.then(RemoteConfig::from_env)),
            object_store: self
                .object_store
                .or_else(|| read_env.then(ObjectStoreConfig::from_env)),
            order: self
                .store_order
                .map(StoreKind::completed)
                .or_else(|| env_store_order(non_empty("KCACHE_STORE_ORDER")?))
                .unwrap_or_else(|| StoreKind::ALL.to_vec()),
            backfill: self
                .backfill
                .or_else(|| env_backfill(non_empty("KCACHE_STORE_BACKFILL")?))
                .unwrap_or(true),
        };
        Ok((disk, stores))
    }
}

/// The configurations of the stores behind the disk tier, explicit or from the environment.
pub(crate) struct Stores {
    pub remote: Option<RemoteConfig>,
    pub object_store: Option<ObjectStoreConfig>,
    /// Every kind, in the order lookups ask them.
    pub order: Vec<StoreKind>,
    pub backfill: bool,
}

/// `KCACHE_STORE_ORDER`: a list it cannot use leaves the default order, with one warning.
fn env_store_order(text: OsString) -> Option<Vec<StoreKind>> {
    let text = text.to_string_lossy();
    StoreKind::parse_order(&text)
        .inspect_err(|why| {
            crate::log::warn_once(Warning::StoreChain, || {
                format!("KCACHE_STORE_ORDER={text:?}: {why}: the default order (redis, s3) is used")
            })
        })
        .ok()
}

/// `KCACHE_STORE_BACKFILL`: `0` or `1`; anything else leaves the default (on), with one
/// warning.
fn env_backfill(text: OsString) -> Option<bool> {
    match text.to_string_lossy().trim() {
        "0" => Some(false),
        "1" => Some(true),
        other => {
            crate::log::warn_once(Warning::StoreChain, || {
                format!("KCACHE_STORE_BACKFILL={other:?} is neither 0 nor 1: backfill stays on")
            });
            None
        }
    }
}

/// Where [`PersistenceConfig::locate_dir`] found the directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirSource {
    /// [`PersistenceConfig::dir`].
    Explicit,
    /// `KCACHE_DIR`.
    KcacheDir,
    /// `$XDG_CACHE_HOME/kcache`.
    XdgCacheHome,
    /// `$HOME/.cache/kcache`.
    Home,
}

/// `KCACHE_MAX_FILES`: like `KCACHE_MAX_SIZE`, a value that is not a number of files turns
/// the tier off.
fn env_max_files(text: &OsString) -> Result<u64> {
    let text = text.to_string_lossy();
    text.trim().parse().map_err(|_| {
        let detail = format!(
            "KCACHE_MAX_FILES={text:?} is not a number of files (0: no limit): the disk tier \
             is off"
        );
        crate::log::warn_once(Warning::MaxFiles, || detail.clone());
        Error::Unavailable(detail)
    })
}

/// `KCACHE_MAX_SIZE`: a value that is not a positive size turns the tier off, since the
/// operator meant some cap and kcache cannot tell which.
fn env_max_size(text: &OsString) -> Result<u64> {
    let text = text.to_string_lossy();
    match parse_size(&text) {
        Ok(size) if size > 0 => Ok(size),
        _ => {
            let detail = format!(
                "KCACHE_MAX_SIZE={text:?} is not a positive size (bytes, or with a unit: k, M, \
                 G, T, Ki, Mi, Gi, Ti): the disk tier is off"
            );
            crate::log::warn_once(Warning::MaxSize, || detail.clone());
            Err(Error::Unavailable(detail))
        }
    }
}

/// `KCACHE_LOCK_TIMEOUT` or `KCACHE_LOCK_LIVENESS`: seconds, decimals allowed; however large,
/// as long as possible. A value that is not one leaves the default, with one warning: unlike a
/// size cap or a key, a lock's wait only trades waiting for building.
fn env_lock_wait(
    name: &str,
    text: &OsString,
    default: Duration,
    warning: Warning,
) -> Option<Duration> {
    let text = text.to_string_lossy();
    let parsed = parse_wait(&text, Duration::from_secs(1));
    if parsed.is_none() {
        crate::log::warn_once(warning, || {
            format!(
                "{name}={text:?} is not a number of seconds: the default ({} s) is used",
                default.as_secs()
            )
        });
    }
    parsed
}

/// `KCACHE_KEY_FILE`: any problem turns the tier off (`Untrusted`) rather than falling back
/// to unkeyed entries the operator did not ask for.
fn env_key_file(path: &OsString) -> Result<OperatorKey> {
    let refuse = |why: String| {
        let detail = format!("KCACHE_KEY_FILE={path:?}: {why}: the disk tier is off");
        crate::log::warn_once(Warning::KeyFile, || detail.clone());
        Error::Untrusted(detail)
    };
    if path.is_empty() {
        return Err(refuse("set but empty".into()));
    }
    OperatorKey::from_file(Path::new(path)).map_err(|e| {
        refuse(match e {
            Error::InvalidArgument(m) | Error::Io(m) | Error::Untrusted(m) => m,
            other => other.to_string(),
        })
    })
}

/// `KCACHE_REQUIRE_KEY`: unset, empty or `0` require nothing, `1` requires a key. Anything
/// else is taken as `1`: someone meant to turn the requirement on.
fn env_require_key(value: Option<OsString>) -> bool {
    match value {
        None => false,
        Some(v) if v.is_empty() || v == "0" => false,
        Some(v) if v == "1" => true,
        Some(v) => {
            crate::log::warn_once(Warning::RequireKey, || {
                format!("KCACHE_REQUIRE_KEY={v:?} is neither 0 nor 1: taken as 1")
            });
            true
        }
    }
}

/// `KCACHE_DIR` > `$XDG_CACHE_HOME/kcache` > `$HOME/.cache/kcache`. Relative paths are
/// ignored (the XDG rule) so the cache never lands wherever the process happens to run, and
/// there is deliberately no fallback to a shared temporary directory. A relative `KCACHE_DIR`,
/// which is kcache's own variable, is reported once per process.
fn default_dir(
    kcache_dir: Option<OsString>,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> Result<(PathBuf, DirSource)> {
    let absolute = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = kcache_dir.map(PathBuf::from) {
        if dir.is_absolute() {
            return Ok((dir, DirSource::KcacheDir));
        }
        crate::log::warn_once(Warning::RelativeDir, || {
            format!("KCACHE_DIR={dir:?} is a relative path: ignored")
        });
    }
    if let Some(xdg) = absolute(xdg) {
        return Ok((xdg.join("kcache"), DirSource::XdgCacheHome));
    }
    if let Some(home) = absolute(home) {
        return Ok((home.join(".cache").join("kcache"), DirSource::Home));
    }
    Err(Error::Unavailable(
        "no cache directory: set KCACHE_DIR, XDG_CACHE_HOME or HOME".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::config::LONGEST_WAIT;

    #[test]
    fn dir_precedence() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            default_dir(s("/a"), s("/x"), s("/h")).unwrap(),
            (PathBuf::from("/a"), DirSource::KcacheDir)
        );
        assert_eq!(
            default_dir(None, s("/x"), s("/h")).unwrap(),
            (PathBuf::from("/x/kcache"), DirSource::XdgCacheHome)
        );
        assert_eq!(
            default_dir(None, s("relative"), s("/h")).unwrap(),
            (PathBuf::from("/h/.cache/kcache"), DirSource::Home)
        );
        assert!(matches!(
            default_dir(None, None, None),
            Err(Error::Unavailable(_))
        ));
    }

    #[test]
    fn an_explicit_dir_is_located_as_given() {
        let (dir, source) = PersistenceConfig::in_dir("/x/y").locate_dir().unwrap();
        assert_eq!((dir, source), (PathBuf::from("/x/y"), DirSource::Explicit));
        assert!(matches!(
            PersistenceConfig::in_dir("x/y").locate_dir(),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn lock_timeouts() {
        let t = |v: &str| {
            let (default, warning) = (DEFAULT_LOCK_TIMEOUT, Warning::LockTimeout);
            env_lock_wait("KCACHE_LOCK_TIMEOUT", &OsString::from(v), default, warning)
        };
        assert_eq!(t("30"), Some(Duration::from_secs(30)));
        assert_eq!(t(" 0.25 "), Some(Duration::from_millis(250)));
        assert_eq!(t("0"), Some(Duration::ZERO));
        assert_eq!(t("-1"), None);
        assert_eq!(t("soon"), None);
        assert_eq!(t("nan"), None);
        assert_eq!(t(""), None);
        // However large: as long as possible.
        for huge in [
            "1e19",
            "1e300",
            "inf",
            "99999999999999999999999",
            "3153600001",
        ] {
            assert_eq!(t(huge), Some(LONGEST_WAIT), "{huge}");
        }
    }
}
