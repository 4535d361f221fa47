//! The remote tier against a broken or hostile server: a fake RESP server on loopback
//! (`FakeRedis`) sends what no Redis would (a reply declaring 2 GB, a reply trickled a byte at
//! a time, an array of 2 million items, a reply cut short, nesting a million deep, nothing at
//! all). Each costs one failed operation, counted as an error or a timeout, and trips the
//! breaker like any failure; the lookup builds. What a lookup may allocate is measured on its
//! own thread (`allocation-counter`), and how much the server got to send is counted by the
//! server: both stay near `max_entry_size`. Times are not asserted (a watchdog stops a test
//! that hangs); the figures are in docs/remote.md.

use std::sync::Arc;
use std::time::Duration;

use kcache::remote::{RemoteConfig, RemoteStats};
use kcache_testkit::redis::{FakeRedis, Reply, plain_answer};
use kcache_testkit::strings::Node;

const KEY: [u8; 32] = [7; 32];
/// The entry size limit of these tests: what one read may cost, give or take a constant.
const LIMIT: u64 = 1 << 20;
/// What a lookup may allocate on top of `LIMIT`.
const SLACK: u64 = 1 << 20;
/// More than the kernel's socket buffers on loopback hold, far less than the replies.
const SENT_BOUND: u64 = 64 << 20;

fn config(server: &FakeRedis, lease_wait: Duration) -> RemoteConfig {
    RemoteConfig {
        timeout: Some(Duration::from_millis(250)),
        max_entry_size: Some(LIMIT),
        lease_wait: Some(lease_wait),
        breaker_threshold: Some(3),
        breaker_cooldown: Some(Duration::from_secs(3600)),
        ..RemoteConfig::at(server.url())
    }
}

/// A node under [`KEY`], shared with the watchdog's threads.
fn new_node(remote: RemoteConfig) -> Arc<Node> {
    Arc::new(Node::new(Some(KEY), remote))
}

/// Looks `source` up on a thread of its own, stopping the test if it takes minutes; returns
/// the most the lookup had allocated at once.
fn measured_lookup(node: &Arc<Node>, source: &'static str) -> u64 {
    let node = Arc::clone(node);
    watchdog(move || {
        let mut value = String::new();
        let info = allocation_counter::measure(|| value = node.lookup(source));
        assert_eq!(value, format!("compiled({source})"));
        info.bytes_max
    })
}

fn watched_flush(node: &Arc<Node>) {
    let node = Arc::clone(node);
    watchdog(move || node.cache.flush());
}

/// Runs `f` on a thread; panics if it has not returned within two minutes (a hang).
fn watchdog<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the operation hung")
}

/// `reply` sent a byte every 200 ms (each read gets its byte well within the timeout).
fn trickled(reply: &[u8]) -> Reply {
    Reply::Trickle(reply.to_vec(), Duration::from_millis(200))
}

/// A reply a Redis could send to every command kcache sends, padded to 50 bytes: a simple
/// string (for `SET` and `EVAL` as good as `OK`) or a bulk string for the read.
fn padded(args: &[Vec<u8>]) -> Vec<u8> {
    if args[0].eq_ignore_ascii_case(b"GETRANGE") {
        format!("${}\r\n{}\r\n", 43, "x".repeat(43)).into_bytes()
    } else {
        format!("+{}\r\n", "O".repeat(47)).into_bytes()
    }
}

#[test]
fn a_reply_declaring_two_gigabytes_costs_one_bounded_read() {
    let server = FakeRedis::answering(
        "GETRANGE",
        Reply::Flood(b"$2000000000\r\n".to_vec(), 1_500_000_000),
    );
    let node = new_node(config(&server, Duration::ZERO));
    let allocated = measured_lookup(&node, "k");
    let s = node.remote();
    assert_eq!(node.builds(), 1);
    assert_eq!(
        (s.errors + s.timeouts, s.rejects, s.hits),
        (1, 0, 0),
        "{s:?}"
    );
    assert!(
        allocated < LIMIT + SLACK,
        "a lookup allocated {allocated} bytes"
    );
    assert!(server.sent() < SENT_BOUND, "{} bytes read", server.sent());
}

/// The read's reply is `reply`: one error, a build, and less than the limit allocated.
fn a_bounded_error(reply: Vec<u8>) {
    let server = FakeRedis::answering("GETRANGE", Reply::Bytes(reply));
    let node = new_node(config(&server, Duration::ZERO));
    let allocated = measured_lookup(&node, "k");
    let s = node.remote();
    assert_eq!(node.builds(), 1);
    assert_eq!((s.errors, s.rejects, s.hits), (1, 0, 0), "{s:?}");
    assert!(
        allocated < LIMIT + SLACK,
        "a lookup allocated {allocated} bytes"
    );
}

#[test]
fn an_array_of_two_million_items_is_an_error_read_no_further() {
    let mut reply = b"*2000000\r\n".to_vec();
    reply.extend(b":1\r\n".repeat(2_000_000));
    a_bounded_error(reply);
}

#[test]
fn nesting_a_million_deep_is_an_error() {
    a_bounded_error(b"*1\r\n".repeat(1_000_000));
}

#[test]
fn a_reply_cut_short_is_an_error() {
    let server = FakeRedis::answering("GETRANGE", Reply::Close(b"$100\r\n0123456789".to_vec()));
    let node = new_node(config(&server, Duration::ZERO));
    measured_lookup(&node, "k");
    let s = node.remote();
    assert_eq!(node.builds(), 1);
    assert_eq!((s.errors, s.rejects, s.hits), (1, 0, 0), "{s:?}");
}

/// Two lookups on a node of `server`, which answers no operation within its timeout: both
/// build, three operations in a row time out, and the lease's follow-up `GET` after its
/// failed `SET` (not counted towards the breaker again; one more may have been in flight on the
/// background writer when the breaker opened), the breaker opens once and skips the rest.
fn two_lookups_trip_the_breaker(server: &FakeRedis) -> RemoteStats {
    let node = new_node(config(server, Duration::from_secs(10)));
    measured_lookup(&node, "a");
    measured_lookup(&node, "b");
    let s = node.remote();
    assert_eq!(node.builds(), 2);
    assert!((4..=5).contains(&s.timeouts), "{s:?}");
    assert_eq!(s.breaker_trips, 1);
    s
}

/// A server that trickles every reply: each read gets a byte within the timeout, the
/// operation never ends within it. Each lookup's operations time out (the read, then the
/// lease; the background writer's write too) and the third failure trips the breaker, which
/// skips the rest.
#[test]
fn trickled_replies_time_out_and_trip_the_breaker() {
    let server = FakeRedis::start(|args| trickled(&padded(args)));
    let s = two_lookups_trip_the_breaker(&server);
    assert_eq!((s.errors, s.rejects, s.hits), (0, 0, 0), "{s:?}");
    assert!(s.breaker_open);
    assert!(s.skipped >= 1, "{s:?}");
}

/// The read's reply trickles in (a 50-byte reply, a byte every 200 ms: each socket read gets
/// its byte within the timeout): each read times out at its deadline, and the third trips the
/// breaker. The node is read-only and takes no leases, so that the read is its one operation.
#[test]
fn a_trickled_read_times_out_and_trips_the_breaker() {
    let server = FakeRedis::answering("GETRANGE", trickled(&padded(&[b"GETRANGE".to_vec()])));
    let node = new_node(RemoteConfig {
        read_only: Some(true),
        ..config(&server, Duration::ZERO)
    });
    for source in ["a", "b", "c", "d"] {
        measured_lookup(&node, source);
    }
    let s = node.remote();
    assert_eq!(node.builds(), 4);
    assert_eq!((s.timeouts, s.errors, s.rejects), (3, 0, 0), "{s:?}");
    assert_eq!((s.breaker_trips, s.skipped), (1, 1), "{s:?}");
}

/// The background writer's `SET` gets a trickled reply: the write times out, once.
#[test]
fn a_trickled_reply_to_the_write_costs_the_writer_one_timeout() {
    let server = FakeRedis::start(|args| {
        if args[0].eq_ignore_ascii_case(b"SET") {
            trickled(&padded(args))
        } else {
            Reply::Bytes(plain_answer(args))
        }
    });
    let node = new_node(config(&server, Duration::ZERO));
    measured_lookup(&node, "k");
    watched_flush(&node);
    let s = node.remote();
    let sets = server.commands().iter().filter(|c| *c == "SET").count();
    assert_eq!(sets, 1);
    assert_eq!(
        (s.misses, s.puts, s.timeouts, s.errors),
        (1, 0, 1, 0),
        "{s:?}"
    );
}

/// A server that accepts connections and commands and never answers.
#[test]
fn a_server_that_never_answers_times_out_and_trips_the_breaker() {
    let server = FakeRedis::start(|_| Reply::Never);
    let s = two_lookups_trip_the_breaker(&server);
    assert_eq!(s.errors, 0, "{s:?}");
    assert!(s.skipped >= 1, "{s:?}");
    // What the breaker skipped never reached the server: the timed-out operations (the
    // lease's follow-up GET among them) and at most one in flight on the writer.
    assert!(server.commands().len() <= 5, "{:?}", server.commands());
}
