//! Accounting under contention: threads find, hold and release leases over shared and private
//! keys while others clear and evict. Afterwards every built value was destroyed exactly once or
//! is still cached, and no value was ever destroyed while a lease on it was held. Meanwhile no
//! lookup saw a device error for a device it did not name.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use kcache::memory::{MemoryCache, Options};
use kcache::{DestroyError, Error};

const THREADS: usize = 8;
const ITERATIONS: usize = 20_000;
const MAX_VALUES: usize = 1 << 20;

struct Tracker {
    next: AtomicU64,
    /// Leases held per value id, as the test itself counts them.
    held: Vec<AtomicI64>,
    destroyed: Vec<AtomicU64>,
    violations: Mutex<Vec<String>>,
    /// Lookups that got `DeviceDestroyed` for the device they named.
    device_errors: AtomicU64,
}

/// A tiny deterministic generator, so that a failing run can be replayed.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn run(options: Options) {
    let tracker = Arc::new(Tracker {
        next: AtomicU64::new(0),
        held: (0..MAX_VALUES).map(|_| AtomicI64::new(0)).collect(),
        destroyed: (0..MAX_VALUES).map(|_| AtomicU64::new(0)).collect(),
        violations: Mutex::new(Vec::new()),
        device_errors: AtomicU64::new(0),
    });
    let t = Arc::clone(&tracker);
    let cache = Arc::new(MemoryCache::<Vec<u8>, u64>::new(options, move |v| {
        let i = v as usize;
        if t.held[i].load(Ordering::SeqCst) != 0 {
            t.violations
                .lock()
                .unwrap()
                .push(format!("value {v} destroyed while leased"));
        }
        if t.destroyed[i].fetch_add(1, Ordering::SeqCst) != 0 {
            t.violations
                .lock()
                .unwrap()
                .push(format!("value {v} destroyed twice"));
        }
        Ok::<(), DestroyError>(())
    }));

    let workers: Vec<_> = (0..THREADS)
        .map(|id| {
            let (cache, tracker) = (Arc::clone(&cache), Arc::clone(&tracker));
            thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (id as u64 + 1);
                let mut held = Vec::new();
                for _ in 0..ITERATIONS {
                    let r = next_random(&mut rng);
                    match r % 100 {
                        0 => {
                            cache.clear().unwrap();
                        }
                        1..=2 => {
                            cache.evict_device((r >> 8) as i64 % 4).unwrap();
                        }
                        _ => {
                            let key = if r.is_multiple_of(3) {
                                format!("private-{id}-{}", (r >> 8) % 16)
                            } else {
                                format!("shared-{}", (r >> 8) % 32)
                            };
                            // One lookup in five names no device: none of those may see a
                            // device error, whatever the builds they join were for.
                            let device = match (r >> 16) % 5 {
                                4 => None,
                                d => Some(d as i64),
                            };
                            let result = cache.find_or_build(key.as_bytes(), device, || {
                                let v = tracker.next.fetch_add(1, Ordering::SeqCst);
                                Ok((v, 1 + v % 7))
                            });
                            match result {
                                Ok(lease) => {
                                    tracker.held[*lease as usize].fetch_add(1, Ordering::SeqCst);
                                    held.push(lease);
                                }
                                Err(Error::DeviceDestroyed(d)) if device == Some(d) => {
                                    tracker.device_errors.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => panic!("unexpected error {e} for device {device:?}"),
                            }
                        }
                    }
                    if !held.is_empty() && (held.len() > 4 || r.is_multiple_of(5)) {
                        let lease = held.swap_remove((r as usize >> 24) % held.len());
                        tracker.held[*lease as usize].fetch_sub(1, Ordering::SeqCst);
                        drop(lease);
                    }
                }
                for lease in held {
                    tracker.held[*lease as usize].fetch_sub(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }

    let violations = tracker.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    let stats = cache.stats();
    let built = tracker.next.load(Ordering::SeqCst);
    assert_eq!(stats.builds, built);
    assert_eq!(stats.leases, 0);
    assert_eq!(stats.builds, stats.destroys + cache.len() as u64);
    let destroyed_once = tracker
        .destroyed
        .iter()
        .filter(|d| d.load(Ordering::SeqCst) == 1)
        .count() as u64;
    assert_eq!(destroyed_once, stats.destroys);
    assert!(stats.clears > 0 && stats.device_evictions > 0 && stats.waits + stats.hits > 0);
    println!(
        "{} builds, {} waits, {} discarded, {} device errors (each for the caller's own device)",
        stats.builds,
        stats.waits,
        stats.discarded,
        tracker.device_errors.load(Ordering::Relaxed)
    );

    // Dropping the cache destroys the rest, exactly once each.
    drop(cache);
    let destroyed: u64 = tracker
        .destroyed
        .iter()
        .map(|d| d.load(Ordering::SeqCst))
        .sum();
    assert_eq!(destroyed, built);
    assert!(
        tracker
            .destroyed
            .iter()
            .all(|d| d.load(Ordering::SeqCst) <= 1)
    );
}

#[test]
fn accounting_is_exact_under_contention() {
    run(Options::default());
}

#[test]
fn accounting_is_exact_with_caps() {
    run(Options {
        max_entries: Some(12),
        max_weight: Some(40),
        ..Options::default()
    });
}
