//! Callbacks that call back into kcache: a log hook that flushes, reads statistics and looks a
//! key up, called on the disk tier's background writer and on the caller's thread, and a build
//! that does the same. Each scenario runs under a watchdog, so that a deadlock fails the test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcache::disk::{Durability, OperatorKey};
use kcache::log::{self, Level};
use kcache::remote::RemoteConfig;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::redis::free_port;
use kcache_testkit::strings::{Cache, find_or_build, l2_key, lookup, serialize, tiered};

const WATCHDOG: Duration = Duration::from_secs(60);

/// Runs `scenario` on a thread of its own; whether it finished before the watchdog.
fn finishes(scenario: impl FnOnce() + Send + 'static) -> bool {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        scenario();
        done.send(()).unwrap();
    });
    finished.recv_timeout(WATCHDOG).is_ok()
}

/// A tiered cache whose remote tier refuses every connection: each background write's remote
/// part fails and logs (at debug) on the writer thread.
fn cache_with_a_failing_remote(dir: &std::path::Path) -> Arc<Cache> {
    let disk = Persistence::open(PersistenceConfig {
        key: Some(OperatorKey::new(vec![3; 32]).unwrap()),
        durability: Durability::Relaxed,
        remote: Some(RemoteConfig {
            breaker_threshold: Some(1_000),
            ..RemoteConfig::at(format!("redis://127.0.0.1:{}/", free_port()))
        }),
        ..PersistenceConfig::in_dir(dir)
    })
    .unwrap();
    Arc::new(tiered(Some(Arc::new(disk))))
}

/// One test: the hook is the process's.
#[test]
fn callbacks_that_call_back_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = cache_with_a_failing_remote(tmp.path());
    let on_writer = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (hook_cache, hook_writer, hook_seen) = (cache.clone(), on_writer.clone(), seen.clone());
    log::set_level(Level::Debug);
    log::set_hook(move |_, message| {
        let thread = std::thread::current().name().map(str::to_owned);
        if thread.as_deref() == Some("kcache-writer") {
            hook_writer.fetch_add(1, Ordering::SeqCst);
        }
        hook_cache.flush();
        let stats = hook_cache.stats();
        let builds = AtomicUsize::new(0);
        let value = lookup(&hook_cache, "looked up from the hook", &builds).unwrap();
        hook_seen
            .lock()
            .unwrap()
            .push((thread, message.to_owned(), stats.builds, value));
    });

    let scenario = cache.clone();
    let logged = finishes(move || {
        let builds = AtomicUsize::new(0);
        for source in ["a", "b", "c"] {
            lookup(&scenario, source, &builds).unwrap();
        }
        scenario.flush();
    });
    assert!(logged, "a log hook that calls back deadlocked");
    assert!(
        on_writer.load(Ordering::SeqCst) > 0,
        "the hook was called on the writer: {:?}",
        seen.lock().unwrap()
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|(_, _, _, value)| value == "compiled(looked up from the hook)")
    );
    log::reset_hook();
    log::set_level(Level::Warn);

    // A build that flushes, reads statistics and looks another key up.
    let scenario = cache.clone();
    let built = finishes(move || {
        let inner = scenario.clone();
        let lease = find_or_build(
            &scenario,
            "outer",
            move || {
                inner.flush();
                let builds = AtomicUsize::new(0);
                let value = lookup(&inner, "inner", &builds).unwrap();
                Ok((format!("{value}+{}", inner.stats().builds), 1))
            },
            serialize,
        )
        .unwrap();
        assert!(lease.value().starts_with("compiled(inner)+"));
        scenario.flush();
    });
    assert!(built, "a build that calls back deadlocked");
    let disk = cache.disk().unwrap();
    for source in ["a", "b", "c", "outer", "inner", "looked up from the hook"] {
        assert!(
            disk.entry_path(&l2_key(source)).exists(),
            "{source} on disk"
        );
    }
}
