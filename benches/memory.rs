//! L1 hit cost against peers on one workload (10k keys, all hits), 1 and 2 threads, plus a
//! single-flight storm. Criterion measures each; the closing table prints ratios from one
//! back-to-back run of every peer, so machine speed cancels out.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use kcache::memory::{Eviction, MemoryCache, Options};

const KEYS: usize = 10_000;
const OPS_PER_THREAD: usize = 200_000;

type Value = Arc<u64>;

fn keys() -> Vec<Vec<u8>> {
    (0..KEYS as u64)
        .map(|i| format!("kernel-{i:08}-sm90").into_bytes())
        .collect()
}

/// One lookup-and-use of a hit, per peer.
trait Peer: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn hit(&self, key: &[u8]) -> u64;
}

struct Kcache(MemoryCache<Vec<u8>, u64>);
impl Peer for Kcache {
    fn name(&self) -> &'static str {
        "kcache find_or_build+release"
    }
    fn hit(&self, key: &[u8]) -> u64 {
        let lease = self.0.find_or_build(key, None, || unreachable!()).unwrap();
        *lease
    }
}

struct Quick(quick_cache::sync::Cache<Vec<u8>, Value>);
impl Peer for Quick {
    fn name(&self) -> &'static str {
        "quick_cache get"
    }
    fn hit(&self, key: &[u8]) -> u64 {
        *self.0.get(key).unwrap()
    }
}

struct Moka(moka::sync::Cache<Vec<u8>, Value>);
impl Peer for Moka {
    fn name(&self) -> &'static str {
        "moka get"
    }
    fn hit(&self, key: &[u8]) -> u64 {
        *self.0.get(key).unwrap()
    }
}

struct Locked(Mutex<HashMap<Vec<u8>, Value>>);
impl Peer for Locked {
    fn name(&self) -> &'static str {
        "Mutex<HashMap> get"
    }
    fn hit(&self, key: &[u8]) -> u64 {
        let value = Arc::clone(self.0.lock().unwrap().get(key).unwrap());
        *value
    }
}

fn peers(keys: &[Vec<u8>]) -> Vec<Arc<dyn Peer>> {
    let k = MemoryCache::new(Options::default(), |_| Ok(()));
    let q = quick_cache::sync::Cache::new(KEYS * 2);
    let m = moka::sync::Cache::new(KEYS as u64 * 2);
    let mut h = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        k.find_or_build(key.as_slice(), None, || Ok((i as u64, 1)))
            .unwrap();
        q.insert(key.clone(), Arc::new(i as u64));
        m.insert(key.clone(), Arc::new(i as u64));
        h.insert(key.clone(), Arc::new(i as u64));
    }
    m.run_pending_tasks();
    vec![
        Arc::new(Kcache(k)),
        Arc::new(Quick(q)),
        Arc::new(Moka(m)),
        Arc::new(Locked(Mutex::new(h))),
    ]
}

/// Runs `ops` hits per thread on `threads` threads; returns the wall time of the slowest.
fn run(peer: &Arc<dyn Peer>, keys: &Arc<Vec<Vec<u8>>>, threads: usize, ops: usize) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (peer, keys, start) = (Arc::clone(peer), Arc::clone(keys), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                let began = Instant::now();
                let mut sum = 0u64;
                let mut i = t * 7919;
                for _ in 0..ops {
                    i = (i + 7_001) % keys.len();
                    sum = sum.wrapping_add(peer.hit(&keys[i]));
                }
                black_box(sum);
                began.elapsed()
            })
        })
        .collect();
    start.wait();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap()
}

fn hits(c: &mut Criterion) {
    let keys = Arc::new(keys());
    let peers = peers(&keys);
    for threads in [1, 2] {
        let mut group = c.benchmark_group(format!("l1_hit_{threads}_thread"));
        group.throughput(criterion::Throughput::Elements(threads as u64));
        for peer in &peers {
            group.bench_function(peer.name(), |b| {
                b.iter_custom(|iters| run(peer, &keys, threads, iters as usize))
            });
        }
        group.finish();
    }
}

fn storm(c: &mut Criterion) {
    let mut group = c.benchmark_group("single_flight_storm");
    group.sample_size(10);
    group.bench_function("16 threads, one key, 10 ms build", |b| {
        b.iter(|| assert_eq!(storm_once(), 1))
    });
    group.finish();
}

/// 16 threads miss on one key whose build takes 10 ms; returns how many builds ran.
fn storm_once() -> u64 {
    let cache = Arc::new(MemoryCache::<String, u64>::new(Options::default(), |_| {
        Ok(())
    }));
    let builds = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (cache, builds, start) = (cache.clone(), builds.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let lease = cache
                    .find_or_build("hot", None, || {
                        builds.fetch_add(1, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(10));
                        Ok((1, 1))
                    })
                    .unwrap();
                *lease
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 1);
    }
    builds.load(Ordering::SeqCst)
}

criterion_group!(benches, hits, storm);

/// Rounds of the closing table: each round measures every peer back to back.
const ROUNDS: usize = 7;

/// Nanoseconds per hit per thread, best of three runs.
fn per_hit(peer: &Arc<dyn Peer>, keys: &Arc<Vec<Vec<u8>>>, threads: usize) -> f64 {
    (0..3)
        .map(|_| run(peer, keys, threads, OPS_PER_THREAD).as_nanos() as f64 / OPS_PER_THREAD as f64)
        .fold(f64::INFINITY, f64::min)
}

/// Median, lowest and highest of `values`.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn show((median, low, high): (f64, f64, f64)) -> String {
    format!("{median:.2} ({low:.2}-{high:.2})")
}

/// What the closing table ran on.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cores = thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{model}, {cores} cores, load average {}",
        load.split(' ').next().unwrap_or("?")
    )
}

fn ratios() {
    let keys = Arc::new(keys());
    let hot = Arc::new(keys[..1].to_vec());
    let peers = peers(&keys);
    // Per round and peer: ns per hit on 1 thread, on 2 threads, and on 2 threads on one key.
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let round: Vec<[f64; 3]> = peers
            .iter()
            .map(|p| {
                [
                    per_hit(p, &keys, 1),
                    per_hit(p, &keys, 2),
                    per_hit(p, &hot, 2),
                ]
            })
            .collect();
        rounds.push(round);
    }
    let of = |peer: usize, column: usize| -> Vec<f64> {
        rounds.iter().map(|r| r[peer][column]).collect()
    };
    let mops = |ns: Vec<f64>| ns.into_iter().map(|ns| 2.0 * 1e3 / ns).collect::<Vec<_>>();
    println!(
        "\nL1 hit, {KEYS} keys, all hits: median (range) of {ROUNDS} rounds, each the best of 3 \
         x {OPS_PER_THREAD} hits per thread; {}",
        machine()
    );
    println!(
        "{:<30} {:>20} {:>22} {:>22}",
        "peer", "1 thread ns/hit", "2 threads M hits/s", "2 threads, 1 key M/s"
    );
    for (i, peer) in peers.iter().enumerate() {
        println!(
            "{:<30} {:>20} {:>22} {:>22}",
            peer.name(),
            show(spread(of(i, 0))),
            show(spread(mops(of(i, 1)))),
            show(spread(mops(of(i, 2))))
        );
    }
    // Ratios within each round, so that a slow moment of the machine cancels out.
    let per_round = |column: usize, f: &dyn Fn(f64, f64) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .map(|r| f(r[0][column], r[1][column]))
            .collect()
    };
    println!(
        "kcache / quick_cache, 1 thread, time per hit: {}",
        show(spread(per_round(0, &|k, q| k / q)))
    );
    println!(
        "kcache / quick_cache, 2 threads, throughput: {}",
        show(spread(per_round(1, &|k, q| q / k)))
    );
    println!(
        "kcache / quick_cache, 2 threads on one key, throughput: {}",
        show(spread(per_round(2, &|k, q| q / k)))
    );
    let scaling: Vec<f64> = rounds.iter().map(|r| 2.0 * r[0][0] / r[0][1]).collect();
    println!(
        "kcache 2-thread throughput / 1-thread throughput: {}",
        show(spread(scaling))
    );
    let vs_mutex: Vec<f64> = rounds.iter().map(|r| r[3][1] / r[0][1]).collect();
    println!(
        "kcache / Mutex<HashMap> throughput at 2 threads: {}",
        show(spread(vs_mutex))
    );
    println!(
        "single-flight storm (16 threads, one key, 10 ms build): {} build(s)",
        storm_once()
    );
}

const EXPENSIVE: u64 = 20;
const CHEAP: u64 = 60;
const CAPACITY: usize = 24;

/// A skewed trace: half the lookups go to 20 keys whose build takes 2 ms, half to 60 keys
/// whose build is instant; within each group a few keys get most lookups.
fn trace() -> Vec<u64> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..2_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let skewed = u * u * u;
            if state & 1 == 0 {
                (skewed * EXPENSIVE as f64) as u64
            } else {
                EXPENSIVE + (skewed * CHEAP as f64) as u64
            }
        })
        .collect()
}

/// Replays the trace against a cache capped at `CAPACITY` entries and returns (builds of
/// expensive keys, builds of cheap keys, time spent building).
fn replay(eviction: Eviction) -> (u64, u64, Duration) {
    let cache = MemoryCache::<u64, u64>::new(
        Options {
            max_entries: Some(CAPACITY as u64),
            eviction,
            ..Options::default()
        },
        |_| Ok(()),
    );
    let (mut expensive, mut cheap, mut spent) = (0, 0, Duration::ZERO);
    for key in trace() {
        cache
            .find_or_build(&key, None, || {
                let started = Instant::now();
                if key < EXPENSIVE {
                    expensive += 1;
                    thread::sleep(Duration::from_millis(2));
                } else {
                    cheap += 1;
                }
                spent += started.elapsed();
                Ok((key, 1))
            })
            .unwrap();
    }
    (expensive, cheap, spent)
}

/// The same trace through an exact least-recently-used list: (expensive misses, cheap misses).
fn exact_lru() -> (u64, u64) {
    let mut order: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
    let (mut expensive, mut cheap) = (0, 0);
    for key in trace() {
        if let Some(at) = order.iter().position(|&k| k == key) {
            order.remove(at);
        } else {
            if key < EXPENSIVE {
                expensive += 1;
            } else {
                cheap += 1;
            }
            if order.len() == CAPACITY {
                order.pop_front();
            }
        }
        order.push_back(key);
    }
    (expensive, cheap)
}

fn policies() {
    let clock = replay(Eviction::Clock);
    let aware = replay(Eviction::CostAware);
    let (lru_expensive, lru_cheap) = exact_lru();
    println!(
        "\nEviction on a skewed trace (2,000 lookups, 80 keys, {CAPACITY} entries, 20 keys cost 2 ms)"
    );
    println!(
        "{:<22} {:>17} {:>13} {:>16}",
        "policy", "expensive builds", "cheap builds", "time building"
    );
    println!(
        "{:<22} {lru_expensive:>17} {lru_cheap:>13} {:>13} ms",
        "exact LRU (simulated)",
        lru_expensive * 2
    );
    for (name, (e, c, t)) in [("kcache CLOCK", clock), ("kcache cost-aware", aware)] {
        println!(
            "{name:<22} {e:>17} {c:>13} {:>13.0} ms",
            t.as_secs_f64() * 1e3
        );
    }
    println!(
        "time building, CLOCK / cost-aware: {:.2}x; expensive builds, exact LRU / cost-aware: {:.2}x",
        clock.2.as_secs_f64() / aware.2.as_secs_f64(),
        lru_expensive as f64 / aware.0 as f64
    );
}

/// `KCACHE_BENCH_PEER=<peer> KCACHE_BENCH_OPS=<n>`: only `n` single-thread hits of one peer
/// (`kcache`, `quick_cache`, `moka`, `mutex`, or `loop` for the loop and key walk alone), for
/// an instruction counter: two runs with different `n` give the cost of one hit as the
/// difference over the difference in `n` (see docs/benchmarks.md).
fn one_peer(name: &str, ops: usize) {
    let keys = Arc::new(keys());
    let peers = peers(&keys);
    let peer: Arc<dyn Peer> = match name {
        "kcache" => Arc::clone(&peers[0]),
        "quick_cache" => Arc::clone(&peers[1]),
        "moka" => Arc::clone(&peers[2]),
        "mutex" => Arc::clone(&peers[3]),
        "loop" => Arc::new(Walk),
        other => panic!("KCACHE_BENCH_PEER={other:?}: not a peer"),
    };
    let threads = std::env::var("KCACHE_BENCH_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    // `KCACHE_BENCH_HOT=1`: every thread hits the same key.
    let walk = match std::env::var("KCACHE_BENCH_HOT") {
        Ok(_) => Arc::new(keys[..1].to_vec()),
        Err(_) => keys,
    };
    let took = run(&peer, &walk, threads, ops);
    println!(
        "{name}: {threads} thread(s), {ops} hits each, {:.1} ns each",
        took.as_nanos() as f64 / ops as f64
    );
}

/// The harness without a cache: the loop and the key it would look up.
struct Walk;
impl Peer for Walk {
    fn name(&self) -> &'static str {
        "loop alone"
    }
    fn hit(&self, key: &[u8]) -> u64 {
        black_box(key).len() as u64
    }
}

fn main() {
    kcache_testkit::bench::main_with_peers(OPS_PER_THREAD, one_peer, benches, || {
        ratios();
        policies();
    });
}
