//! Model-checked interleavings of the L1 protocol. Run with `--features shuttle`: the memory
//! tier's locks, condition variables and atomics are then shuttle's, and each test explores
//! thousands of schedules of the same few threads.
#![cfg(feature = "shuttle")]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use kcache::memory::{MemoryCache, Options};
use kcache::{BuildError, DeviceId, Error};
use shuttle::sync::atomic::AtomicBool;
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

/// [`explore`] with a new ledger and a new cache on it (see [`cache`]) for each schedule.
fn explore_cache(
    invalidated_by_clear: bool,
    test: impl Fn(&Arc<Ledger>, &Arc<MemoryCache<u32, u64>>) + Send + Sync + 'static,
) {
    explore(move || {
        let ledger = Arc::new(Ledger::default());
        test(&ledger, &cache(&ledger, invalidated_by_clear));
    });
}

/// When an operation on another thread began and when it was done, so that a build can tell
/// whether the whole operation ran inside it.
#[derive(Clone)]
struct Window {
    began: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
}

impl Window {
    fn new() -> Window {
        Window {
            began: Arc::new(AtomicBool::new(false)),
            done: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Runs `operation` on `c` on a new thread, between the two marks.
    fn run<T: Send + 'static>(
        &self,
        c: &Arc<MemoryCache<u32, u64>>,
        operation: impl FnOnce(&MemoryCache<u32, u64>) -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let (c, window) = (Arc::clone(c), self.clone());
        thread::spawn(move || {
            window.began.store(true, Ordering::SeqCst);
            let out = operation(&c);
            window.done.store(true, Ordering::SeqCst);
            out
        })
    }

    /// Looks key 1 up for `device` on a new thread, with a build that runs `on_build` and then
    /// yields once. The thread returns the value it got and whether the whole operation ran
    /// while the build yielded (it began after the build did and was done before it ended).
    fn straddling_lookup(
        &self,
        c: &Arc<MemoryCache<u32, u64>>,
        device: Option<DeviceId>,
        on_build: impl FnOnce() + Send + 'static,
    ) -> thread::JoinHandle<(kcache::Result<u64>, bool)> {
        let (c, window) = (Arc::clone(c), self.clone());
        thread::spawn(move || {
            let mut straddled = false;
            let r = c.find_or_build(&1, device, || {
                on_build();
                let before = !window.began.load(Ordering::SeqCst);
                thread::yield_now();
                straddled = before && window.done.load(Ordering::SeqCst);
                Ok((10, 1))
            });
            (r.map(|lease| *lease), straddled)
        })
    }
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
    explore_cache(false, |ledger, c| {
        for got in racing_lookups(c, ledger, 3, || Ok((10, 1))) {
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
    explore_cache(false, |ledger, c| {
        for got in racing_lookups(c, ledger, 3, || Err(BuildError::new(5, "no"))) {
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
    explore_cache(false, |ledger, c| {
        let eviction = Window::new();
        let l = Arc::clone(ledger);
        let builder = eviction.straddling_lookup(c, Some(7), move || {
            l.builds.fetch_add(1, Ordering::SeqCst);
        });
        let evictor = eviction.run(c, |c| c.evict_device(7).unwrap());
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
    explore_cache(true, |_, c| {
        let clearing = Window::new();
        let lookups: Vec<_> = (0..2)
            .map(|_| clearing.straddling_lookup(c, None, || {}))
            .collect();
        let clearer = clearing.run(c, |c| c.clear().unwrap());
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
    explore_cache(false, |ledger, c| {
        let lease = c.find_or_build(&1, None, || Ok((10, 1))).unwrap();
        ledger.held.fetch_add(1, Ordering::SeqCst);
        let releaser = {
            let l = Arc::clone(ledger);
            thread::spawn(move || {
                l.held.fetch_sub(1, Ordering::SeqCst);
                drop(lease);
            })
        };
        let clearer = {
            let c = Arc::clone(c);
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

/// Looks key 1 up for `device` on a new thread, with a build that counts itself, yields once
/// and returns `value`.
fn lookup(
    c: &Arc<MemoryCache<u32, u64>>,
    ledger: &Arc<Ledger>,
    device: Option<DeviceId>,
    value: u64,
) -> thread::JoinHandle<kcache::Result<u64>> {
    let (c, l) = (Arc::clone(c), Arc::clone(ledger));
    thread::spawn(move || {
        c.find_or_build(&1, device, || {
            l.builds.fetch_add(1, Ordering::SeqCst);
            thread::yield_now();
            Ok((value, 1))
        })
        .map(|lease| *lease)
    })
}

/// Every value built is cached or destroyed exactly once, and no lease is left.
fn accounted(ledger: &Ledger, c: &MemoryCache<u32, u64>) {
    assert_eq!(
        ledger.destroys.load(Ordering::SeqCst) + c.len() as u64,
        ledger.builds.load(Ordering::SeqCst)
    );
    assert_eq!(c.stats().leases, 0);
}

/// Looks key 1 up for `builder` (building 10) and for `other` (building 20) while device 7 is
/// evicted, each on a thread of its own; returns what the two lookups got.
fn lookups_racing_eviction_of_7(
    ledger: &Arc<Ledger>,
    c: &Arc<MemoryCache<u32, u64>>,
    builder: Option<DeviceId>,
    other: Option<DeviceId>,
) -> (kcache::Result<u64>, kcache::Result<u64>) {
    let first = lookup(c, ledger, builder, 10);
    let second = lookup(c, ledger, other, 20);
    let evictor = {
        let c = Arc::clone(c);
        thread::spawn(move || c.evict_device(7).unwrap())
    };
    let got = (first.join().unwrap(), second.join().unwrap());
    evictor.join().unwrap();
    accounted(ledger, c);
    got
}

#[test]
fn lookup_without_device_never_inherits_an_eviction() {
    explore_cache(false, |ledger, c| {
        let (built, got) = lookups_racing_eviction_of_7(ledger, c, Some(7), None);
        assert!(
            matches!(built, Ok(10 | 20) | Err(Error::DeviceDestroyed(7))),
            "{built:?}"
        );
        assert!(matches!(got, Ok(10 | 20)), "{got:?}");
    });
}

#[test]
fn lookup_on_an_evicted_device_never_gets_a_value_built_across_the_eviction() {
    explore_cache(false, |ledger, c| {
        let (built, got) = lookups_racing_eviction_of_7(ledger, c, None, Some(7));
        assert!(matches!(built, Ok(10 | 20)), "{built:?}");
        assert!(
            matches!(got, Ok(10 | 20) | Err(Error::DeviceDestroyed(7))),
            "{got:?}"
        );
        if let Some(lease) = c.get(&1) {
            // Still recorded against device 7 only if the eviction was wholly before the
            // lookup for it, which then got the value.
            if lease.devices().contains(&7) {
                assert!(got.is_ok(), "{got:?}");
            }
        }
    });
}

/// Runs `doom` on a thread that then looks key 1 up for `device`, racing a build of key 1 for
/// `device`: the lookup that starts after `doom` returned always succeeds.
fn lookup_after_doom(
    invalidated_by_clear: bool,
    device: Option<DeviceId>,
    doom: fn(&MemoryCache<u32, u64>),
) {
    explore_cache(invalidated_by_clear, move |ledger, c| {
        let builder = lookup(c, ledger, device, 10);
        let later = {
            let (c, l) = (Arc::clone(c), Arc::clone(ledger));
            thread::spawn(move || {
                doom(&c);
                c.find_or_build(&1, device, || {
                    l.builds.fetch_add(1, Ordering::SeqCst);
                    Ok((20, 1))
                })
                .map(|lease| *lease)
            })
        };
        let built = builder.join().unwrap();
        let got = later.join().unwrap();
        assert!(
            matches!(
                built,
                Ok(10 | 20) | Err(Error::DeviceDestroyed(7) | Error::CacheCleared)
            ),
            "{built:?}"
        );
        assert!(matches!(got, Ok(10 | 20)), "{got:?}");
        accounted(ledger, c);
    });
}

#[test]
fn lookup_after_an_eviction_never_joins_a_doomed_build() {
    lookup_after_doom(false, Some(7), |c| {
        c.evict_device(7).unwrap();
    });
}

#[test]
fn lookup_after_a_clear_never_joins_a_doomed_build() {
    lookup_after_doom(true, None, |c| {
        c.clear().unwrap();
    });
}
