//! Operation sequences on the memory tier (`MemoryCache`) against a model.
//!
//! Single-threaded: concurrency has its own stress and model-checked tests. What this target
//! adds is arbitrary *sequences*: builds that succeed or fail, hits, gets and probes, leases
//! held, cloned and released in any order, removes, clears, device evictions, dropping the
//! cache, failing destroys, caps on entries and weight, and builds that do things while they
//! run (look up their own key, clear the cache, evict their device, build other keys), which
//! is how a build straddles a clear or an eviction on one thread.
//!
//! The model predicts everything exactly, including which entries the CLOCK hand evicts (it
//! follows the policy described in `src/memory/policy.rs`, reading each entry's recorded build
//! time for its cost class), and after every operation the target checks:
//!
//! - each value is destroyed exactly once, never while the harness holds a lease on it, and
//!   exactly the values the model says are gone are gone;
//! - every `stats()` field (hits, misses, builds, failures, waits, discarded, capacity and
//!   device evictions, clears, destroys, destroy errors, entries, weight, leases) and `len()`;
//! - results: the value and key a lease names, the error a stale build returns, the count a
//!   clear or eviction returns and the destroy failure it reports;
//! - destroy failures with no caller to return to go to `on_destroy_error`, the others do not;
//! - caps: after an install the cache is within its caps, or holds the new entry alone;
//! - at the end, with the cache dropped and every lease released, builds == destroys and
//!   every value built has been destroyed.
#![no_main]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbitrary::Arbitrary;
use kcache::memory::{Eviction, Lease, MAX_ENTRY_WEIGHT, MemoryCache, Options, Stats};
use kcache::{BuildError, DestroyError, DeviceId, Error};
use libfuzzer_sys::fuzz_target;

type Cache = MemoryCache<Vec<u8>, u64>;
type Held = Lease<Vec<u8>, u64>;

const KEYS: u8 = 6;
const MAX_OPS: usize = 64;
/// Builds that sleep cost real time; a few per input reach the higher cost classes.
const MAX_SLOW_BUILDS: u32 = 2;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Weight {
    Small(u8),
    Large(u32),
    /// Past `MAX_ENTRY_WEIGHT`, up to `u64::MAX`: counted as `MAX_ENTRY_WEIGHT`.
    Huge(u64),
}

impl Weight {
    fn get(self) -> u64 {
        match self {
            Weight::Small(w) => u64::from(w % 8),
            Weight::Large(w) => u64::from(w),
            Weight::Huge(w) => w.max(MAX_ENTRY_WEIGHT),
        }
    }

    /// What the cache counts for it.
    fn counted(self) -> u64 {
        self.get().min(MAX_ENTRY_WEIGHT)
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Outcome {
    Value {
        weight: Weight,
        destroy_fails: bool,
        /// Sleep about a millisecond, so the entry lands in a higher cost class.
        slow: bool,
    },
    Error(i32),
}

/// Operations that may also run inside a build.
#[derive(Arbitrary, Debug, Clone)]
enum Inner {
    FindOrBuild {
        key: u8,
        device: Option<u8>,
        outcome: Outcome,
        hold: bool,
    },
    Get {
        key: u8,
        hold: bool,
    },
    Probe {
        key: u8,
        hold: bool,
    },
    Release(u8),
    CloneLease(u8),
    Remove(u8),
    Clear,
    EvictDevice(u8),
    EvictDevices(Vec<u8>),
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    Inner(Inner),
    /// A build that runs `during` before returning `outcome`.
    BuildDoing {
        key: u8,
        device: Option<u8>,
        outcome: Outcome,
        hold: bool,
        during: Vec<Inner>,
    },
    DropCache,
}

#[derive(Arbitrary, Debug)]
struct Input {
    max_entries: Option<u8>,
    max_weight: Option<u16>,
    invalidated_by_clear: bool,
    plain_clock: bool,
    ops: Vec<Op>,
}

fn key_bytes(key: u8) -> Vec<u8> {
    vec![key % KEYS]
}

fn device_id(device: u8) -> DeviceId {
    // -1 included: the C ABI's "no device" is an ordinary id to the Rust API.
    DeviceId::from(device % 4) - 1
}

/// What the destroy callback and the error hook saw.
#[derive(Default)]
struct Tracker {
    destroyed: Vec<u64>,
    failing: Vec<u64>,
    /// Leases the harness holds, per value.
    held: HashMap<u64, usize>,
    violations: Vec<String>,
    hook_calls: u64,
}

/// Where a destroy happened: whether its failure is returned to a caller or reported to
/// `on_destroy_error`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Returned,
    Hooked,
}

struct ModelEntry {
    key: u8,
    weight: u64,
    device: Option<DeviceId>,
    linked: bool,
    leases: usize,
    chances: u8,
    cost_class: u8,
    destroys_fail: bool,
    destroyed: bool,
}

/// A build in progress: its key, its device and that device's epoch, and the generation, as
/// they were when it started.
type Building = (u8, Option<(DeviceId, u64)>, u64);

#[derive(Default)]
struct Model {
    entries: HashMap<u64, ModelEntry>,
    table: HashMap<u8, u64>,
    /// The CLOCK queue, dead and unlinked entries included until the hand or a pruning drops
    /// them (the queue's length sets the sweep's budget).
    queue: VecDeque<u64>,
    epochs: HashMap<DeviceId, u64>,
    generation: u64,
    /// Builds in progress, outermost first.
    building: Vec<Building>,
    stats: Stats,
    hook_calls: u64,
    max_entries: Option<u64>,
    max_weight: Option<u64>,
    invalidated_by_clear: bool,
    cost_aware: bool,
}

impl Model {
    fn capped(&self) -> bool {
        self.max_entries.is_some() || self.max_weight.is_some()
    }

    fn over(&self, entries: u64, weight: u64) -> bool {
        self.max_entries.is_some_and(|m| entries > m) || self.max_weight.is_some_and(|m| weight > m)
    }

    fn weight(&self) -> u64 {
        self.table.values().map(|id| self.entries[id].weight).sum()
    }

    /// Runs the destroy callback's bookkeeping; returns whether it failed.
    fn destroy(&mut self, id: u64, path: Path) -> bool {
        let e = self.entries.get_mut(&id).unwrap();
        assert!(!e.destroyed);
        e.destroyed = true;
        self.stats.destroys += 1;
        if e.destroys_fail {
            self.stats.destroy_errors += 1;
            if path == Path::Hooked {
                self.hook_calls += 1;
            }
        }
        e.destroys_fail
    }

    fn unlink(&mut self, id: u64) {
        let e = self.entries.get_mut(&id).unwrap();
        assert!(e.linked);
        e.linked = false;
        let key = e.key;
        self.table.remove(&key);
    }

    /// Unlinks `victims` and destroys those no lease holds. Returns the failing ids.
    fn unlink_and_destroy(&mut self, victims: &[u64], path: Path) -> Vec<u64> {
        let mut failed = Vec::new();
        for &id in victims {
            self.unlink(id);
        }
        for &id in victims {
            if self.entries[&id].leases == 0 && self.destroy(id, path) {
                failed.push(id);
            }
        }
        failed
    }

    fn lease_taken(&mut self, id: u64) {
        self.entries.get_mut(&id).unwrap().leases += 1;
    }

    fn lease_released(&mut self, id: u64) {
        let e = self.entries.get_mut(&id).unwrap();
        e.leases -= 1;
        if e.leases == 0 && !e.linked {
            self.destroy(id, Path::Hooked);
        }
    }

    fn hit(&mut self, id: u64) {
        self.stats.hits += 1;
        let e = self.entries.get_mut(&id).unwrap();
        e.chances = e.chances.max(e.cost_class + 1);
    }

    fn epoch(&self, device: DeviceId) -> u64 {
        self.epochs.get(&device).copied().unwrap_or(0)
    }

    fn alive(&self, id: u64) -> bool {
        let e = &self.entries[&id];
        e.linked || e.leases > 0
    }

    /// The CLOCK sweep after installing `newest`: returns the victims, in the hand's order.
    fn admit(&mut self, newest: u64) -> Vec<u64> {
        let mut entries = self.table.len() as u64;
        let mut weight = self.weight();
        if self.queue.len() > 2 * entries as usize + 32 {
            let queue = std::mem::take(&mut self.queue);
            self.queue = queue.into_iter().filter(|&id| self.alive(id)).collect();
        }
        self.queue.push_back(newest);
        let mut budget = 5 * self.queue.len() + 1;
        let mut victims = Vec::new();
        while self.over(entries, weight) && budget > 0 {
            budget -= 1;
            let Some(id) = self.queue.pop_front() else {
                break;
            };
            if !self.alive(id) || !self.entries[&id].linked {
                continue;
            }
            let e = self.entries.get_mut(&id).unwrap();
            if id == newest || e.chances > 0 {
                e.chances = e.chances.saturating_sub(1);
                self.queue.push_back(id);
                continue;
            }
            entries -= 1;
            weight -= e.weight;
            victims.push(id);
        }
        victims
    }
}

/// The model's cost class of a build: how many of the thresholds (1 ms, 10 ms, 100 ms) its
/// time reaches.
fn cost_class(build_time: Duration) -> u8 {
    let reached = [1, 10, 100]
        .into_iter()
        .filter(|&ms| build_time >= Duration::from_millis(ms))
        .count();
    u8::try_from(reached).expect("three thresholds")
}

struct Harness {
    model: Model,
    tracker: Arc<Mutex<Tracker>>,
    leases: Vec<(Held, u64)>,
    next_id: u64,
    slow_builds: u32,
}

impl Harness {
    /// Records a lease the harness now has on `id`, checking what it names.
    fn took(&mut self, lease: Held, id: u64, hold: bool) {
        assert_eq!(*lease, id, "lease names another value");
        let e = &self.model.entries[&id];
        assert_eq!(lease.key(), &key_bytes(e.key));
        assert_eq!(lease.weight(), e.weight);
        assert_eq!(lease.devices(), e.device.as_slice());
        self.model.lease_taken(id);
        *self.tracker.lock().unwrap().held.entry(id).or_default() += 1;
        if hold {
            self.leases.push((lease, id));
        } else {
            self.drop_lease(lease, id);
        }
    }

    fn drop_lease(&mut self, lease: Held, id: u64) {
        // The tracker forgets the lease before it is released: a destroy run by this very
        // release is legitimate, any other destroy of a held value is not.
        *self.tracker.lock().unwrap().held.get_mut(&id).unwrap() -= 1;
        self.model.lease_released(id);
        drop(lease);
    }

    fn find_or_build(
        &mut self,
        cache: &Cache,
        key: u8,
        device: Option<u8>,
        outcome: &Outcome,
        hold: bool,
        during: &[Inner],
    ) {
        let k = key % KEYS;
        let device = device.map(device_id);
        let mut ran = false;
        let mut built_id = None;

        if let Some(&(_, snapshot, generation)) = self.model.building.iter().find(|b| b.0 == k) {
            // A build that an eviction of its device (or a clear of an invalidating cache) has
            // doomed is detached: a lookup now starts a build of its own, nested in the doomed
            // one, which the model does not follow; it is not made.
            let doomed = snapshot.is_some_and(|(d, epoch)| self.model.epoch(d) != epoch)
                || (self.model.invalidated_by_clear && self.model.generation != generation);
            if doomed {
                return;
            }
            let r = cache.find_or_build(&key_bytes(k)[..], device, || {
                ran = true;
                Err(BuildError::new(0, "unreachable"))
            });
            assert!(!ran, "a lookup of a key being built ran a build");
            assert!(matches!(r, Err(Error::Reentrant)), "{r:?}");
            return;
        }
        if let Some(&id) = self.model.table.get(&k) {
            self.model.hit(id);
            let r = cache.find_or_build(&key_bytes(k)[..], device, || {
                ran = true;
                Err(BuildError::new(0, "unreachable"))
            });
            assert!(!ran, "a hit ran a build");
            self.took(r.expect("a hit succeeds"), id, hold);
            return;
        }

        self.model.stats.misses += 1;
        let snapshot = device.map(|d| (d, self.model.epoch(d)));
        self.model
            .building
            .push((k, snapshot, self.model.generation));
        let r = cache.find_or_build(&key_bytes(k)[..], device, || {
            ran = true;
            for op in during.iter().take(8) {
                self.inner(cache, op);
            }
            match *outcome {
                Outcome::Error(code) => Err(BuildError::new(code, "build failed")),
                Outcome::Value {
                    weight,
                    destroy_fails,
                    slow,
                } => {
                    self.next_id += 1;
                    let id = self.next_id;
                    if destroy_fails {
                        self.tracker.lock().unwrap().failing.push(id);
                    }
                    if slow && self.slow_builds < MAX_SLOW_BUILDS {
                        self.slow_builds += 1;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    built_id = Some((id, weight.counted(), destroy_fails));
                    Ok((id, weight.get()))
                }
            }
        });
        assert!(ran, "a miss did not run its build");
        let (bk, snapshot, generation) = self.model.building.pop().unwrap();
        assert_eq!(bk, k);

        let Some((id, weight, destroys_fail)) = built_id else {
            self.model.stats.build_failures += 1;
            let Outcome::Error(code) = *outcome else {
                unreachable!()
            };
            assert!(
                matches!(&r, Err(Error::Build(e)) if e.code == code),
                "a failed build returned {r:?}"
            );
            return;
        };
        self.model.stats.builds += 1;
        self.model.entries.insert(
            id,
            ModelEntry {
                key: k,
                weight,
                device,
                linked: false,
                leases: 0,
                chances: 0,
                cost_class: 0,
                destroys_fail,
                destroyed: false,
            },
        );
        let stale = match snapshot {
            Some((d, epoch)) if self.model.epoch(d) != epoch => Some(Error::DeviceDestroyed(d)),
            _ if self.model.invalidated_by_clear && self.model.generation != generation => {
                Some(Error::CacheCleared)
            }
            _ => None,
        };
        if let Some(want) = stale {
            self.model.stats.discarded += 1;
            self.model.destroy(id, Path::Hooked);
            assert_eq!(
                r.as_ref().err(),
                Some(&want),
                "a stale build returned {r:?}"
            );
            return;
        }

        let lease = r.unwrap_or_else(|e| panic!("an install failed: {e:?}"));
        let class = if self.model.cost_aware {
            cost_class(lease.build_time())
        } else {
            0
        };
        let e = self.model.entries.get_mut(&id).unwrap();
        e.linked = true;
        e.cost_class = class;
        e.chances = class;
        self.model.table.insert(k, id);
        // The lease exists before the caps are enforced (the new entry is never the victim).
        self.model.lease_taken(id);
        *self.tracker.lock().unwrap().held.entry(id).or_default() += 1;
        if self.model.capped() {
            let victims = self.model.admit(id);
            self.model.stats.capacity_evictions += victims.len() as u64;
            self.model.unlink_and_destroy(&victims, Path::Hooked);
            assert!(
                !self
                    .model
                    .over(self.model.table.len() as u64, self.model.weight())
                    || self.model.table.len() == 1,
                "the model left the cache over its caps with more than the new entry"
            );
        }
        self.model.lease_released(id);
        *self.tracker.lock().unwrap().held.get_mut(&id).unwrap() -= 1;
        self.took(lease, id, hold);
    }

    /// Checks the result of a call that unlinks `victims` (clear, eviction, remove).
    fn unlinking(&mut self, r: kcache::Result<usize>, victims: &[u64]) {
        let failed = self.model.unlink_and_destroy(victims, Path::Returned);
        match r {
            Ok(n) => {
                assert_eq!(n, victims.len());
                assert!(
                    failed.is_empty(),
                    "destroy failures of {failed:?} not returned"
                );
            }
            Err(Error::Destroy(e)) => {
                assert!(
                    !failed.is_empty(),
                    "a destroy failure returned, none expected"
                );
                assert_eq!(e.code, 7);
                assert!(failed.iter().any(|id| e.message == format!("value {id}")));
            }
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }

    fn inner(&mut self, cache: &Cache, op: &Inner) {
        match op {
            Inner::FindOrBuild {
                key,
                device,
                outcome,
                hold,
            } => self.find_or_build(cache, *key, *device, outcome, *hold, &[]),
            Inner::Get { key, hold } | Inner::Probe { key, hold } => {
                let k = key % KEYS;
                let is_get = matches!(op, Inner::Get { .. });
                let r = if is_get {
                    cache.get(&key_bytes(k)[..])
                } else {
                    cache.probe(&key_bytes(k)[..])
                };
                match self.model.table.get(&k).copied() {
                    Some(id) => {
                        self.model.hit(id);
                        self.took(r.expect("a linked key is found"), id, *hold);
                    }
                    None => {
                        assert!(r.is_none(), "found a key that is not linked");
                        if is_get {
                            self.model.stats.misses += 1;
                        }
                    }
                }
            }
            Inner::Release(i) => {
                if !self.leases.is_empty() {
                    let (lease, id) = self.leases.swap_remove(usize::from(*i) % self.leases.len());
                    self.drop_lease(lease, id);
                }
            }
            Inner::CloneLease(i) => {
                if !self.leases.is_empty() {
                    let (lease, id) = &self.leases[usize::from(*i) % self.leases.len()];
                    let (lease, id) = (lease.clone(), *id);
                    self.took(lease, id, true);
                }
            }
            Inner::Remove(key) => {
                let k = key % KEYS;
                let r = cache.remove(&key_bytes(k)[..]);
                let victims: Vec<u64> = self.model.table.get(&k).copied().into_iter().collect();
                self.unlinking(r.map(usize::from), &victims);
            }
            Inner::Clear => {
                let r = cache.clear();
                self.model.generation += 1;
                self.model.stats.clears += 1;
                self.model.queue.clear();
                let victims: Vec<u64> = self.model.table.values().copied().collect();
                self.unlinking(r, &victims);
            }
            Inner::EvictDevice(d) => self.evict(cache, &[*d], true),
            Inner::EvictDevices(ds) => self.evict(cache, &ds[..ds.len().min(4)], false),
        }
    }

    fn evict(&mut self, cache: &Cache, devices: &[u8], one: bool) {
        let mut ids: Vec<DeviceId> = devices.iter().map(|&d| device_id(d)).collect();
        let r = if one {
            cache.evict_device(ids[0])
        } else {
            cache.evict_devices(ids.iter().copied())
        };
        ids.sort_unstable();
        ids.dedup();
        for &d in &ids {
            *self.model.epochs.entry(d).or_insert(0) += 1;
        }
        let victims: Vec<u64> = self
            .model
            .table
            .values()
            .copied()
            .filter(|id| {
                self.model.entries[id]
                    .device
                    .is_some_and(|d| ids.contains(&d))
            })
            .collect();
        self.model.stats.device_evictions += victims.len() as u64;
        self.unlinking(r, &victims);
    }

    /// Everything the model can see from outside, compared with the cache (if still there).
    fn check(&self, cache: Option<&Cache>) {
        let t = self.tracker.lock().unwrap();
        assert!(t.violations.is_empty(), "{:?}", t.violations);
        let mut destroyed = t.destroyed.clone();
        destroyed.sort_unstable();
        let before = destroyed.len();
        destroyed.dedup();
        assert_eq!(before, destroyed.len(), "a value was destroyed twice");
        let mut expected: Vec<u64> = self
            .model
            .entries
            .iter()
            .filter(|(_, e)| e.destroyed)
            .map(|(&id, _)| id)
            .collect();
        expected.sort_unstable();
        assert_eq!(
            destroyed, expected,
            "destroyed values differ from the model's"
        );
        assert_eq!(
            t.hook_calls, self.model.hook_calls,
            "on_destroy_error calls"
        );
        drop(t);

        let Some(cache) = cache else {
            return;
        };
        let mut want = self.model.stats;
        want.entries = self.model.table.len() as u64;
        want.weight = self.model.weight();
        want.leases = self.leases.len() as u64;
        assert_eq!(cache.stats(), want);
        assert_eq!(cache.len(), self.model.table.len());
        assert_eq!(cache.is_empty(), self.model.table.is_empty());
    }
}

fuzz_target!(|input: Input| {
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let destroy_tracker = Arc::clone(&tracker);
    let hook_tracker = Arc::clone(&tracker);
    let options = Options {
        max_entries: input.max_entries.map(|m| u64::from(m % 8)),
        max_weight: input.max_weight.map(u64::from),
        invalidated_by_clear: input.invalidated_by_clear,
        on_destroy_error: Some(Arc::new(move |e: &DestroyError| {
            assert_eq!(e.code, 7);
            hook_tracker.lock().unwrap().hook_calls += 1;
        })),
        eviction: if input.plain_clock {
            Eviction::Clock
        } else {
            Eviction::CostAware
        },
    };
    let cache: Cache = MemoryCache::new(options.clone(), move |value: u64| {
        let mut t = destroy_tracker.lock().unwrap();
        t.destroyed.push(value);
        if t.held.get(&value).copied().unwrap_or(0) > 0 {
            t.violations
                .push(format!("value {value} destroyed while a lease holds it"));
        }
        if t.failing.contains(&value) {
            Err(DestroyError::new(7, format!("value {value}")))
        } else {
            Ok(())
        }
    });
    let mut h = Harness {
        model: Model {
            max_entries: options.max_entries,
            max_weight: options.max_weight,
            invalidated_by_clear: options.invalidated_by_clear,
            cost_aware: options.eviction == Eviction::CostAware,
            ..Model::default()
        },
        tracker: Arc::clone(&tracker),
        leases: Vec::new(),
        next_id: 0,
        slow_builds: 0,
    };

    let mut cache = Some(cache);
    for op in input.ops.iter().take(MAX_OPS) {
        let Some(c) = cache.as_ref() else {
            break;
        };
        match op {
            Op::Inner(inner) => h.inner(c, inner),
            Op::BuildDoing {
                key,
                device,
                outcome,
                hold,
                during,
            } => h.find_or_build(c, *key, *device, outcome, *hold, during),
            Op::DropCache => {
                drop(cache.take());
                let linked: Vec<u64> = h.model.table.values().copied().collect();
                h.model.unlink_and_destroy(&linked, Path::Hooked);
                h.model.queue.clear();
            }
        }
        h.check(cache.as_ref());
    }

    // The end: the cache goes, then every lease, in the order they were taken or reversed.
    if let Some(c) = cache.take() {
        let stats = c.stats();
        assert_eq!(stats.builds, h.model.stats.builds);
        drop(c);
        let linked: Vec<u64> = h.model.table.values().copied().collect();
        h.model.unlink_and_destroy(&linked, Path::Hooked);
    }
    h.check(None);
    while let Some((lease, id)) = h.leases.pop() {
        h.drop_lease(lease, id);
        h.check(None);
    }
    // Exact accounting: every value built was destroyed, once.
    let t = tracker.lock().unwrap();
    assert_eq!(t.destroyed.len() as u64, h.model.stats.builds);
    assert_eq!(t.destroyed.len() as u64, h.next_id);
    assert_eq!(h.model.stats.destroys, h.model.stats.builds);
});
