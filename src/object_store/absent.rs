//! A build without the `object-store` cargo feature has no object-store tier: no HTTP or
//! signing code. A store that is configured anyway is warned about once, never dropped
//! silently.

use std::convert::Infallible;

use super::ObjectStoreConfig;
use crate::log::{self, Warning};
use crate::persistence::store::{Flight, Store, StoreKind, Verify};
use crate::remote::RemoteStats;

/// An open object-store tier, of which this build has none: no value of it exists.
pub(crate) struct ObjectStore(Infallible);

impl ObjectStore {
    /// `None`, with a warning when `config` names a store (`url`, or `KCACHE_S3_URL` when it
    /// reads the environment).
    pub(crate) fn open(config: ObjectStoreConfig, _keyed: bool) -> Option<ObjectStore> {
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
}

impl Store for ObjectStore {
    fn kind(&self) -> StoreKind {
        match self.0 {}
    }

    fn get(&self, _: &str, _: Verify<'_>) -> Option<crate::disk::Entry> {
        match self.0 {}
    }

    fn writes(&self) -> bool {
        match self.0 {}
    }

    fn put(&self, _: &str, _: &[u8]) {
        match self.0 {}
    }

    fn flight(&self, _: &str, _: Verify<'_>) -> Flight {
        match self.0 {}
    }

    fn stats(&self) -> RemoteStats {
        match self.0 {}
    }

    fn raw_stats(&self) -> RemoteStats {
        match self.0 {}
    }

    fn reset_stats(&self) {
        match self.0 {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_opens() {
        assert!(ObjectStore::open(ObjectStoreConfig::at("s3://bucket/p"), true).is_none());
        assert!(ObjectStore::open(ObjectStoreConfig::default(), true).is_none());
    }
}
