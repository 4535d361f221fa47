//! A caller-defined backend for tests of the tiered lookup: its live value is a `String`, its
//! serialized form the string's UTF-8 bytes, its disk key made from a source text.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kcache::BuildError;
use kcache::disk::{Durability, OperatorKey};
use kcache::key::{Key, KeyBuilder};
use kcache::memory::{Lease, MemoryCache, Options};
use kcache::remote::{RemoteConfig, RemoteStats};
use kcache::tiered::TieredCache;
use kcache::{Persistence, PersistenceConfig};
use tempfile::TempDir;

pub type Cache = TieredCache<Vec<u8>, String>;

/// The disk key of `source`.
pub fn l2_key(source: &str) -> Key {
    KeyBuilder::new()
        .backend("strings")
        .source(source)
        .finish()
        .unwrap()
}

/// A disk tier in `dir` with relaxed durability (tests need no fsync) and the default lock
/// timeout.
pub fn disk(dir: &Path) -> Arc<Persistence> {
    disk_with_lock_timeout(dir, None)
}

/// As [`disk`], waiting `lock_timeout` for other processes' builds.
pub fn disk_with_lock_timeout(dir: &Path, lock_timeout: Option<Duration>) -> Arc<Persistence> {
    let mut config = PersistenceConfig::in_dir(dir);
    config.durability = Durability::Relaxed;
    config.lock_timeout = lock_timeout;
    Arc::new(Persistence::open(config).unwrap())
}

/// As [`disk`], keyed by `key` when given, with `remote` behind it: a node of the remote tier's
/// tests (a remote tier is shared under an operator key only, unless it allows unkeyed entries).
pub fn disk_with_remote(dir: &Path, key: Option<&[u8]>, remote: RemoteConfig) -> Arc<Persistence> {
    disk_with_stores(dir, key, |config| config.remote = Some(remote))
}

/// As [`disk`], keyed by `key` when given, with the stores `stores` sets behind it.
pub fn disk_with_stores(
    dir: &Path,
    key: Option<&[u8]>,
    stores: impl FnOnce(&mut PersistenceConfig),
) -> Arc<Persistence> {
    let mut config = PersistenceConfig::in_dir(dir);
    config.durability = Durability::Relaxed;
    config.key = key.map(|k| OperatorKey::new(k).unwrap());
    stores(&mut config);
    Arc::new(Persistence::open(config).unwrap())
}

/// A node of the remote tier's tests: its own disk directory with `remote` behind it, a tiered
/// cache on it, and the count of its builds.
pub struct Node {
    _dir: TempDir,
    pub cache: Cache,
    pub builds: AtomicUsize,
}

impl Node {
    /// Keyed by `key` when given.
    pub fn new(key: Option<[u8; 32]>, remote: RemoteConfig) -> Node {
        Node::with_stores(key, |config| config.remote = Some(remote))
    }

    /// Keyed by `key` when given, with the stores `stores` sets behind its disk.
    pub fn with_stores(key: Option<[u8; 32]>, stores: impl FnOnce(&mut PersistenceConfig)) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let disk = disk_with_stores(dir.path(), key.as_ref().map(|k| &k[..]), stores);
        Node {
            _dir: dir,
            cache: tiered(Some(disk)),
            builds: AtomicUsize::new(0),
        }
    }

    /// [`lookup`] on this node's cache, counting its builds.
    pub fn lookup(&self, source: &str) -> String {
        lookup(&self.cache, source, &self.builds).unwrap()
    }

    pub fn builds(&self) -> usize {
        self.builds.load(Ordering::SeqCst)
    }

    pub fn disk(&self) -> &Persistence {
        self.cache.disk().unwrap()
    }

    pub fn remote(&self) -> RemoteStats {
        self.disk().remote_stats().expect("a remote tier")
    }

    /// The store's key of `source`'s entry.
    pub fn remote_key(&self, source: &str) -> String {
        let path = self.disk().entry_path(&l2_key(source));
        format!("kcache:{}", path.file_name().unwrap().to_str().unwrap())
    }
}

/// A tiered cache with a new, unbounded memory tier in front of `disk`.
pub fn tiered(disk: Option<Arc<Persistence>>) -> Cache {
    let memory = Arc::new(MemoryCache::new(Options::default(), |_v: String| Ok(())));
    TieredCache::new(memory, disk)
}

/// Loads a stored string; bytes that are not UTF-8 are refused with code 1.
pub fn load(bytes: &[u8]) -> Result<(String, u64), BuildError> {
    String::from_utf8(bytes.to_vec())
        .map(|s| (s, bytes.len() as u64))
        .map_err(|_| BuildError::new(1, "not UTF-8"))
}

pub fn serialize(value: &String) -> Result<Vec<u8>, BuildError> {
    Ok(value.as_bytes().to_vec())
}

/// Looks `source` up under `l2_key(source)`, loading with [`load`] and building and serializing
/// with the steps given.
pub fn find_or_build(
    cache: &Cache,
    source: &str,
    build: impl FnOnce() -> Result<(String, u64), BuildError>,
    serialize: impl FnOnce(&String) -> Result<Vec<u8>, BuildError>,
) -> kcache::Result<Lease<Vec<u8>, String>> {
    cache.find_or_build(
        source.as_bytes(),
        None,
        || Ok(l2_key(source)),
        load,
        build,
        serialize,
    )
}

/// Looks `source` up, building `compiled(<source>)` (counted in `builds`) on a miss.
pub fn lookup(cache: &Cache, source: &str, builds: &AtomicUsize) -> kcache::Result<String> {
    let build = || {
        builds.fetch_add(1, Ordering::SeqCst);
        Ok((format!("compiled({source})"), 1))
    };
    find_or_build(cache, source, build, serialize).map(|lease| lease.value().clone())
}

/// The `nodes` look every one of `sources` up, in order, all starting at once, each build
/// (counted in its node's `builds`) taking `build_time`; every value is checked, and each node
/// flushed (its entries in its stores) before this returns.
pub fn all_at_once(nodes: &[Arc<Node>], sources: &[&str], build_time: Duration) {
    let go = Arc::new(std::sync::Barrier::new(nodes.len()));
    let sources: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
    let threads: Vec<_> = nodes
        .iter()
        .map(|node| {
            let (node, go, sources) = (Arc::clone(node), Arc::clone(&go), sources.clone());
            std::thread::spawn(move || {
                go.wait();
                for source in &sources {
                    let build = || {
                        node.builds.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(build_time);
                        Ok((format!("compiled({source})"), 1))
                    };
                    let lease = find_or_build(&node.cache, source, build, serialize).unwrap();
                    assert_eq!(lease.value(), &format!("compiled({source})"));
                }
                node.cache.flush();
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

/// What single-flight across nodes promises of `builds` of `entries` entries, by nodes whose
/// store counters are `stats`: every build was led under a lease or begun without one for a
/// counted reason (a failed lease operation, a wait that reached its deadline), so
/// `builds == leases + lease_failures + lease_timeouts`; an entry was led twice only after a
/// lost lease; each entry was built at least once. Without a counted reason, then, each entry
/// was built exactly once.
pub fn assert_flights(builds: usize, entries: usize, stats: &[RemoteStats]) {
    let total = |f: fn(&RemoteStats) -> u64| stats.iter().map(f).sum::<u64>() as usize;
    let leases = total(|s| s.leases);
    let failed_open = total(|s| s.lease_failures) + total(|s| s.lease_timeouts);
    assert_eq!(builds, leases + failed_open, "{stats:?}");
    assert!(leases <= entries + total(|s| s.leases_lost), "{stats:?}");
    assert!(builds >= entries, "{builds} builds of {entries} entries");
    if failed_open == 0 {
        assert_eq!(builds, entries, "{stats:?}");
    }
}
