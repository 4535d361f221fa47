//! A build without the `object-store` cargo feature has no object-store tier: no HTTP or
//! signing code. A store that is configured anyway is warned about once, never dropped
//! silently.

use std::sync::Arc;

use super::ObjectStoreConfig;
use crate::log::{self, Warning};
use crate::store::Store;

/// `None`, with a warning when `config` names a store (`url`, or `KCACHE_S3_URL` when it reads
/// the environment).
pub(crate) fn open(config: ObjectStoreConfig, _keyed: bool) -> Option<Arc<dyn Store>> {
    let url = config.url.or_else(|| {
        config
            .read_env
            .then(|| crate::env::var_os("KCACHE_S3_URL"))
            .flatten()
            .filter(|v| !v.is_empty())
            .map(|v| v.to_string_lossy().into_owned())
    })?;
    log::warn_once(Warning::ObjectStoreConfig, || {
        format!(
            "object-store tier off: this kcache was built without it (cargo feature \
             `object-store`), so {url} is not used"
        )
    });
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_opens() {
        assert!(open(ObjectStoreConfig::at("s3://bucket/p"), true).is_none());
        assert!(open(ObjectStoreConfig::default(), true).is_none());
    }
}
