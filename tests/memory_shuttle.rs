//! Model-checked interleavings of the L1 protocol. Run with `--features shuttle`: the memory
//! tier's locks, condition variables and atomics are then shuttle's, and each test explores
//! thousands of schedules of the same few threads.
#![cfg(feature = "shuttle")]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use kcache::memory::{MemoryCache, Options};
use kcache::{BuildError, Error};
use shuttle::thread;

const SCHEDULES: usize = 10_000;

/// Explores `test` under random scheduling and under PCT, which finds orderings where one
/// thread runs a long stretch uninterrupted (a whole `clear` inside another thread's build).
fn explore(test: impl Fn() + Send + Sync + 'static) {
    let test = Arc::new(test);
    let t = Arc::clone(&test);
    shuttle::check_random(move || t(), SCHEDULES);
    shuttle::check_pct(move || test(), SCHEDULES, 3);
}

#[derive(Default)]
struct Ledger {
    builds: AtomicU64,
    destroys: AtomicU64,
    /// Leases the test holds on the value right now; a destroy must see zero.
    held: AtomicI64,
    destroyed_while_held: AtomicU64,
}

fn cache(ledger: &Arc<Ledger>, invalidated_by_clear: bool) -> Arc<MemoryCache<u32, u64>> {
    let l = Arc::clone(ledger);
    Arc::new(MemoryCache::new(
        Options {
            invalidated_by_clear,
            ..Options::default()
        },
        move |_| {
            if l.held.load(Ordering::SeqCst) != 0 {
                l.destroyed_while_held.fetch_add(1, Ordering::SeqCst);
            }
            l.destroys.fetch_add(1, Ordering::SeqCst);
            Ok(())
        },
    ))
}

/// Looks up key 1 from `threads` threads at once, each with a build that counts itself in the
/// ledger and then returns `build()`; returns what each lookup got, in thread order.
fn racing_lookups(
    c: &Arc<MemoryCache<u32, u64>>,
    ledger: &Arc<Ledger>,
    threads: usize,
    build: fn() -> Result<(u64, u64), BuildError>,
) -> Vec<kcache::Result<u64>> {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (c, l) = (Arc::clone(c), Arc::clone(ledger));
            thread::spawn(move || {
                c.find_or_build(&1, None, || {
                    l.builds.fetch_add(1, Ordering::SeqCst);
                    build()
                })
                .map(|lease| *lease)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn single_flight_builds_once() {
    explore(|| {
        let ledger = Arc::new(Ledger::default());
        let c = cache(&ledger, false);
        for got in racing_lookups(&c, &ledger, 3, || Ok((10, 1))) {
            assert_eq!(got, Ok(10));
        }
        assert_eq!(ledger.builds.load(Ordering::SeqCst), 1, "one build per key");
        assert_eq!(c.len(), 1);
        let s = c.stats();
        assert_eq!((s.builds, s.misses, s.hits + s.waits), (1, 1, 2));
    });
}

#[test]
fn single_flight_with_failing_builder() {
    explore(|| {
        let ledger = Arc::new(Ledger::default());
        let c = cache(&ledger, false);
        for got in racing_lookups(&c, &ledger, 3, || Err(BuildError::new(5, "no"))) {
            assert_eq!(got, Err(Error::Build(BuildError::new(5, "no"))));
        }
        let s = c.stats();
        let builds = ledger.builds.load(Ordering::SeqCst);
        assert!((1..=3).contains(&builds));
        assert_eq!(s.build_failures, builds);
        assert_eq!(s.waits + s.misses, 3, "every lookup either built or waited");
        assert_eq!(c.len(), 0);
    });
}

#[test]
fn evict_during_build() {
    use shuttle::sync::atomic::AtomicBool;
    explore(|| {
        let ledger = Arc::new(Ledger::default());
        let c = cache(&ledger, false);
        let evict_began = Arc::new(AtomicBool::new(false));
        let evict_done = Arc::new(AtomicBool::new(false));
        let builder = {
            let (c, l) = (Arc::clone(&c), Arc::clone(&ledger));
            let (began, done) = (Arc::clone(&evict_began), Arc::clone(&evict_done));
            thread::spawn(move || {
                let mut straddled = false;
                let r = c.find_or_build(&1, Some(7), || {
                    l.builds.fetch_add(1, Ordering::SeqCst);
                    let before = !began.load(Ordering::SeqCst);
                    thread::yield_now();
                    straddled = before && done.load(Ordering::SeqCst);
                    Ok((10, 1))
                });
                (r.map(|lease| *lease), straddled)
            })
        };
        let evictor = {
            let c = Arc::clone(&c);
            let (began, done) = (Arc::clone(&evict_began), Arc::clone(&evict_done));
            thread::spawn(move || {
                began.store(true, Ordering::SeqCst);
                let n = c.evict_device(7).unwrap();
                done.store(true, Ordering::SeqCst);
                n
            })
        };
        let (built, straddled) = builder.join().unwrap();
        let evicted = evictor.join().unwrap();
        if straddled {
            // The whole eviction ran inside the build: the value must not be installed.
            assert_eq!(built, Err(Error::DeviceDestroyed(7)));
            assert_eq!(c.len(), 0);
            assert_eq!(c.stats().discarded, 1);
        }
        match built {
            Ok(10) | Err(Error::DeviceDestroyed(7)) => {}
            other => panic!("unexpected {other:?}"),
        }
        // Every built value is either cached or destroyed exactly once.
        assert_eq!(ledger.builds.load(Ordering::SeqCst), 1);
        assert_eq!(ledger.destroys.load(Ordering::SeqCst) + c.len() as u64, 1);
        assert!(evicted <= 1);
        assert_eq!(c.stats().leases, 0);
    });
}

#[test]
fn clear_during_build_on_borrowing_cache() {
    use shuttle::sync::atomic::AtomicBool;
    explore(|| {
        let ledger = Arc::new(Ledger::default());
        let c = cache(&ledger, true);
        let clear_began = Arc::new(AtomicBool::new(false));
        let clear_done = Arc::new(AtomicBool::new(false));
        let lookups: Vec<_> = (0..2)
            .map(|_| {
                let c = Arc::clone(&c);
                let (began, done) = (Arc::clone(&clear_began), Arc::clone(&clear_done));
                thread::spawn(move || {
                    let mut straddled = false;
                    let r = c.find_or_build(&1, None, || {
                        let before = !began.load(Ordering::SeqCst);
                        thread::yield_now();
                        straddled = before && done.load(Ordering::SeqCst);
                        Ok((10, 1))
                    });
                    (r.map(|lease| *lease), straddled)
                })
            })
            .collect();
        let clearer = {
            let c = Arc::clone(&c);
            thread::spawn(move || {
                clear_began.store(true, Ordering::SeqCst);
                c.clear().unwrap();
                clear_done.store(true, Ordering::SeqCst);
            })
        };
        for lookup in lookups {
            let (outcome, straddled) = lookup.join().unwrap();
            if straddled {
                assert_eq!(
                    outcome,
                    Err(Error::CacheCleared),
                    "a straddling build is discarded"
                );
            }
            assert!(
                matches!(outcome, Ok(10) | Err(Error::CacheCleared)),
                "{outcome:?}"
            );
        }
        clearer.join().unwrap();
        let s = c.stats();
        assert_eq!(s.builds, s.destroys + c.len() as u64);
        assert!(s.discarded <= 2);
        assert_eq!(s.leases, 0);
    });
}

#[test]
fn last_lease_release_racing_clear() {
    explore(|| {
        let ledger = Arc::new(Ledger::default());
        let c = cache(&ledger, false);
        let lease = c.find_or_build(&1, None, || Ok((10, 1))).unwrap();
        ledger.held.fetch_add(1, Ordering::SeqCst);
        let releaser = {
            let l = Arc::clone(&ledger);
            thread::spawn(move || {
                l.held.fetch_sub(1, Ordering::SeqCst);
                drop(lease);
            })
        };
        let clearer = {
            let c = Arc::clone(&c);
            thread::spawn(move || c.clear().unwrap())
        };
        releaser.join().unwrap();
        assert_eq!(clearer.join().unwrap(), 1);
        assert_eq!(
            ledger.destroys.load(Ordering::SeqCst),
            1,
            "destroyed exactly once"
        );
        assert_eq!(ledger.destroyed_while_held.load(Ordering::SeqCst), 0);
        assert_eq!(c.stats().leases, 0);
    });
}
