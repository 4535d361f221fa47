//! A build without the `remote` cargo feature has no remote tier: no Redis or TLS code. A
//! remote that is configured anyway is warned about once, never dropped silently.

use std::convert::Infallible;

use super::{Flight, RemoteConfig, RemoteStats};
use crate::log::{self, Warning};

/// An open remote tier, of which this build has none: no value of it exists, so the disk
/// tier's `Option<Arc<Remote>>` is always `None`.
pub(crate) struct Remote(Infallible);

/// What a caller's check makes of an entry's bytes: the value, or why it refused them.
type Verified<T> = Result<T, String>;

/// A lease held on the remote tier; none can be held.
pub(crate) struct LeaseGuard(Infallible);

/// As the tier's own guard, which releases its lease when dropped: the lookup drops it at the
/// point where the lease must end.
impl Drop for LeaseGuard {
    fn drop(&mut self) {
        match self.0 {}
    }
}

impl LeaseGuard {
    pub(crate) fn wanted(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        match self.0 {}
    }
}

impl Remote {
    /// `None`, with a warning when `config` names a remote (`url`, or `KCACHE_REMOTE_URL` when
    /// it reads the environment).
    pub(crate) fn open(config: RemoteConfig, _keyed: bool) -> Option<Remote> {
        let url = config.url.or_else(|| {
            config
                .read_env
                .then(|| crate::env::var_os("KCACHE_REMOTE_URL"))
                .flatten()
                .filter(|v| !v.is_empty())
                .map(|v| v.to_string_lossy().into_owned())
        })?;
        log::warn_once(Warning::RemoteConfig, || {
            format!(
                "remote tier off: this kcache was built without it (cargo feature `remote`), \
                 so {} is not used",
                super::masked_url(&url)
            )
        });
        None
    }

    pub(crate) fn stats(&self) -> RemoteStats {
        match self.0 {}
    }

    pub(crate) fn raw_stats(&self) -> RemoteStats {
        match self.0 {}
    }

    pub(crate) fn reset_stats(&self) {
        match self.0 {}
    }

    pub(crate) fn fetch<T>(&self, _: &str, _: impl FnOnce(Vec<u8>) -> Verified<T>) -> Option<T> {
        match self.0 {}
    }

    pub(crate) fn writes(&self) -> bool {
        match self.0 {}
    }

    pub(crate) fn store(&self, _name: &str, _entry: &[u8]) {
        match self.0 {}
    }

    pub(crate) fn flight<T>(&self, _: &str, _: impl Fn(Vec<u8>) -> Verified<T>) -> Flight<T> {
        match self.0 {}
    }
}
