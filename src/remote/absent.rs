//! A build without the `remote` cargo feature has no remote tier: no Redis or TLS code. A
//! remote that is configured anyway is warned about once, never dropped silently.

use std::sync::Arc;

use super::RemoteConfig;
use crate::log::{self, Warning};
use crate::store::Store;

/// `None`, with a warning when `config` names a remote (`url`, or `KCACHE_REMOTE_URL` when it
/// reads the environment).
pub(crate) fn open(config: RemoteConfig, _keyed: bool) -> Option<Arc<dyn Store>> {
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
            "remote tier off: this kcache was built without it (cargo feature `remote`), so {} \
             is not used",
            super::masked_url(&url)
        )
    });
    None
}
