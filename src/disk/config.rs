//! What a disk tier is opened with: the values resolved from the configuration
//! (`crate::persistence::PersistenceConfig`), completed by the directory's settings.

use std::path::PathBuf;
use std::time::Duration;

use super::lock::DEFAULT_LOCK_TIMEOUT;
use super::settings::Settings;
use crate::error::{Error, Result};
use crate::log::Warning;

// The key and the parsers are configuration too: reachable here as well as from the tier.
pub use super::operator_key::{MAX_OPERATOR_KEY_LEN, MIN_OPERATOR_KEY_LEN, OperatorKey};
pub use super::units::{LONGEST_WAIT, parse_size};
pub(crate) use super::units::{parse_wait, saturate};

/// Default size cap: 1 GiB.
pub const DEFAULT_MAX_SIZE: u64 = 1 << 30;

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

/// A configuration with its explicit values and the environment's; the directory's settings
/// fill in the rest ([`Resolved::with_settings`]) once it is open.
pub(crate) struct Resolved {
    pub dir: PathBuf,
    pub max_size: Option<u64>,
    pub max_files: Option<u64>,
    pub lock_timeout: Option<Duration>,
    pub lock_liveness: Duration,
    pub key: Option<OperatorKey>,
    pub durability: Durability,
    pub key_schema: u32,
}

/// The values a tier applies: explicit or from the environment, else the directory's, else
/// the defaults.
pub(crate) struct Applied {
    pub max_size: u64,
    /// `u64::MAX`: no limit.
    pub max_files: u64,
    pub lock_timeout: Duration,
}

impl Resolved {
    /// What applies once the directory's `settings` are known; `Untrusted` when the directory
    /// requires an operator key and none is configured.
    pub(crate) fn with_settings(&self, settings: &Settings) -> Result<Applied> {
        if settings.require_key == Some(true) && self.key.is_none() {
            return Err(key_required(
                "the directory's settings require an operator key (require-key) and none is \
                 configured",
            ));
        }
        Ok(Applied {
            max_size: self
                .max_size
                .or(settings.max_size)
                .unwrap_or(DEFAULT_MAX_SIZE),
            max_files: match self.max_files.or(settings.max_files) {
                None | Some(0) => u64::MAX,
                Some(files) => files,
            },
            lock_timeout: self
                .lock_timeout
                .or(settings.lock_timeout.map(saturate))
                .unwrap_or(DEFAULT_LOCK_TIMEOUT),
        })
    }
}

/// The refusal of a tier that must have an operator key and has none, with its one warning.
pub(crate) fn key_required(detail: &str) -> Error {
    crate::log::warn_once(Warning::KeyRequired, || {
        format!("disk tier disabled: {detail}")
    });
    Error::Untrusted(detail.into())
}
