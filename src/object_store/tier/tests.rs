//! The object-store tier against a real S3 server (SeaweedFS, started by each test) and, for
//! what no real server does, a fake one. The test kit's server files are included by path:
//! this test binary cannot link the test kit, which links a second kcache.

#[path = "../../../testkit/src/fake_s3.rs"]
mod fake_s3;
// Only what the server needs of it: no program or file of its own.
#[allow(dead_code)]
#[path = "../../../testkit/src/needs.rs"]
mod needs;
#[path = "../../../testkit/src/seaweed.rs"]
mod seaweed;

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use fake_s3::{Answer, FakeS3};
use seaweed::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, SeaweedServer};
use zeroize::Zeroizing;

use super::ObjectStore;
use crate::disk::{Descriptor, Entry, OperatorKey, Sealer};
use crate::key::{KEY_SCHEMA_VERSION, Key};
use crate::object_store::ObjectStoreConfig;
use crate::store::RemoteStats;
use crate::store::{Flight, Store};

const BUCKET: &str = "kcache-test";
const PREFIX: &str = "ci/";

fn sealer(key_byte: u8) -> Sealer {
    let key = OperatorKey::new(vec![key_byte; 32]).unwrap();
    Sealer::new(Some(&key), KEY_SCHEMA_VERSION)
}

fn key(n: u8) -> Key {
    Key::from_hex(&format!("{n:02x}").repeat(32)).unwrap()
}

/// An entry for `key` with `payload`, sealed by `sealer`.
fn sealed(sealer: &Sealer, key: &Key, payload: &[u8]) -> Vec<u8> {
    sealer.sealed(
        key,
        payload,
        Duration::from_millis(5),
        &Descriptor::default(),
    )
}

fn verify<'a>(sealer: &'a Sealer, key: &'a Key) -> impl Fn(Vec<u8>) -> Result<Entry, String> + 'a {
    move |bytes| sealer.verify(key, bytes).map_err(str::to_owned)
}

/// A server with the test bucket; `None` when SeaweedFS is not installed (the test skipped).
fn server() -> Option<SeaweedServer> {
    let server = SeaweedServer::start()?;
    server.create_bucket(BUCKET);
    Some(server)
}

fn config(server: &SeaweedServer) -> ObjectStoreConfig {
    ObjectStoreConfig {
        access_key_id: Some(ACCESS_KEY_ID.into()),
        secret_access_key: Some(Zeroizing::new(SECRET_ACCESS_KEY.into())),
        timeout: Some(Duration::from_secs(5)),
        lease_wait: Some(Duration::from_secs(60)),
        ..ObjectStoreConfig::at(server.url(BUCKET, PREFIX))
    }
}

fn open(config: ObjectStoreConfig) -> ObjectStore {
    ObjectStore::open(config, true).expect("a usable configuration")
}

fn object(sealer: &Sealer, key: &Key) -> String {
    format!("{PREFIX}{}", sealer.entry_name(key))
}

#[test]
fn put_then_get_verifies_and_absent_is_a_miss() {
    let Some(server) = server() else {
        return;
    };
    let store = open(config(&server));
    let (sealer, k) = (sealer(1), key(1));
    let name = sealer.entry_name(&k);
    let entry = sealed(&sealer, &k, b"kernel binary");
    assert!(store.writes());
    assert!(store.get(&name, &verify(&sealer, &k)).is_none());
    store.put(&name, &entry);
    assert_eq!(
        server.get(BUCKET, &object(&sealer, &k)),
        Some(entry.clone())
    );
    let found = store.get(&name, &verify(&sealer, &k)).expect("a hit");
    assert_eq!(found.payload(), b"kernel binary");
    let n = entry.len() as u64;
    assert_eq!(
        store.stats(),
        RemoteStats {
            hits: 1,
            misses: 1,
            puts: 1,
            bytes_written: n,
            bytes_read: n,
            ..RemoteStats::default()
        }
    );
    store.reset_stats();
    assert_eq!(store.stats(), RemoteStats::default());
    assert_eq!(store.raw_stats().hits, 1);
}

#[test]
fn tampered_and_foreign_entries_are_rejected() {
    let Some(server) = server() else {
        return;
    };
    let store = open(config(&server));
    let (ours, theirs) = (sealer(1), sealer(2));
    let (k, other) = (key(2), key(3));
    let mut tampered = sealed(&ours, &k, b"kernel binary");
    let last = tampered.len() - 20;
    tampered[last] ^= 1;
    assert_eq!(server.put(BUCKET, &object(&ours, &k), &tampered), 200);
    assert!(
        store
            .get(&ours.entry_name(&k), &verify(&ours, &k))
            .is_none()
    );
    // Sealed under another operator key, stored under our entry name.
    let foreign = sealed(&theirs, &other, b"someone else's code");
    assert_eq!(server.put(BUCKET, &object(&ours, &other), &foreign), 200);
    assert!(
        store
            .get(&ours.entry_name(&other), &verify(&ours, &other))
            .is_none()
    );
    let stats = store.stats();
    assert_eq!((stats.rejects, stats.misses, stats.hits), (2, 2, 0));
    assert_eq!(stats.errors + stats.timeouts, 0);
}

#[test]
fn an_object_over_the_limit_is_refused_unread() {
    let Some(server) = server() else {
        return;
    };
    let store = open(ObjectStoreConfig {
        max_entry_size: Some(1024),
        ..config(&server)
    });
    let (sealer, k) = (sealer(1), key(4));
    let huge = sealed(&sealer, &k, &vec![7u8; 1 << 20]);
    assert_eq!(server.put(BUCKET, &object(&sealer, &k), &huge), 200);
    assert!(
        store
            .get(&sealer.entry_name(&k), &verify(&sealer, &k))
            .is_none()
    );
    // And a write over the limit is not sent.
    store.put(&sealer.entry_name(&key(5)), &huge);
    let stats = store.stats();
    assert_eq!((stats.rejects, stats.bytes_read, stats.puts), (1, 1025, 0));
}

#[test]
fn wrong_credentials_are_errors_not_outages() {
    let Some(server) = server() else {
        return;
    };
    let store = open(ObjectStoreConfig {
        secret_access_key: Some(Zeroizing::new("not-the-secret".into())),
        breaker_threshold: Some(1),
        ..config(&server)
    });
    let (sealer, k) = (sealer(1), key(6));
    let name = sealer.entry_name(&k);
    for _ in 0..3 {
        assert!(store.get(&name, &verify(&sealer, &k)).is_none());
        store.put(&name, &sealed(&sealer, &k, b"x"));
    }
    let stats = store.stats();
    assert_eq!((stats.errors, stats.misses, stats.puts), (6, 3, 0));
    // Refused, the store answered: the breaker stays closed.
    assert_eq!((stats.breaker_trips, stats.skipped), (0, 0));
    assert!(!stats.breaker_open);
    assert_eq!(server.get(BUCKET, &object(&sealer, &k)), None);
}

#[test]
fn a_killed_server_opens_the_breaker_and_a_restarted_one_closes_it() {
    let Some(mut server) = server() else {
        return;
    };
    let cooldown = Duration::from_millis(300);
    let store = open(ObjectStoreConfig {
        breaker_threshold: Some(2),
        breaker_cooldown: Some(cooldown),
        timeout: Some(Duration::from_secs(2)),
        ..config(&server)
    });
    let (sealer, k) = (sealer(1), key(7));
    let (name, entry) = (sealer.entry_name(&k), sealed(&sealer, &k, b"kernel"));
    server.kill();
    for _ in 0..4 {
        assert!(store.get(&name, &verify(&sealer, &k)).is_none());
    }
    let down = store.stats();
    assert_eq!((down.errors, down.breaker_trips, down.skipped), (2, 1, 2));
    assert!(down.breaker_open);
    server.restart();
    // Written once the restarted server takes writes again (its volumes come up after it
    // answers), so that the store's probe below finds it up.
    assert_eq!(server.put(BUCKET, "warm-up/restarted", b"x"), 200);
    std::thread::sleep(cooldown);
    // The probe after the cooldown: a write that succeeds, and the breaker closes.
    store.put(&name, &entry);
    let found = store.get(&name, &verify(&sealer, &k));
    assert_eq!(
        found.map(|e| e.payload().to_vec()),
        Some(b"kernel".to_vec())
    );
    let up = store.stats();
    assert_eq!((up.puts, up.hits, up.breaker_trips), (1, 1, 1));
    assert!(!up.breaker_open);
}

#[test]
fn a_stopped_server_costs_each_operation_its_timeout() {
    let Some(server) = server() else {
        return;
    };
    let store = open(ObjectStoreConfig {
        timeout: Some(Duration::from_millis(300)),
        breaker_threshold: Some(100),
        ..config(&server)
    });
    let (sealer, k) = (sealer(1), key(8));
    let name = sealer.entry_name(&k);
    server.stop();
    for _ in 0..3 {
        assert!(store.get(&name, &verify(&sealer, &k)).is_none());
    }
    store.put(&name, &sealed(&sealer, &k, b"x"));
    server.cont();
    let stats = store.stats();
    assert_eq!((stats.timeouts, stats.errors, stats.puts), (4, 0, 0));
}

#[test]
fn read_only_writes_nothing_and_takes_no_lease() {
    let Some(server) = server() else {
        return;
    };
    let store = open(ObjectStoreConfig {
        read_only: Some(true),
        ..config(&server)
    });
    let (sealer, k) = (sealer(1), key(9));
    let name = sealer.entry_name(&k);
    assert!(!store.writes());
    store.put(&name, &sealed(&sealer, &k, b"x"));
    assert!(matches!(
        store.flight(&name, &verify(&sealer, &k)),
        Flight::Build
    ));
    assert_eq!(server.get(BUCKET, &object(&sealer, &k)), None);
    assert_eq!(server.get(BUCKET, &format!("{PREFIX}lease/{name}")), None);
    let stats = store.stats();
    assert_eq!((stats.puts, stats.leases, stats.bytes_written), (0, 0, 0));
}

/// What each of `nodes` stores (one per thread, as separate nodes) did racing for one entry as
/// the chain does (a look, then `flight` after a miss): the leader builds for a while (long
/// enough for every node to be waiting), writes the entry and drops its lease. Returns the
/// counts of leaders, of entries found by `flight` and by the first look, and of builds.
struct Race {
    lead: usize,
    found: usize,
    looked: usize,
    build: usize,
    stats: Vec<RemoteStats>,
}

fn race(server: &SeaweedServer, nodes: usize, k: &Key) -> Race {
    let sealer = sealer(1);
    let name = sealer.entry_name(k);
    let entry = sealed(&sealer, k, b"built once");
    let barrier = Barrier::new(nodes);
    let outcomes = Mutex::new([0usize; 4]);
    let stats = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..nodes {
            s.spawn(|| {
                let store = open(config(server));
                barrier.wait();
                let outcome = if let Some(found) = store.get(&name, &verify(&sealer, k)) {
                    assert_eq!(found.payload(), b"built once");
                    2
                } else {
                    match store.flight(&name, &verify(&sealer, k)) {
                        Flight::Lead(lease) => {
                            std::thread::sleep(Duration::from_secs(2));
                            store.put(&name, &entry);
                            drop(lease);
                            0
                        }
                        Flight::Found(found) => {
                            assert_eq!(found.payload(), b"built once");
                            1
                        }
                        Flight::Build => 3,
                    }
                };
                outcomes.lock().unwrap()[outcome] += 1;
                stats.lock().unwrap().push(store.stats());
            });
        }
    });
    let [lead, found, looked, build] = outcomes.into_inner().unwrap();
    Race {
        lead,
        found,
        looked,
        build,
        stats: stats.into_inner().unwrap(),
    }
}

#[test]
fn racing_nodes_build_once() {
    let Some(server) = server() else {
        return;
    };
    let k = key(10);
    let r = race(&server, 8, &k);
    assert_eq!((r.lead, r.found + r.looked, r.build), (1, 7, 0));
    let sum = |f: fn(&RemoteStats) -> u64| r.stats.iter().map(f).sum::<u64>();
    assert_eq!(sum(|s| s.leases), 1);
    // A node whose flight begins as the leader releases finds the entry without waiting.
    assert!(sum(|s| s.lease_waits) <= r.found as u64);
    assert_eq!(
        (sum(|s| s.hits), sum(|s| s.puts), sum(|s| s.errors)),
        (7, 1, 0)
    );
    // The lease is gone once its holder dropped it.
    let name = sealer(1).entry_name(&k);
    assert_eq!(server.get(BUCKET, &format!("{PREFIX}lease/{name}")), None);
}

#[test]
fn an_expired_lease_is_taken_over_by_one_node() {
    let Some(server) = server() else {
        return;
    };
    let k = key(11);
    let name = sealer(1).entry_name(&k);
    // A leader that died long ago.
    let stale = format!("{PREFIX}lease/{name}");
    assert_eq!(server.put(BUCKET, &stale, b"kcache-lease dead 1"), 200);
    let r = race(&server, 6, &k);
    assert_eq!((r.lead, r.found + r.looked, r.build), (1, 5, 0));
    assert_eq!(r.stats.iter().map(|s| s.leases).sum::<u64>(), 1);
}

#[test]
fn a_leader_that_gives_up_lets_a_waiting_node_build() {
    let Some(server) = server() else {
        return;
    };
    let (sealer, k) = (sealer(1), key(12));
    let name = sealer.entry_name(&k);
    let leader = open(config(&server));
    let Flight::Lead(lease) = leader.flight(&name, &verify(&sealer, &k)) else {
        panic!("the first node leads");
    };
    let wanted = lease.wanted();
    std::thread::scope(|s| {
        let follower = s.spawn(|| {
            let store = open(config(&server));
            let outcome = match store.flight(&name, &verify(&sealer, &k)) {
                Flight::Lead(_) => "lead",
                Flight::Found(_) => "found",
                Flight::Build => "build",
            };
            (outcome, store.stats())
        });
        // The follower's mark reaches the leader's thread, whatever the machine's speed.
        while !wanted.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        // The build failed: no entry, the lease dropped.
        drop(lease);
        let (outcome, stats) = follower.join().unwrap();
        assert_eq!(outcome, "lead");
        assert_eq!((stats.lease_waits, stats.leases, stats.hits), (1, 1, 0));
    });
    assert_eq!(leader.stats().leases, 1);
}

#[test]
fn a_renewed_lease_is_not_taken_over() {
    let Some(server) = server() else {
        return;
    };
    let (sealer, k) = (sealer(1), key(13));
    let (name, entry) = (sealer.entry_name(&k), sealed(&sealer, &k, b"slow build"));
    let short = |store: &mut ObjectStore| {
        Arc::get_mut(&mut store.inner).unwrap().lease_ttl = Duration::from_millis(1500);
    };
    let mut leader = open(config(&server));
    short(&mut leader);
    let Flight::Lead(lease) = leader.flight(&name, &verify(&sealer, &k)) else {
        panic!("the first node leads");
    };
    std::thread::scope(|s| {
        let follower = s.spawn(|| {
            let mut store = open(config(&server));
            short(&mut store);
            let found = match store.flight(&name, &verify(&sealer, &k)) {
                Flight::Found(found) => found.payload().to_vec(),
                _ => Vec::new(),
            };
            (found, store.stats())
        });
        // A build several times the lease's lifetime: renewals keep it.
        std::thread::sleep(Duration::from_secs(5));
        leader.put(&name, &entry);
        drop(lease);
        let (found, stats) = follower.join().unwrap();
        assert_eq!(found, b"slow build");
        assert_eq!((stats.leases, stats.lease_waits, stats.hits), (0, 1, 1));
    });
}

/// A store on the fake server, unsigned, with a small limit and a short budget.
fn on_fake(fake: &FakeS3, threshold: u32) -> ObjectStore {
    open(ObjectStoreConfig {
        max_entry_size: Some(64 << 10),
        timeout: Some(Duration::from_millis(400)),
        breaker_threshold: Some(threshold),
        ..ObjectStoreConfig::at(format!("{}/{BUCKET}/", fake.endpoint()))
    })
}

#[test]
fn hostile_servers_cost_at_most_the_limit_and_the_budget() {
    let (sealer, k) = (sealer(1), key(14));
    let name = sealer.entry_name(&k);
    let limit = 64 << 10;
    let get = |store: &ObjectStore| store.get(&name, &verify(&sealer, &k)).is_none();

    // Announces a gigabyte and sends much more than the limit: read to the limit + 1, refused.
    let fake = FakeS3::start(Answer::Lying {
        announced: 1 << 30,
        sent: 4 << 20,
    });
    let store = on_fake(&fake, 100);
    assert!(get(&store));
    let s = store.stats();
    assert_eq!((s.rejects, s.bytes_read, s.timeouts), (1, limit + 1, 0));

    // Announces a gigabyte, sends a little, then nothing: the budget ends it.
    let fake = FakeS3::start(Answer::Lying {
        announced: 1 << 30,
        sent: 1000,
    });
    let store = on_fake(&fake, 100);
    assert!(get(&store));
    let s = store.stats();
    assert_eq!((s.timeouts, s.rejects, s.bytes_read), (1, 0, 0));

    // A chunked body without end.
    let fake = FakeS3::start(Answer::Endless);
    let store = on_fake(&fake, 100);
    assert!(get(&store));
    let s = store.stats();
    assert_eq!((s.rejects, s.bytes_read), (1, limit + 1));

    // A byte every 20 ms: every read is quick, the whole is not.
    let fake = FakeS3::start(Answer::Trickle {
        len: 1000,
        every: Duration::from_millis(20),
    });
    let store = on_fake(&fake, 100);
    assert!(get(&store));
    assert_eq!(store.stats().timeouts, 1);
    assert!(fake.sent() < 1000);

    // Never answers, to a read or a write.
    let fake = FakeS3::start(Answer::Silent);
    let store = on_fake(&fake, 100);
    assert!(get(&store));
    store.put(&name, &sealed(&sealer, &k, b"x"));
    let s = store.stats();
    assert_eq!((s.timeouts, s.puts), (2, 0));

    // 500s: errors, then the breaker skips the store.
    let fake = FakeS3::start(Answer::Status(500));
    let store = on_fake(&fake, 3);
    for _ in 0..5 {
        assert!(get(&store));
    }
    let s = store.stats();
    assert_eq!((s.errors, s.breaker_trips, s.skipped), (3, 1, 2));
    assert_eq!(fake.requests(), 3);
    // A lease cannot be had: build at once.
    assert!(matches!(
        store.flight(&name, &verify(&sealer, &k)),
        Flight::Build
    ));
}

#[test]
fn secrets_are_never_logged() {
    let messages = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&messages);
    crate::log::set_level(crate::log::Level::Debug);
    crate::log::set_hook(move |_, message| seen.lock().unwrap().push(message.to_owned()));
    let secret = "kcache-never-shown-secret";
    let token = "kcache-never-shown-token";
    let fake = FakeS3::start(Answer::Status(403));
    let config = ObjectStoreConfig {
        access_key_id: Some("AKIDSHOWN".into()),
        secret_access_key: Some(Zeroizing::new(secret.into())),
        session_token: Some(Zeroizing::new(token.into())),
        ..ObjectStoreConfig::at(format!("{}/{BUCKET}/", fake.endpoint()))
    };
    let debug = format!("{config:?}");
    let store = open(config);
    let (sealer, k) = (sealer(1), key(15));
    let name = sealer.entry_name(&k);
    assert!(store.get(&name, &verify(&sealer, &k)).is_none());
    store.put(&name, &sealed(&sealer, &k, b"x"));
    assert!(matches!(
        store.flight(&name, &verify(&sealer, &k)),
        Flight::Build
    ));
    drop(fake);
    // Connection refused once the fake is gone: its message too.
    let refused = FakeS3::start(Answer::Status(200));
    let port = refused.endpoint();
    drop(refused);
    let gone = open(ObjectStoreConfig {
        access_key_id: Some("AKIDSHOWN".into()),
        secret_access_key: Some(Zeroizing::new(secret.into())),
        session_token: Some(Zeroizing::new(token.into())),
        ..ObjectStoreConfig::at(format!("{port}/{BUCKET}/"))
    });
    gone.get(&name, &verify(&sealer, &k));
    crate::log::reset_hook();
    crate::log::set_level(crate::log::Level::Warn);
    let messages = messages.lock().unwrap();
    let ours: Vec<&String> = messages
        .iter()
        .filter(|m| m.contains("object store"))
        .collect();
    assert!(ours.len() >= 3, "{messages:?}");
    for text in messages.iter().map(String::as_str).chain([debug.as_str()]) {
        assert!(!text.contains(secret) && !text.contains(token), "{text}");
        assert!(
            !text.contains("X-Amz-Signature") && !text.contains("X-Amz-Credential"),
            "{text}"
        );
    }
    assert_eq!(store.stats().errors, 3);
}

#[test]
fn without_an_operator_key_the_tier_is_off_unless_allowed() {
    let at = || ObjectStoreConfig::at("http://127.0.0.1:1/bucket");
    assert!(ObjectStore::open(at(), false).is_none());
    let allowed = ObjectStoreConfig {
        allow_unkeyed: true,
        ..at()
    };
    assert!(ObjectStore::open(allowed, false).is_some());
    assert!(ObjectStore::open(at(), true).is_some());
}
