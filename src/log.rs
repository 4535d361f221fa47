//! What kcache says about itself: configuration problems, and, at `debug`, why each miss
//! missed.
//!
//! Messages go to stderr (`kcache: <message>`, with `info: ` or `debug: ` before the message at
//! those levels), or to the process's hook ([`set_hook`](crate::log::set_hook);
//! `kc_set_log_callback` in C) when one is set. Which levels are written is decided by
//! `KCACHE_LOG=error|warn|info|debug` (default `warn`), read once per process, or by
//! [`set_level`](crate::log::set_level). Deciding that a message is not written costs one
//! relaxed atomic load and builds no text: every message is a closure run only when its level
//! is on. The memory tier's hit path logs nothing at any level.
//!
//! The hook may be called on any thread, including the disk tier's background writer, and
//! concurrently. A panic in it is caught and dropped, so that it cannot take a lookup or the
//! writer down; a message logged from inside the hook (a hook that calls kcache) goes to
//! stderr instead of recursing. Replacing the hook waits for the calls of the previous one
//! that are running: once [`set_hook`](crate::log::set_hook) or
//! [`reset_hook`](crate::log::reset_hook) returns, the previous hook is never called again, so
//! whatever it refers to may go.

use std::cell::Cell;
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// How much a message matters, from `Error` (least verbose) to `Debug`. A threshold lets
/// through its own level and those before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// kcache cannot do what it was asked.
    Error,
    /// A configuration problem: a setting is ignored or a tier is off. Each kind once per
    /// process.
    Warn,
    /// Something an operator may want to know that is not a configuration problem: a build or
    /// a background write failed.
    Info,
    /// Why each miss missed, where, and the cross-process waits.
    Debug,
}

impl Level {
    /// The name `KCACHE_LOG` takes for this level.
    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    /// The level `KCACHE_LOG` names (any case), if any.
    pub fn parse(name: &str) -> Option<Level> {
        [Level::Error, Level::Warn, Level::Info, Level::Debug]
            .into_iter()
            .find(|level| name.eq_ignore_ascii_case(level.name()))
    }

    fn from_u8(raw: u8) -> Level {
        match raw {
            0 => Level::Error,
            1 => Level::Warn,
            2 => Level::Info,
            _ => Level::Debug,
        }
    }
}

/// The threshold before `KCACHE_LOG` has been read: above every level, so that the first
/// check of each level takes the slow path that reads it.
const UNREAD: u8 = u8::MAX;

static THRESHOLD: AtomicU8 = AtomicU8::new(UNREAD);

/// A process's receiver of messages.
pub type Hook = dyn Fn(Level, &str) + Send + Sync;

/// Read-locked while the hook runs, so that replacing it waits for its running calls.
static HOOK: RwLock<Option<Box<Hook>>> = RwLock::new(None);

thread_local! {
    /// Whether this thread is inside the hook, whose own messages then go to stderr.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Sends every message from now on to `hook` instead of stderr, until [`reset_hook`] or the
/// next `set_hook`. Messages are filtered by the level first ([`set_level`]). Called from inside
/// the hook, it does nothing (it would wait for itself).
pub fn set_hook(hook: impl Fn(Level, &str) + Send + Sync + 'static) {
    replace_hook(Some(Box::new(hook)));
}

/// Sends messages to stderr again, once the running calls of the hook have returned. Called
/// from inside the hook, it does nothing.
pub fn reset_hook() {
    replace_hook(None);
}

fn replace_hook(hook: Option<Box<Hook>>) {
    if !IN_HOOK.get() {
        *HOOK.write().unwrap_or_else(|e| e.into_inner()) = hook;
    }
}

/// Writes messages of `level` and before from now on, whatever `KCACHE_LOG` says.
pub fn set_level(level: Level) {
    THRESHOLD.store(level as u8, Ordering::Relaxed);
}

/// The levels written now: [`set_level`]'s, else `KCACHE_LOG`'s, else `warn`.
pub fn level() -> Level {
    Level::from_u8(threshold())
}

fn threshold() -> u8 {
    match THRESHOLD.load(Ordering::Relaxed) {
        UNREAD => read_env(),
        threshold => threshold,
    }
}

/// Reads `KCACHE_LOG` (absent in a secure-execution process, see [`crate::env`]) into the
/// threshold, unless [`set_level`] set one meanwhile; an invalid value is warned about once.
#[cold]
fn read_env() -> u8 {
    let value = crate::env::var_os("KCACHE_LOG").filter(|v| !v.is_empty());
    let parsed = value
        .as_ref()
        .map(|v| v.to_str().and_then(Level::parse).ok_or(v));
    let level = match parsed {
        Some(Ok(level)) => level,
        None | Some(Err(_)) => Level::Warn,
    };
    // The threshold is in place before the warning, which checks it.
    let threshold =
        match THRESHOLD.compare_exchange(UNREAD, level as u8, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => level as u8,
            Err(set) => set,
        };
    if let Some(Err(value)) = parsed {
        warn_once(Warning::LogLevel, || {
            format!("KCACHE_LOG={value:?} is not error, warn, info or debug: warn is used")
        });
    }
    threshold
}

/// Whether messages of `level` are written: one relaxed load once `KCACHE_LOG` has been read.
#[inline]
pub(crate) fn enabled(level: Level) -> bool {
    let threshold = THRESHOLD.load(Ordering::Relaxed);
    (level as u8) <= threshold && (threshold != UNREAD || level as u8 <= read_env())
}

/// Writes the message `message` makes, if `level` is on; `message` runs only then.
#[inline]
pub(crate) fn log(level: Level, message: impl FnOnce() -> String) {
    if enabled(level) {
        emit(level, &message());
    }
}

/// [`log`] at [`Level::Debug`]: the reasons of misses.
#[inline]
pub(crate) fn debug(message: impl FnOnce() -> String) {
    log(Level::Debug, message);
}

/// [`log`] at [`Level::Info`].
#[inline]
pub(crate) fn info(message: impl FnOnce() -> String) {
    log(Level::Info, message);
}

#[cold]
fn emit(level: Level, message: &str) {
    if !IN_HOOK.get() {
        let hook = HOOK.read().unwrap_or_else(|e| e.into_inner());
        if let Some(hook) = hook.as_ref() {
            IN_HOOK.set(true);
            // A hook that panics loses its message only.
            let _ = catch_unwind(AssertUnwindSafe(|| hook(level, message)));
            IN_HOOK.set(false);
            return;
        }
    }
    let tag = match level {
        Level::Error | Level::Warn => "",
        Level::Info => "info: ",
        Level::Debug => "debug: ",
    };
    // Nothing to do about a stderr that cannot be written.
    let _ = writeln!(std::io::stderr().lock(), "kcache: {tag}{message}");
}

/// What a warning is about. Each kind is written at most once per process: the cache keeps
/// working (from memory, or without the ignored setting), so repeating it would only be noise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Warning {
    /// The cache directory is not private to the effective user: the disk tier is off.
    UntrustedDirectory,
    /// An operator key is required and none is configured: the disk tier is off.
    KeyRequired,
    /// `KCACHE_DIR` is a relative path: ignored.
    RelativeDir,
    /// `KCACHE_MAX_SIZE` is not a size: the disk tier is off.
    MaxSize,
    /// `KCACHE_MAX_FILES` is not a number: the disk tier is off.
    MaxFiles,
    /// The directory's settings file, or some of its lines, cannot be used: ignored.
    Settings,
    /// `KCACHE_KEY_FILE` is empty, relative, missing or unusable: the disk tier is off.
    KeyFile,
    /// `KCACHE_REQUIRE_KEY` is neither `0` nor `1`: taken as `1`.
    RequireKey,
    /// `KCACHE_LOCK_TIMEOUT` is not a number of seconds: the default is used.
    LockTimeout,
    /// `KCACHE_LOCK_LIVENESS` is not a number of seconds: the default is used.
    LockLiveness,
    /// The cache directory's filesystem cannot lock: processes may build the same kernel.
    NoLocks,
    /// A build from source reads what kcache cannot key: compiled and not cached.
    PassedThrough,
    /// A remote tier setting cannot be used: the remote tier is off.
    RemoteConfig,
    /// A remote tier duration is not a number: its default is used.
    #[cfg_attr(
        not(feature = "remote"),
        allow(dead_code, reason = "only the remote tier uses it")
    )]
    RemoteWait,
    /// A remote tier is configured without an operator key or the unkeyed opt-in: it is off.
    #[cfg_attr(
        not(feature = "remote"),
        allow(dead_code, reason = "only the remote tier uses it")
    )]
    RemoteUnkeyed,
    /// An object-store tier setting cannot be used: the object-store tier is off.
    ObjectStoreConfig,
    /// An object-store tier duration is not a number: its default is used.
    #[cfg_attr(
        not(feature = "object-store"),
        allow(dead_code, reason = "only the object-store tier uses it")
    )]
    ObjectStoreWait,
    /// An object store is configured without an operator key or the unkeyed opt-in: it is off.
    #[cfg_attr(
        not(feature = "object-store"),
        allow(dead_code, reason = "only the object-store tier uses it")
    )]
    ObjectStoreUnkeyed,
    /// The object store ignores conditional writes: its leases are not used.
    #[cfg_attr(
        not(feature = "object-store"),
        allow(dead_code, reason = "only the object-store tier uses it")
    )]
    ObjectStoreUnconditional,
    /// `KCACHE_EXIT_TIMEOUT` is not a number of seconds: the default is used.
    ExitTimeout,
    /// The cache directory cannot be written (full, read-only, ...): nothing is cached in it.
    CannotWrite,
    /// `KCACHE_STORE_ORDER` or `KCACHE_STORE_BACKFILL` cannot be used: the default is.
    StoreChain,
    /// `KCACHE_LOG` names no level: `warn` is used.
    LogLevel,
}

const WARNING_KINDS: usize = Warning::LogLevel as usize + 1;

/// Logs the message at [`Level::Warn`], unless a warning of this kind was logged already.
pub(crate) fn warn_once(kind: Warning, message: impl FnOnce() -> String) {
    static WARNED: [AtomicBool; WARNING_KINDS] = [const { AtomicBool::new(false) }; WARNING_KINDS];
    if enabled(Level::Warn) && !WARNED[kind as usize].swap(true, Ordering::Relaxed) {
        emit(Level::Warn, &message());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_by_name_in_any_case_and_are_ordered() {
        for level in [Level::Error, Level::Warn, Level::Info, Level::Debug] {
            assert_eq!(Level::parse(level.name()), Some(level));
            assert_eq!(Level::parse(&level.name().to_uppercase()), Some(level));
            assert_eq!(Level::from_u8(level as u8), level);
        }
        assert_eq!(Level::parse("verbose"), None);
        assert_eq!(Level::parse(""), None);
        assert!(Level::Error < Level::Warn && Level::Info < Level::Debug);
    }
}
