//! A Redis Cluster's redirects as kcache follows them, with fake nodes on loopback
//! (`FakeRedis`): `MOVED` sends the operation to the node it names and that node is remembered
//! for the slot; `ASK` sends it there once, after `ASKING`, and is not remembered; a node that
//! redirects forever costs one failed operation. (A real cluster is in `remote_tier.rs`.)

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use kcache::disk::{Durability, OperatorKey};
use kcache::remote::{RemoteConfig, RemoteStats};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::redis::{FakeRedis, Reply, plain_answer};
use kcache_testkit::strings::{Cache, lookup, tiered};
use tempfile::TempDir;

/// A cache whose remote is the cluster seeded by `seed`, without leases (one operation per
/// lookup, one per write).
fn node(seed: &FakeRedis) -> (TempDir, Cache) {
    let dir = tempfile::tempdir().unwrap();
    let disk = Persistence::open(PersistenceConfig {
        key: Some(OperatorKey::new(vec![7; 32]).unwrap()),
        durability: Durability::Relaxed,
        remote: Some(RemoteConfig {
            cluster: Some(true),
            timeout: Some(Duration::from_secs(5)),
            lease_wait: Some(Duration::ZERO),
            ..RemoteConfig::at(seed.url())
        }),
        ..PersistenceConfig::in_dir(dir.path())
    })
    .unwrap();
    (dir, tiered(Some(Arc::new(disk))))
}

fn stats(cache: &Cache) -> RemoteStats {
    cache.disk().unwrap().remote_stats().unwrap()
}

/// A node that redirects every command to `to` with `kind` (`MOVED` or `ASK`).
fn redirecting(kind: &'static str, to: String) -> FakeRedis {
    FakeRedis::start(move |_| Reply::Bytes(format!("-{kind} 1 {to}\r\n").into_bytes()))
}

/// One lookup and its write-back through a seed that redirects every command to a plain node
/// with `kind`: both count as usual (a miss, a put, no error). Returns the commands the seed
/// and the plain node received.
fn redirected_round(kind: &'static str) -> (Vec<String>, Vec<String>) {
    let target = FakeRedis::start(|args| Reply::Bytes(plain_answer(args)));
    let seed = redirecting(kind, target.address());
    let (_dir, cache) = node(&seed);
    lookup(&cache, "k", &AtomicUsize::new(0)).unwrap();
    cache.flush();
    let s = stats(&cache);
    assert_eq!((s.misses, s.puts, s.errors), (1, 1, 0), "{s:?}");
    (seed.commands(), target.commands())
}

#[test]
fn moved_is_followed_and_remembered_for_the_slot() {
    let (seed, target) = redirected_round("MOVED");
    // The read went to the seed, was moved; the write of the same key went straight there.
    assert_eq!(seed, ["GETRANGE"]);
    assert_eq!(target, ["GETRANGE", "SET"]);
}

#[test]
fn ask_is_followed_once_after_asking() {
    let (seed, target) = redirected_round("ASK");
    assert_eq!(seed, ["GETRANGE", "SET"]);
    assert_eq!(target, ["ASKING", "GETRANGE", "ASKING", "SET"]);
}

#[test]
fn endless_redirects_are_one_error() {
    // Two nodes that move every command to each other.
    let a_port = kcache_testkit::redis::free_port();
    let b = redirecting("MOVED", format!("127.0.0.1:{a_port}"));
    let a = FakeRedis::start_on(a_port, {
        let to = b.address();
        move |_| Reply::Bytes(format!("-MOVED 1 {to}\r\n").into_bytes())
    });
    let (_dir, cache) = node(&a);
    lookup(&cache, "k", &AtomicUsize::new(0)).unwrap();
    let s = stats(&cache);
    assert_eq!((s.misses, s.errors, s.timeouts), (1, 1, 0), "{s:?}");
    // The first try and three redirects.
    assert_eq!(a.commands().len() + b.commands().len(), 4);
}
