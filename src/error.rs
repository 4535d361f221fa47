//! The crate-wide error type. Every variant maps to one `kc_status` code in the C ABI.

use std::fmt;

/// Identifies a device for per-device eviction. Callers pick the numbering (an ordinal, an
/// index into their own device table, …); kcache only compares them.
pub type DeviceId = i64;

/// Declares a callback's error: a caller-defined code and a human-readable detail, shown as
/// "`$what` failed with code N: detail".
macro_rules! callback_error {
    (
        $(#[$doc:meta])* $name:ident, $what:literal
        $(, $(#[$field_doc:meta])* $flag:ident)?
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            pub code: i32,
            pub message: String,
            $($(#[$field_doc])* pub $flag: bool,)?
        }

        impl $name {
            pub fn new(code: i32, message: impl Into<String>) -> Self {
                Self {
                    code,
                    message: message.into(),
                    $($flag: false,)?
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($what, " failed with code {}"), self.code)?;
                if !self.message.is_empty() {
                    write!(f, ": {}", self.message)?;
                }
                Ok(())
            }
        }
    };
}

callback_error!(
    /// Why a build callback failed: a caller-defined code (a driver status, an exit code, …) and
    /// a human-readable detail such as a compiler log. Shared unchanged with every single-flight
    /// waiter.
    BuildError,
    "build",
    /// Set by the `transient` constructor: the failure says nothing about the input (out of
    /// memory, a lost context), so a `load` that fails this way keeps the disk entry and the
    /// lookup fails with this error instead of building.
    transient
);

impl BuildError {
    /// A failure of the moment rather than of the input (the `transient` field says what a
    /// `load` does with it).
    pub fn transient(code: i32, message: impl Into<String>) -> Self {
        Self {
            transient: true,
            ..Self::new(code, message)
        }
    }
}

callback_error!(
    /// Why a destroy callback failed.
    DestroyError,
    "destroy"
);

/// Everything that can go wrong in kcache. Cloneable because one outcome of a single-flight
/// build is handed to every waiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Build(BuildError),
    #[error("the build panicked")]
    BuildPanicked,
    #[error("device {0} was evicted while the value was being built")]
    DeviceDestroyed(DeviceId),
    #[error("the cache was cleared while the value was being built")]
    CacheCleared,
    #[error("{0}")]
    Destroy(DestroyError),
    #[error("a build asked the cache for the key it is building")]
    Reentrant,
    #[error("not found")]
    NotFound,
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("I/O error: {0}")]
    Io(String),
    #[error("integrity check failed: {0}")]
    Integrity(String),
    #[error("untrusted: {0}")]
    Untrusted(String),
    #[error("backend error: {0}")]
    Backend(String),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
