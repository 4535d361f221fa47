//! The `main` that benchmark binaries share: their Criterion groups, then the tables of their
//! own that only `cargo bench` prints.

use criterion::Criterion;

/// Runs the Criterion `groups`, then `tables` under `cargo bench` only: `cargo test
/// --all-targets` runs a bench binary without `--bench`, as a smoke run of the groups.
pub fn main(groups: fn(), tables: fn()) {
    groups();
    Criterion::default().configure_from_args().final_summary();
    if std::env::args().any(|a| a == "--bench") {
        tables();
    }
}

/// [`main`] of a hit benchmark that also serves an instruction counter: with
/// `KCACHE_BENCH_PEER` set, only `peer(name, ops)`, with `ops` from `KCACHE_BENCH_OPS` (else
/// `default_ops`).
pub fn main_with_peers(default_ops: usize, peer: fn(&str, usize), groups: fn(), tables: fn()) {
    let Ok(name) = std::env::var("KCACHE_BENCH_PEER") else {
        return main(groups, tables);
    };
    let ops = std::env::var("KCACHE_BENCH_OPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default_ops);
    peer(&name, ops);
}
