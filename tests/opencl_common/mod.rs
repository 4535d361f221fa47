//! Helpers shared by the OpenCL integration tests.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kcache::backend::opencl::{OpenClCache, OpenClOptions, program_disk_key};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::Context;

pub fn memory_only_cache() -> OpenClCache {
    OpenClCache::new(OpenClOptions::default()).unwrap()
}

/// A cache whose disk tier is `dir`, whatever the environment says.
pub fn cache_with_disk(dir: &Path) -> OpenClCache {
    let disk = Persistence::open(PersistenceConfig::in_dir(dir)).unwrap();
    OpenClCache::new(OpenClOptions {
        persistence: Some(Arc::new(disk)),
        ..OpenClOptions::default()
    })
    .unwrap()
}

/// Stores bytes that are no program binary under the key the cache will look up, through the
/// disk tier's own writer: the entry's integrity tag is valid, so only the driver can refuse it.
#[allow(dead_code)] // used by some of the test binaries that include this module
pub fn poison_disk_entry(dir: &Path, context: &Context, sources: &[&str], options: &str) {
    let disk = Persistence::open(PersistenceConfig::in_dir(dir)).unwrap();
    let key = program_disk_key(context.device(), sources, options).unwrap();
    disk.put(&key, b"not a program binary", Duration::from_secs(1))
        .unwrap();
    assert!(disk.get(&key).unwrap().is_some());
}
