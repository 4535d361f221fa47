//! A cluster's cold start: nodes, each a process with a keyed cache directory of its own (as on
//! separate machines), start the same kernels at the same moment, sharing no store (each node
//! compiles every kernel), a Redis tier (one `redis-server` on loopback, empty at each run) or
//! an object store (one SeaweedFS on loopback, an empty bucket at each run). The
//! configurations take turns run by run, so that all see the same load, and each ratio is taken
//! within a round of runs. The object store is left out, with a message, where SeaweedFS is not
//! installed (`scripts/test` installs it; `KCACHE_TEST_WEED` names it).

use std::process::Command;
use std::time::Duration;

use kcache_testkit::redis::RedisServer;
use kcache_testkit::seaweed::SeaweedServer;

use super::{Kernel, Mode, Table, WORKER_NODE, together, worker_command};

/// What one run of `nodes` nodes did.
struct Run {
    /// Until every node's first launches of both kernels were done.
    wall: Duration,
    /// Until every node's flush was done too.
    wall_flushed: Duration,
    compiles: u128,
    remote_hits: u128,
    lease_waits: u128,
}

/// What the nodes share.
#[derive(Clone, Copy, PartialEq)]
enum Shared {
    Nothing,
    Redis,
    ObjectStore,
}

impl Shared {
    fn name(self) -> &'static str {
        match self {
            Shared::Nothing => "none",
            Shared::Redis => "redis",
            Shared::ObjectStore => "s3",
        }
    }
}

/// A store of `shared`'s kind, started for one run, and the URL its nodes are given.
enum Server {
    Nothing,
    Redis(RedisServer),
    ObjectStore(SeaweedServer),
}

impl Server {
    fn start(shared: Shared) -> Server {
        match shared {
            Shared::Nothing => Server::Nothing,
            Shared::Redis => Server::Redis(RedisServer::start().expect("checked by cold_starts")),
            Shared::ObjectStore => {
                let server = SeaweedServer::start().expect("checked by cold_starts");
                server.create_bucket("kernels");
                Server::ObjectStore(server)
            }
        }
    }

    fn url(&self) -> String {
        match self {
            Server::Nothing => String::new(),
            Server::Redis(server) => server.url(),
            Server::ObjectStore(server) => server.url("kernels", "cluster/"),
        }
    }
}

/// One cold start of `nodes` nodes sharing `shared`.
fn once(nodes: usize, shared: Shared) -> Run {
    let root = tempfile::tempdir().unwrap();
    // Started (and for the object store, its bucket made) before the nodes: not timed.
    let server = Server::start(shared);
    let url = server.url();
    let (wall, wall_flushed, reports) = together(root.path(), nodes, |i, pocl| {
        let dir = root.path().join(format!("node-{i}"));
        let mut command = worker_command(Mode::Kcache, &Kernel::ALL, &dir, pocl);
        command.env(WORKER_NODE, &url);
        command
    });
    let sum = |name| reports.iter().map(|r| r.find(name).unwrap_or(0)).sum();
    Run {
        wall,
        wall_flushed,
        compiles: sum("source_builds"),
        remote_hits: sum("remote_hits"),
        lease_waits: sum("lease_waits"),
    }
}

/// The median and the range of `values`.
fn spread<T: Copy + PartialOrd>(mut values: Vec<T>) -> (T, T, T) {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn seconds((median, low, high): (Duration, Duration, Duration)) -> String {
    let s = |d: Duration| d.as_secs_f64();
    format!("{:.2} s ({:.2}–{:.2})", s(median), s(low), s(high))
}

fn counts((median, low, high): (u128, u128, u128)) -> String {
    if low == high {
        format!("{median}")
    } else {
        format!("{median} ({low}–{high})")
    }
}

/// Four nodes and one node (`KCACHE_BENCH_CLUSTER_NODES`, such as `2`), `runs` runs of each
/// configuration.
pub fn cold_starts(runs: usize) {
    let redis = Command::new("redis-server").arg("--version").output();
    if redis.is_err() {
        println!("\ncluster: skipped: `redis-server` is not installed (the remote tier needs one)");
        return;
    }
    let mut configurations = vec![Shared::Nothing, Shared::Redis];
    if kcache_testkit::seaweed::find_weed().is_some() {
        configurations.push(Shared::ObjectStore);
    } else {
        println!("\ncluster: the object store left out: SeaweedFS is not installed");
    }
    println!(
        "\ncluster: nodes with cache directories of their own start {} and {} at once, \
         sharing no store, Redis or an object store (median and range of {runs} runs)",
        Kernel::Saxpy.name(),
        Kernel::Matmul.name()
    );
    let table = Table {
        widths: &[5, 7, 9, 22, 22, 11, 11],
        names: false,
    };
    table.row([
        "nodes",
        "shared",
        "compiles",
        "first launches",
        "+ flush",
        "store hits",
        "lease waits",
    ]);
    let sizes = std::env::var("KCACHE_BENCH_CLUSTER_NODES").unwrap_or_else(|_| "4,1".into());
    for nodes in sizes.split(',').map(|n| n.trim().parse::<usize>().unwrap()) {
        let mut results: Vec<Vec<Run>> = configurations.iter().map(|_| Vec::new()).collect();
        for run in 0..runs {
            // Rotate which goes first, so that none always follows another.
            for i in 0..configurations.len() {
                let c = (i + run) % configurations.len();
                results[c].push(once(nodes, configurations[c]));
            }
        }
        for (shared, runs) in configurations.iter().zip(&results) {
            let column = |of: fn(&Run) -> u128| counts(spread(runs.iter().map(of).collect()));
            table.row([
                nodes.to_string(),
                shared.name().to_owned(),
                column(|r| r.compiles),
                seconds(spread(runs.iter().map(|r| r.wall).collect())),
                seconds(spread(runs.iter().map(|r| r.wall_flushed).collect())),
                column(|r| r.remote_hits),
                column(|r| r.lease_waits),
            ]);
        }
        for (shared, with) in configurations.iter().zip(&results).skip(1) {
            let ratio = |of: fn(&Run) -> Duration| {
                let rounds = results[0].iter().zip(with);
                let (median, low, high) = spread(
                    rounds
                        .map(|(a, b)| of(a).as_secs_f64() / of(b).as_secs_f64())
                        .collect(),
                );
                format!("{median:.2}x ({low:.2}–{high:.2})")
            };
            println!(
                "{nodes:>5} node{}, none ÷ {}: first launches {}, + flush {}",
                if nodes == 1 { "" } else { "s" },
                shared.name(),
                ratio(|r| r.wall),
                ratio(|r| r.wall_flushed),
            );
        }
    }
    println!("(first launches: from the go file until every node has launched both kernels;");
    println!(
        " + flush: until every node has flushed too; compiles: builds from source, all nodes;"
    );
    println!(" ratios: within each round of runs, above 1 means faster with the store)");
}
