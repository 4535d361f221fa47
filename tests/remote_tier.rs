//! The remote tier on a real `redis-server` started by each test on a loopback port: caches
//! with separate disk directories share entries through it; what the store hands back is
//! verified (a changed entry, or one written under another key, is rejected, counted and
//! rebuilt); a read-only client writes nothing; a store that dies or stalls costs lookups
//! nothing but a bounded wait, and the breaker opens and closes again. Every assertion is on
//! counts and values, not times.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use kcache::BuildError;
use kcache::remote::{RemoteConfig, RemoteStats};
use kcache_testkit::load::Load;
use kcache_testkit::redis::{RedisCluster, RedisServer, TlsFiles, free_port};
use kcache_testkit::strings::{
    Node, all_at_once, assert_flights, disk_with_remote, find_or_build, l2_key, serialize,
};

/// The operator key every "node" shares, and another one.
const KEY: [u8; 32] = [7; 32];
const OTHER_KEY: [u8; 32] = [8; 32];

fn remote(server: &RedisServer) -> RemoteConfig {
    RemoteConfig {
        timeout: Some(Duration::from_millis(200)),
        breaker_cooldown: Some(Duration::from_millis(100)),
        ..RemoteConfig::at(server.url())
    }
}

#[test]
fn a_second_node_loads_from_the_remote_and_keeps_a_disk_copy() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = Node::new(Some(KEY), remote(&server));
    assert_eq!(a.lookup("k"), "compiled(k)");
    a.cache.flush();
    assert_eq!(a.builds(), 1);
    assert_eq!(server.keys(), vec![a.remote_key("k")]);
    let s = a.remote();
    assert_eq!((s.misses, s.puts, s.hits), (1, 1, 0));
    assert!(s.bytes_written > "compiled(k)".len() as u64);

    let b = Node::new(Some(KEY), remote(&server));
    assert_eq!(b.lookup("k"), "compiled(k)");
    assert_eq!(b.builds(), 0, "built despite the remote entry");
    let s = b.remote();
    assert_eq!((s.hits, s.misses, s.rejects, s.puts), (1, 0, 0, 0));
    assert_eq!(s.bytes_read, a.remote().bytes_written);
    let t = b.cache.stats();
    assert_eq!((t.remote_hits, t.builds, t.disk_misses), (1, 0, 1));
    b.cache.flush();
    // The disk copy: a third cache on b's directory reads it there, without the remote.
    assert!(b.disk().entry_path(&l2_key("k")).exists());
    assert_eq!(b.disk().stats().puts, 1);
}

#[test]
fn a_changed_entry_and_one_under_another_key_are_rejected_and_rebuilt() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = Node::new(Some(KEY), remote(&server));
    a.lookup("k");
    a.cache.flush();
    let name = a.remote_key("k");
    let mut entry = server.get(&name);
    let last = entry.len() - 1;
    entry[last] ^= 1;
    server.set(&name, &entry);

    let b = Node::new(Some(KEY), remote(&server));
    assert_eq!(b.lookup("k"), "compiled(k)");
    assert_eq!(b.builds(), 1);
    let s = b.remote();
    assert_eq!((s.hits, s.misses, s.rejects), (0, 1, 1));
    b.cache.flush();
    // The rebuild replaced the changed entry with a good one.
    let c = Node::new(Some(KEY), remote(&server));
    assert_eq!(c.lookup("k"), "compiled(k)");
    assert_eq!((c.builds(), c.remote().hits), (0, 1));

    // An entry of another operator key, planted under this key's name.
    let other = Node::new(Some(OTHER_KEY), remote(&server));
    other.lookup("j");
    other.cache.flush();
    let planted = server.get(&other.remote_key("j"));
    let d = Node::new(Some(KEY), remote(&server));
    server.set(&d.remote_key("j"), &planted);
    assert_eq!(d.lookup("j"), "compiled(j)");
    assert_eq!(d.builds(), 1);
    assert_eq!((d.remote().rejects, d.remote().hits), (1, 0));

    // A genuine entry under another entry's name (a copied value) is rejected too.
    let e = Node::new(Some(KEY), remote(&server));
    server.set(&e.remote_key("i"), &server.get(&a.remote_key("k")));
    assert_eq!(e.lookup("i"), "compiled(i)");
    assert_eq!((e.builds(), e.remote().rejects), (1, 1));
}

#[test]
fn an_entry_over_the_size_limit_is_rejected_unread() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let small = RemoteConfig {
        max_entry_size: Some(64),
        ..remote(&server)
    };
    let a = Node::new(Some(KEY), small.clone());
    server.set(&a.remote_key("k"), &[0u8; 1000]);
    assert_eq!(a.lookup("k"), "compiled(k)");
    let s = a.remote();
    assert_eq!((s.rejects, s.hits), (1, 0));
    // One byte over the limit was read, not the whole value.
    assert_eq!(s.bytes_read, 65);
    let long = "x".repeat(100);
    a.lookup(&long);
    a.cache.flush();
    assert!(!server.keys().contains(&a.remote_key(&long)));
}

#[test]
fn a_read_only_node_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let read_only = RemoteConfig {
        read_only: Some(true),
        ..remote(&server)
    };
    let reader = Node::new(Some(KEY), read_only.clone());
    reader.lookup("k");
    reader.lookup("j");
    reader.cache.flush();
    assert_eq!(reader.builds(), 2);
    assert!(server.keys().is_empty(), "{:?}", server.keys());
    assert_eq!(reader.remote().puts, 0);
    assert_eq!(reader.remote().misses, 2);
    // It still reads what a writer shared.
    let writer = Node::new(Some(KEY), remote(&server));
    writer.lookup("w");
    writer.cache.flush();
    let reader2 = Node::new(Some(KEY), read_only);
    reader2.lookup("w");
    assert_eq!((reader2.builds(), reader2.remote().hits), (0, 1));
}

#[test]
fn no_remote_without_an_operator_key_unless_opted_in() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let unkeyed = Node::new(None, remote(&server));
    assert!(unkeyed.disk().remote_stats().is_none());
    unkeyed.lookup("k");
    unkeyed.cache.flush();
    assert!(server.keys().is_empty());

    let opted = RemoteConfig {
        allow_unkeyed: true,
        ..remote(&server)
    };
    let a = Node::new(None, opted.clone());
    a.lookup("k");
    a.cache.flush();
    let b = Node::new(None, opted);
    b.lookup("k");
    assert_eq!((b.builds(), b.remote().hits), (0, 1));
    // A keyed reader does not trust the unkeyed entry.
    let keyed = Node::new(Some(KEY), remote(&server));
    assert_ne!(keyed.remote_key("k"), a.remote_key("k"));
    server.set(&keyed.remote_key("k"), &server.get(&a.remote_key("k")));
    keyed.lookup("k");
    assert_eq!((keyed.builds(), keyed.remote().rejects), (1, 1));
}

#[test]
fn a_killed_store_opens_the_breaker_and_its_return_closes_it() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let a = Node::new(
        Some(KEY),
        RemoteConfig {
            breaker_threshold: Some(2),
            ..remote(&server)
        },
    );
    a.lookup("before");
    a.cache.flush();
    assert_eq!(a.remote().puts, 1);
    server.kill();
    for i in 0..6 {
        assert_eq!(a.lookup(&format!("k{i}")), format!("compiled(k{i})"));
    }
    a.cache.flush();
    assert_eq!(a.builds(), 7);
    let s = a.remote();
    assert!(s.breaker_open);
    assert!(s.breaker_trips >= 1);
    assert!(s.errors >= 2, "{s:?}");
    assert!(s.skipped >= 1, "{s:?}");
    assert_eq!(s.puts, 1);

    server.restart();
    // After the cooldown one lookup probes the store and closes the breaker; lookups go on
    // meanwhile, each from the local tiers or built.
    let mut i = 0;
    while a.remote().breaker_open {
        assert!(i < 1000, "the breaker never closed: {:?}", a.remote());
        std::thread::sleep(Duration::from_millis(10));
        a.lookup(&format!("after{i}"));
        i += 1;
    }
    a.cache.flush();
    assert!(a.remote().puts >= 2, "{:?}", a.remote());
    assert!(!server.keys().is_empty());
}

#[test]
fn a_stalled_store_costs_each_lookup_at_most_its_timeout() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = Node::new(
        Some(KEY),
        RemoteConfig {
            breaker_threshold: Some(3),
            breaker_cooldown: Some(Duration::from_secs(3600)),
            ..remote(&server)
        },
    );
    // A connection is open before the stall, as in a running program.
    a.lookup("warm");
    a.cache.flush();
    server.pause(true);
    for i in 0..5 {
        assert_eq!(a.lookup(&format!("k{i}")), format!("compiled(k{i})"));
    }
    a.cache.flush();
    let s = a.remote();
    server.pause(false);
    assert_eq!(a.builds(), 6);
    // Three operations in a row timed out, and the lease's follow-up GET after its failed SET
    // (which does not count towards the breaker again); one more may have been in flight on
    // the background writer when the breaker opened; then the breaker skipped the rest.
    assert!((4..=5).contains(&s.timeouts), "{s:?}");
    assert_eq!(s.breaker_trips, 1);
    assert!(s.breaker_open);
    assert!(s.skipped >= 5, "{s:?}");
}

/// Four nodes (threads with disk directories of their own) miss one entry at once: one builds
/// it under the lease, the others wait and read its entry from the store.
#[test]
fn four_nodes_cold_starting_one_entry_build_it_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (builds, results) = nodes_at_once(&server, 4, false);
    assert!(
        results
            .iter()
            .all(|(v, _)| v.as_deref() == Ok("compiled(k)"))
    );
    let stats: Vec<RemoteStats> = results.into_iter().map(|(_, s)| s).collect();
    // Once, but for builds begun without the lease for a counted reason.
    assert_flights(builds, 1, &stats);
    let total = |f: fn(&RemoteStats) -> u64| stats.iter().map(f).sum::<u64>() as usize;
    assert_eq!(total(|s| s.puts), builds);
    // Every other node read an entry built elsewhere, whether it waited for it or came late.
    assert_eq!(total(|s| s.hits), 4 - builds);
}

/// Four nodes miss the same six entries at once on a machine loaded on purpose (two threads
/// spinning for the test's duration, as many as the test command's machine has cores): each
/// entry is built once, but for the builds begun without the lease for a counted reason (a
/// lease operation past its budget on the busy machine, ...), which `assert_flights` adds.
#[test]
fn nodes_on_a_loaded_machine_build_each_entry_once_but_for_counted_failures() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let _load = Load::start(2);
    let nodes: Vec<Arc<Node>> = (0..4)
        .map(|_| Arc::new(Node::new(Some(KEY), RemoteConfig::at(server.url()))))
        .collect();
    let sources = ["k0", "k1", "k2", "k3", "k4", "k5"];
    all_at_once(&nodes, &sources, Duration::from_millis(100));
    let builds = nodes.iter().map(|n| n.builds()).sum();
    let stats: Vec<RemoteStats> = nodes.iter().map(|n| n.remote()).collect();
    assert_flights(builds, sources.len(), &stats);
}

/// A leader whose build fails releases the lease: one of the waiting nodes builds instead.
#[test]
fn a_failed_leader_lets_a_follower_build() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (builds, results) = nodes_at_once(&server, 3, true);
    // The first build failed (its node got the error); the second succeeded and was shared.
    assert_eq!(builds, 2);
    assert_eq!(results.iter().filter(|(v, _)| v.is_err()).count(), 1);
}

/// A node's value (or error) and remote counters.
type NodeResult = (Result<String, String>, RemoteStats);

/// `n` nodes look `k` up at once with [`slow_lookup`]: the builds they made together, and
/// each one's result and remote counters.
fn nodes_at_once(server: &RedisServer, n: usize, fail_first: bool) -> (usize, Vec<NodeResult>) {
    let builds = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(Barrier::new(n));
    let nodes: Vec<_> = (0..n)
        .map(|_| {
            let (server_url, builds, go) = (server.url(), builds.clone(), go.clone());
            std::thread::spawn(move || {
                let node = Node::new(Some(KEY), RemoteConfig::at(server_url));
                go.wait();
                let value = slow_lookup(&node, "k", &builds, fail_first);
                node.cache.flush();
                (value.map_err(|e| e.to_string()), node.remote())
            })
        })
        .collect();
    let results = nodes.into_iter().map(|n| n.join().unwrap()).collect();
    (builds.load(Ordering::SeqCst), results)
}

/// A lease left by a node that died expires, and the waiting node builds; a lease held past
/// the wait deadline sends the waiting node to build too.
#[test]
fn an_expired_or_overlong_lease_ends_the_wait() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = Node::new(Some(KEY), remote(&server));
    let lease = format!("kcache:lease:{}", &a.remote_key("k")["kcache:".len()..]);
    redis::cmd("SET")
        .arg(&lease)
        .arg("dead")
        .arg("PX")
        .arg(300)
        .query::<()>(&mut server.connection())
        .unwrap();
    assert_eq!(a.lookup("k"), "compiled(k)");
    let s = a.remote();
    assert_eq!((s.lease_waits, s.lease_timeouts, s.leases), (1, 0, 1));
    assert_eq!(a.builds(), 1);

    let b = Node::new(
        Some(KEY),
        RemoteConfig {
            lease_wait: Some(Duration::from_millis(100)),
            ..remote(&server)
        },
    );
    server.set(
        &lease.replace(
            &a.remote_key("k")["kcache:".len()..],
            &b.remote_key("j")["kcache:".len()..],
        ),
        b"held",
    );
    assert_eq!(b.lookup("j"), "compiled(j)");
    let s = b.remote();
    assert_eq!((s.lease_waits, s.lease_timeouts, s.leases), (1, 1, 0));
}

/// A lookup whose build takes a while (so that the nodes' misses overlap), and fails the first
/// time when `fail_first`.
fn slow_lookup(
    node: &Node,
    source: &str,
    builds: &AtomicUsize,
    fail_first: bool,
) -> kcache::Result<String> {
    let build = || {
        let n = builds.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
        if fail_first && n == 0 {
            return Err(BuildError::new(1, "the first build fails"));
        }
        Ok((format!("compiled({source})"), 1))
    };
    find_or_build(&node.cache, source, build, serialize).map(|lease| lease.value().clone())
}

/// ACL users in the URL: a writer, and a reader whose user may only read, which as a read-only
/// node never needs more; a client without the password gets nothing and builds.
#[test]
fn acl_users_and_passwords_in_the_url() {
    let users = "--user default off \
                 --user writer on >wpass ~* +@all \
                 --user reader on >rpass ~kcache:* +getrange +exists";
    let users: Vec<&str> = users.split_whitespace().collect();
    let Some(server) = RedisServer::start_with(&users, "writer:wpass") else {
        return;
    };
    let port = server
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    let as_user = |auth: &str| RemoteConfig::at(format!("redis://{auth}127.0.0.1:{port}/"));
    let writer = Node::new(Some(KEY), as_user("writer:wpass@"));
    writer.lookup("k");
    writer.cache.flush();
    assert_eq!((writer.remote().puts, writer.remote().errors), (1, 0));

    let reader = Node::new(
        Some(KEY),
        RemoteConfig {
            read_only: Some(true),
            ..as_user("reader:rpass@")
        },
    );
    assert_eq!(reader.lookup("k"), "compiled(k)");
    reader.lookup("j");
    reader.cache.flush();
    assert_eq!(reader.builds(), 1);
    let s = reader.remote();
    assert_eq!((s.hits, s.errors, s.puts), (1, 0, 0));

    let anonymous = Node::new(Some(KEY), as_user(""));
    assert_eq!(anonymous.lookup("k"), "compiled(k)");
    assert_eq!(anonymous.builds(), 1);
    assert!(anonymous.remote().errors >= 1);
    assert_eq!(anonymous.remote().hits, 0);
}

#[test]
fn a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let socket = socket.to_str().unwrap();
    let Some(server) =
        RedisServer::start_with(&["--unixsocket", socket, "--unixsocketperm", "700"], "")
    else {
        return;
    };
    let url = format!("redis+unix://{socket}");
    let a = Node::new(Some(KEY), RemoteConfig::at(url.clone()));
    a.lookup("k");
    a.cache.flush();
    let b = Node::new(Some(KEY), RemoteConfig::at(url));
    b.lookup("k");
    assert_eq!((b.builds(), b.remote().hits), (0, 1));
    assert_eq!(server.keys(), vec![a.remote_key("k")]);
}

/// A Redis Cluster of three masters: entries spread over its nodes by slot, and a second node
/// reads every one of them.
#[test]
fn a_redis_cluster_of_three_masters() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let config = || RemoteConfig {
        timeout: Some(Duration::from_secs(1)),
        ..RemoteConfig::at(cluster.url())
    };
    let sources: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let a = Node::new(Some(KEY), config());
    for source in &sources {
        a.lookup(source);
    }
    a.cache.flush();
    let s = a.remote();
    assert_eq!((s.puts, s.leases, s.errors, s.timeouts), (12, 12, 0, 0));
    let by_node = cluster.keys_by_node();
    assert_eq!(by_node.iter().map(Vec::len).sum::<usize>(), 12);
    assert!(by_node.iter().filter(|keys| !keys.is_empty()).count() > 1);

    let b = Node::new(Some(KEY), config());
    for source in &sources {
        assert_eq!(b.lookup(source), format!("compiled({source})"));
    }
    assert_eq!((b.builds(), b.remote().hits, b.remote().errors), (0, 12, 0));
}

/// A `redis-server` on a TLS port with the certificates of `tls`, which requires clients to
/// show a certificate of its CA when `auth_clients`; and its `rediss://` URL.
/// `None` when `redis-server` is not installed (the test skipped).
fn tls_server(tls: &TlsFiles, auth_clients: bool) -> Option<(RedisServer, String)> {
    let tls_port = free_port().to_string();
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let (ca, cert, key) = (path(&tls.ca), path(&tls.cert), path(&tls.key));
    let server = RedisServer::start_with(
        &[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ],
        "",
    )?;
    Some((server, format!("rediss://127.0.0.1:{tls_port}/")))
}

/// `rediss://` to a server whose certificate the operator's CA file vouches for; without that
/// CA the server is not trusted, and the lookup builds.
#[test]
fn tls_with_the_operators_certificate_authority() {
    let certs = tempfile::tempdir().unwrap();
    let Some(tls) = TlsFiles::make(certs.path()) else {
        return;
    };
    let Some((_server, url)) = tls_server(&tls, false) else {
        return;
    };
    let config = |ca_file: Option<&Path>| RemoteConfig {
        timeout: Some(Duration::from_secs(2)),
        ca_file: ca_file.map(Path::to_path_buf),
        ..RemoteConfig::at(url.clone())
    };
    let a = Node::new(Some(KEY), config(Some(&tls.ca)));
    a.lookup("k");
    a.cache.flush();
    assert_eq!((a.remote().puts, a.remote().errors), (1, 0));
    let b = Node::new(Some(KEY), config(Some(&tls.ca)));
    assert_eq!(b.lookup("k"), "compiled(k)");
    assert_eq!((b.builds(), b.remote().hits), (0, 1));

    let untrusting = Node::new(Some(KEY), config(None));
    assert_eq!(untrusting.lookup("k"), "compiled(k)");
    assert_eq!(untrusting.builds(), 1);
    assert_eq!(untrusting.remote().hits, 0);
    assert!(untrusting.remote().errors >= 1);
}

/// Mutual TLS: a server that requires a client certificate of its CA serves nodes that show
/// one (a node writes, a second reads without building); a node without one is refused, which
/// counts as an error and builds. A certificate without its key is a configuration error: no
/// remote tier.
#[test]
fn mutual_tls_with_a_client_certificate() {
    let certs = tempfile::tempdir().unwrap();
    let Some(tls) = TlsFiles::make(certs.path()) else {
        return;
    };
    let (client_cert, client_key) = tls.client();
    let Some((server, url)) = tls_server(&tls, true) else {
        return;
    };
    let config = |cert: Option<&Path>, key: Option<&Path>| RemoteConfig {
        timeout: Some(Duration::from_secs(2)),
        ca_file: Some(tls.ca.clone()),
        cert_file: cert.map(Path::to_path_buf),
        key_file: key.map(Path::to_path_buf),
        ..RemoteConfig::at(url.clone())
    };
    let with_cert = || config(Some(&client_cert), Some(&client_key));
    let a = Node::new(Some(KEY), with_cert());
    assert_eq!(a.lookup("k"), "compiled(k)");
    a.cache.flush();
    assert_eq!((a.remote().puts, a.remote().errors), (1, 0));
    assert_eq!(server.keys(), [a.remote_key("k")]);
    let b = Node::new(Some(KEY), with_cert());
    assert_eq!(b.lookup("k"), "compiled(k)");
    assert_eq!((b.builds(), b.remote().hits, b.remote().errors), (0, 1, 0));

    let anonymous = Node::new(Some(KEY), config(None, None));
    assert_eq!(anonymous.lookup("k"), "compiled(k)");
    assert_eq!((anonymous.builds(), anonymous.remote().hits), (1, 0));
    assert!(anonymous.remote().errors >= 1);

    for (cert, key) in [(Some(&*client_cert), None), (None, Some(&*client_key))] {
        let dir = tempfile::tempdir().unwrap();
        let half = disk_with_remote(dir.path(), Some(&KEY), config(cert, key));
        assert!(half.remote_stats().is_none());
    }
}
