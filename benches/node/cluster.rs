//! A cluster's cold start: nodes, each a process with a keyed cache directory of its own (as on
//! separate machines), start the same kernels at the same moment, with the remote tier (one
//! `redis-server` on loopback, empty at each run) and without it (each node compiles every
//! kernel). The two configurations alternate run by run, so that both see the same load, and
//! each ratio is taken within a pair of runs.

use std::process::Command;
use std::time::Duration;

use kcache_testkit::redis::RedisServer;

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

/// One cold start of `nodes` nodes, with the remote tier when `remote`.
fn once(nodes: usize, remote: bool) -> Run {
    let root = tempfile::tempdir().unwrap();
    let server = remote.then(RedisServer::start);
    let url = server.as_ref().map(RedisServer::url).unwrap_or_default();
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

/// Four nodes and one node, `runs` runs of each configuration.
pub fn cold_starts(runs: usize) {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("\ncluster: skipped: `redis-server` is not installed (the remote tier needs one)");
        return;
    }
    println!(
        "\ncluster: nodes with cache directories of their own start {} and {} at once, \
         without and with the remote tier (median and range of {runs} runs)",
        Kernel::Saxpy.name(),
        Kernel::Matmul.name()
    );
    let table = Table {
        widths: &[5, 7, 9, 22, 22, 11, 11],
        names: false,
    };
    table.row([
        "nodes",
        "remote",
        "compiles",
        "first launches",
        "+ flush",
        "remote hits",
        "lease waits",
    ]);
    // `KCACHE_BENCH_CLUSTER_NODES=1` measures the lone node alone.
    let sizes = std::env::var("KCACHE_BENCH_CLUSTER_NODES").unwrap_or_else(|_| "4,1".into());
    for nodes in sizes.split(',').map(|n| n.trim().parse::<usize>().unwrap()) {
        let (mut without, mut with) = (Vec::new(), Vec::new());
        for run in 0..runs {
            // Alternate which goes first, so that neither always follows the other.
            if run % 2 == 0 {
                without.push(once(nodes, false));
                with.push(once(nodes, true));
            } else {
                with.push(once(nodes, true));
                without.push(once(nodes, false));
            }
        }
        for (remote, results) in [("no", &without), ("yes", &with)] {
            let column = |of: fn(&Run) -> u128| counts(spread(results.iter().map(of).collect()));
            table.row([
                nodes.to_string(),
                remote.to_owned(),
                column(|r| r.compiles),
                seconds(spread(results.iter().map(|r| r.wall).collect())),
                seconds(spread(results.iter().map(|r| r.wall_flushed).collect())),
                column(|r| r.remote_hits),
                column(|r| r.lease_waits),
            ]);
        }
        let ratio = |of: fn(&Run) -> Duration| {
            let pairs = without.iter().zip(&with);
            let (median, low, high) = spread(
                pairs
                    .map(|(a, b)| of(a).as_secs_f64() / of(b).as_secs_f64())
                    .collect(),
            );
            format!("{median:.2}x ({low:.2}–{high:.2})")
        };
        println!(
            "{nodes:>5} node{}, without ÷ with the remote: first launches {}, + flush {}",
            if nodes == 1 { "" } else { "s" },
            ratio(|r| r.wall),
            ratio(|r| r.wall_flushed),
        );
    }
    println!("(first launches: from the go file until every node has launched both kernels;");
    println!(
        " + flush: until every node has flushed too; compiles: builds from source, all nodes;"
    );
    println!(" ratios: within each pair of runs, above 1 means faster with the remote)");
}
