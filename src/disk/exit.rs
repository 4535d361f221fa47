//! What a process that exits without freeing its caches still writes.
//!
//! A program that returns from `main`, calls `exit()` or ends its Python interpreter with
//! caches still open would otherwise lose every background write not yet done, and on PoCL,
//! whose writes are held back until a flush, all of them. So the disk tiers open in the
//! process are flushed at exit, within `KCACHE_EXIT_TIMEOUT` seconds for all of them together
//! (default [`DEFAULT_EXIT_TIMEOUT`]); the writes not finished by then are counted in
//! `failed_writes` and logged at warning level. `_exit`, a fatal signal or `os._exit` skip
//! this: such a process must flush first.
//!
//! When: as the main thread's thread-local storage is torn down, which `exit` does first,
//! before any exit handler. Exit handlers run in the reverse order of their registration, and
//! a driver's compiler registers some at its first use, after any kcache could register: LLVM
//! (PoCL's compiler) tears down its code generator's tables in one, and a held-back PoCL
//! write made after it crashed the process. An `exit` called on another thread does not tear
//! the main thread's storage down; an exit handler then writes what is queued, but not what
//! is held back (it may need the driver's compiler, which may be gone by then): that is
//! counted and logged as not written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Inner, bump, shards};
use crate::ffi::process;
use crate::log::{self, Level, Warning};

/// How long an exit waits for the background writes of every open disk tier together.
pub const DEFAULT_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The disk tiers opened in this process, flushed at exit if still open.
static OPEN: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// Lists a newly opened disk tier (and forgets those dropped since).
pub(super) fn register(inner: &Arc<Inner>) {
    let mut open = OPEN.lock();
    open.retain(|tier| tier.strong_count() > 0);
    open.push(Arc::downgrade(inner));
    drop(open);
    watch_main_thread();
}

thread_local! {
    /// Made on the main thread only: dropped when `exit` tears the thread's storage down.
    static MAIN_EXIT: MainExit = const { MainExit };
}

struct MainExit;

impl Drop for MainExit {
    fn drop(&mut self) {
        flush_open_tiers(true);
    }
}

/// On the main thread, has its exit flush the open disk tiers.
fn watch_main_thread() {
    if process::is_main_thread() {
        // Its first use registers its destructor; later ones cost a thread-local read.
        MAIN_EXIT.with(|_| ());
    }
}

/// Has the process flush its open disk tiers at exit: called when a writer thread starts.
/// The exit handler, registered once, covers an `exit` on another thread than the main one.
pub(super) fn flush_at_exit() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    watch_main_thread();
    process::once_without_waiting(&REGISTERED, || {
        if !process::at_exit(exit_handler) {
            log::log(Level::Warn, || {
                "no exit handler could be registered: an exit without freeing the caches loses \
                 their pending writes"
                    .into()
            });
        }
    });
}

extern "C" fn exit_handler() {
    flush_open_tiers(false);
}

/// Flushes every open disk tier within the exit timeout; held-back writes too when `held`.
fn flush_open_tiers(held: bool) {
    // Once: the exit handler after the main thread's teardown finds nothing more to do, and
    // would count again what the first could not write.
    static FLUSHED: AtomicBool = AtomicBool::new(false);
    if FLUSHED.swap(true, Ordering::AcqRel) {
        return;
    }
    // Nothing may unwind into libc's exit.
    let _ = std::panic::catch_unwind(|| {
        let timeout = exit_timeout();
        // A timeout too large to add means no deadline.
        let deadline = Instant::now().checked_add(timeout);
        let tiers: Vec<Arc<Inner>> = match deadline {
            Some(deadline) => OPEN.try_lock_until(deadline),
            None => Some(OPEN.lock()),
        }
        .map(|open| open.iter().filter_map(Weak::upgrade).collect())
        .unwrap_or_default();
        for inner in tiers {
            flush(&inner, deadline, timeout, held);
        }
    });
}

/// Flushes `inner` by `deadline`; counts and logs what was left.
fn flush(inner: &Inner, deadline: Option<Instant>, timeout: Duration, held: bool) {
    let finished = inner.writer.flush_until(deadline, held);
    let left = inner.writer.pending();
    if !finished || left > 0 {
        bump(&inner.counters.failed_writes, left);
        log::log(Level::Warn, || {
            format!(
                "exit: {left} background write(s) to {} not done ({}): the next process \
                 builds those kernels again",
                inner.path.display(),
                if finished {
                    "held back, and exit was called off the main thread".to_owned()
                } else {
                    format!("KCACHE_EXIT_TIMEOUT of {} s reached", timeout.as_secs_f64())
                }
            )
        });
    }
    shards::persist(inner);
}

/// `KCACHE_EXIT_TIMEOUT` in seconds (decimals allowed; however large, it means "as long as
/// it takes"); unset or invalid: [`DEFAULT_EXIT_TIMEOUT`], the latter with one warning.
fn exit_timeout() -> Duration {
    let Some(text) = crate::env::var_os("KCACHE_EXIT_TIMEOUT").filter(|v| !v.is_empty()) else {
        return DEFAULT_EXIT_TIMEOUT;
    };
    parse_timeout(&text.to_string_lossy()).unwrap_or_else(|| {
        log::warn_once(Warning::ExitTimeout, || {
            format!(
                "KCACHE_EXIT_TIMEOUT={text:?} is not a number of seconds: the default ({} s) \
                 is used",
                DEFAULT_EXIT_TIMEOUT.as_secs()
            )
        });
        DEFAULT_EXIT_TIMEOUT
    })
}

fn parse_timeout(text: &str) -> Option<Duration> {
    let seconds = text.trim().parse::<f64>().ok().filter(|s| *s >= 0.0)?;
    Some(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_as_seconds_and_saturate() {
        assert_eq!(parse_timeout("2.5"), Some(Duration::from_millis(2500)));
        assert_eq!(parse_timeout(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse_timeout("1e30"), Some(Duration::MAX));
        assert_eq!(parse_timeout("inf"), Some(Duration::MAX));
        assert_eq!(parse_timeout("-1"), None);
        assert_eq!(parse_timeout("NaN"), None);
        assert_eq!(parse_timeout("soon"), None);
    }
}
