//! The object-store tier through the whole chain, on a real S3 server (SeaweedFS, installed by
//! the test command) started by each test on loopback: nodes with directories of their own
//! share entries through one bucket, the second compiles nothing; what the bucket hands back is
//! verified (a changed object, or another key's entry, is rejected and rebuilt, read and
//! counted once); four nodes starting at once compile once, on a machine loaded on purpose too,
//! but for builds begun without the lease for a counted reason; behind a proxy that drops
//! conditional headers, the store is found out, warned about once, and its leases go unused
//! (every build counted); a Redis tier in front is asked first and backfilled; a killed server
//! costs a build, never a failed lookup. Every assertion is on counts and values.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcache::object_store::ObjectStoreConfig;
use kcache::remote::{RemoteConfig, RemoteStats};
use kcache::store::StoreKind;
use kcache_testkit::header_proxy::HeaderProxy;
use kcache_testkit::load::Load;
use kcache_testkit::redis::RedisServer;
use kcache_testkit::seaweed::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, SeaweedServer};
use kcache_testkit::strings::{Node, all_at_once, assert_flights, l2_key};
use zeroize::Zeroizing;

const KEY: [u8; 32] = [7; 32];
const OTHER_KEY: [u8; 32] = [8; 32];
const BUCKET: &str = "kernels";
const PREFIX: &str = "team/";

/// A server with the test bucket; `None` when SeaweedFS is not installed (the test skipped).
fn server() -> Option<SeaweedServer> {
    let server = SeaweedServer::start()?;
    server.create_bucket(BUCKET);
    Some(server)
}

fn s3(server: &SeaweedServer) -> ObjectStoreConfig {
    ObjectStoreConfig {
        access_key_id: Some(ACCESS_KEY_ID.into()),
        secret_access_key: Some(Zeroizing::new(SECRET_ACCESS_KEY.into())),
        // Generous: a loaded machine's first request to a fresh server can take a second.
        timeout: Some(Duration::from_secs(5)),
        breaker_cooldown: Some(Duration::from_millis(100)),
        ..ObjectStoreConfig::at(server.url(BUCKET, PREFIX))
    }
}

fn node(key: [u8; 32], server: &SeaweedServer) -> Node {
    let config = s3(server);
    Node::with_stores(Some(key), |c| c.object_store = Some(config))
}

/// A node of `key` reaching `server` through `proxy`.
fn node_behind(key: [u8; 32], server: &SeaweedServer, proxy: &HeaderProxy) -> Node {
    let url = server.url(BUCKET, PREFIX);
    let config = ObjectStoreConfig {
        url: Some(url.replace(&server.endpoint(), &proxy.endpoint())),
        ..s3(server)
    };
    Node::with_stores(Some(key), |c| c.object_store = Some(config))
}

/// The `GET`s of `object` the proxy saw.
fn reads_of(proxy: &HeaderProxy, object: &str) -> usize {
    proxy.requests("GET", &format!("/{BUCKET}/{object}?"))
}

/// The node's object-store counters.
fn s3_stats(node: &Node) -> RemoteStats {
    let stores = node.disk().store_stats();
    let found = stores
        .iter()
        .find(|(kind, _)| *kind == StoreKind::ObjectStore);
    found.expect("an object store in the chain").1
}

/// The object `source`'s entry is stored as.
fn object(node: &Node, source: &str) -> String {
    let path = node.disk().entry_path(&l2_key(source));
    format!("{PREFIX}{}", path.file_name().unwrap().to_str().unwrap())
}

#[test]
fn a_second_node_compiles_nothing_and_keeps_a_disk_copy() {
    let Some(server) = server() else {
        return;
    };
    let a = node(KEY, &server);
    assert_eq!(a.lookup("k"), "compiled(k)");
    a.cache.flush();
    let s = s3_stats(&a);
    assert_eq!((a.builds(), s.puts, s.misses), (1, 1, 1), "{s:?}");
    assert!(server.get(BUCKET, &object(&a, "k")).is_some());

    let b = node(KEY, &server);
    assert_eq!(b.lookup("k"), "compiled(k)");
    b.cache.flush();
    let s = s3_stats(&b);
    assert_eq!((b.builds(), s.hits, s.puts), (0, 1, 0), "{s:?}");
    assert_eq!(s.bytes_read, s3_stats(&a).bytes_written);
    // The entry is on b's disk now: the next process there does not ask the bucket.
    assert!(b.disk().get(&l2_key("k")).unwrap().is_some());
}

#[test]
fn a_changed_object_or_another_keys_entry_is_rejected_and_rebuilt() {
    let Some(server) = server() else {
        return;
    };
    let a = node(KEY, &server);
    a.lookup("k");
    a.cache.flush();
    let name = object(&a, "k");
    let mut bytes = server.get(BUCKET, &name).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    assert_eq!(server.put(BUCKET, &name, &bytes), 200);
    // Through a proxy that counts the reads (and drops nothing).
    let proxy = HeaderProxy::start(&server.endpoint()["http://".len()..], &[]);
    let b = node_behind(KEY, &server, &proxy);
    assert_eq!(b.lookup("k"), "compiled(k)");
    let s = s3_stats(&b);
    // Read once, refused once, never loaded: the lease's holder does not look again at what
    // its lookup refused.
    assert_eq!((b.builds(), s.rejects, s.hits), (1, 1, 0), "{s:?}");
    assert_eq!(reads_of(&proxy, &name), 1);

    // An entry sealed under another key, planted under the name a node of that key reads.
    b.cache.flush();
    let genuine = server.get(BUCKET, &name).unwrap();
    let other = node(OTHER_KEY, &server);
    assert_eq!(server.put(BUCKET, &object(&other, "k"), &genuine), 200);
    assert_eq!(other.lookup("k"), "compiled(k)");
    let s = s3_stats(&other);
    assert_eq!((other.builds(), s.rejects, s.hits), (1, 1, 0), "{s:?}");
}

#[test]
fn four_nodes_starting_at_once_compile_once() {
    let Some(server) = server() else {
        return;
    };
    let nodes: Vec<Arc<Node>> = (0..4).map(|_| Arc::new(node(KEY, &server))).collect();
    // Long enough for every other node to find the lease taken.
    all_at_once(&nodes, &["k"], Duration::from_millis(500));
    let builds: usize = nodes.iter().map(|n| n.builds()).sum();
    let stats: Vec<RemoteStats> = nodes.iter().map(|n| s3_stats(n)).collect();
    // Once, but for builds begun without the lease for a counted reason.
    assert_flights(builds, 1, &stats);
    let total = |f: fn(&RemoteStats) -> u64| stats.iter().map(f).sum::<u64>() as usize;
    assert_eq!(total(|s| s.puts), builds, "{stats:?}");
    // The others read an entry built elsewhere (those that came late without waiting).
    assert_eq!(total(|s| s.hits), 4 - builds, "{stats:?}");
}

/// As above, for six entries on a machine loaded on purpose (two threads spinning for the
/// test's duration).
#[test]
fn nodes_on_a_loaded_machine_build_each_entry_once_but_for_counted_failures() {
    let Some(server) = server() else {
        return;
    };
    let _load = Load::start(2);
    let nodes: Vec<Arc<Node>> = (0..4).map(|_| Arc::new(node(KEY, &server))).collect();
    let sources = ["k0", "k1", "k2", "k3", "k4", "k5"];
    all_at_once(&nodes, &sources, Duration::from_millis(100));
    let builds = nodes.iter().map(|n| n.builds()).sum();
    let stats: Vec<RemoteStats> = nodes.iter().map(|n| s3_stats(n)).collect();
    assert_flights(builds, sources.len(), &stats);
}

/// Behind a proxy that drops `If-None-Match` and `If-Match`, every racing node would lead: the
/// probe before the first lease finds the store out (each node's store once), one warning
/// says so for the process, and each build is counted as begun without the lease.
#[test]
fn a_store_that_ignores_conditional_writes_is_found_out_and_its_leases_unused() {
    let Some(server) = server() else {
        return;
    };
    let proxy = HeaderProxy::start(
        &server.endpoint()["http://".len()..],
        &["If-None-Match", "If-Match"],
    );
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let heard = Arc::clone(&warnings);
    kcache::log::set_hook(move |level, message| {
        if level == kcache::log::Level::Warn && message.contains("conditional writes") {
            heard.lock().unwrap().push(message.to_owned());
        }
    });
    let nodes: Vec<Arc<Node>> = (0..4)
        .map(|_| Arc::new(node_behind(KEY, &server, &proxy)))
        .collect();
    let sources = ["k0", "k1", "k2", "k3", "k4", "k5", "k6"];
    all_at_once(&nodes, &sources, Duration::from_millis(100));
    kcache::log::reset_hook();
    let builds = nodes.iter().map(|n| n.builds()).sum();
    let stats: Vec<RemoteStats> = nodes.iter().map(|n| s3_stats(n)).collect();
    assert!(
        stats.iter().all(|s| s.conditional_writes_ignored == 1),
        "{stats:?}"
    );
    assert_eq!(warnings.lock().unwrap().len(), 1, "{warnings:?}");
    let total = |f: fn(&RemoteStats) -> u64| stats.iter().map(f).sum::<u64>() as usize;
    assert_eq!((total(|s| s.leases), total(|s| s.lease_waits)), (0, 0));
    assert_eq!(total(|s| s.lease_failures), builds, "{stats:?}");
    assert_flights(builds, sources.len(), &stats);
}

#[test]
fn redis_in_front_is_asked_first_and_backfilled_from_the_bucket() {
    let Some(server) = server() else {
        return;
    };
    let (Some(first_redis), Some(second_redis), Some(third_redis)) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ) else {
        return;
    };
    let chained = |redis: &RedisServer, backfill: bool, order: Option<Vec<StoreKind>>| {
        let (remote, object_store) = (RemoteConfig::at(redis.url()), s3(&server));
        Node::with_stores(Some(KEY), move |c| {
            c.remote = Some(remote);
            c.object_store = Some(object_store);
            c.backfill = Some(backfill);
            c.store_order = order;
        })
    };
    let a = chained(&first_redis, true, None);
    a.lookup("k");
    a.cache.flush();
    let kinds: Vec<StoreKind> = a.disk().store_stats().iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, [StoreKind::Redis, StoreKind::ObjectStore]);
    assert_eq!((a.remote().puts, s3_stats(&a).puts), (1, 1));

    // Another node's Redis is empty: the bucket answers, and that Redis gets a copy.
    let b = chained(&second_redis, true, None);
    assert_eq!(b.lookup("k"), "compiled(k)");
    b.cache.flush();
    assert_eq!(
        (b.builds(), b.remote().misses, s3_stats(&b).hits),
        (0, 1, 1)
    );
    assert_eq!(b.remote().puts, 1, "backfilled");
    assert_eq!(second_redis.keys().len(), 1);

    // Without backfill, the Redis in front stays empty; the order puts the bucket first.
    let order = Some(vec![StoreKind::ObjectStore]);
    let c = chained(&third_redis, false, order);
    let kinds: Vec<StoreKind> = c.disk().store_stats().iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, [StoreKind::ObjectStore, StoreKind::Redis]);
    assert_eq!(c.lookup("k"), "compiled(k)");
    c.cache.flush();
    assert_eq!((c.builds(), s3_stats(&c).hits), (0, 1));
    // Asked after the bucket had answered: not at all.
    assert_eq!((c.remote().misses, c.remote().puts), (0, 0));
    assert!(third_redis.keys().is_empty());
}

#[test]
fn a_killed_server_costs_a_build_not_a_failed_lookup() {
    let Some(mut server) = server() else {
        return;
    };
    let a = node(KEY, &server);
    server.kill();
    assert_eq!(a.lookup("k"), "compiled(k)");
    a.cache.flush();
    let s = s3_stats(&a);
    assert_eq!((a.builds(), s.hits, s.puts), (1, 0, 0), "{s:?}");
    assert!(s.errors + s.skipped >= 2, "{s:?}");
    // Back: the next build is shared again.
    server.restart();
    let b = node(KEY, &server);
    b.lookup("j");
    b.cache.flush();
    assert_eq!(s3_stats(&b).puts, 1);
}
