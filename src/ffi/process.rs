//! What libc says about the process's life, for the parts of kcache that must follow it: the
//! secure-execution flag, forks and normal exit. These libc calls have no safe wrapper in the
//! crates kcache uses, so their `unsafe` lives here, beside the rest of kcache's foreign calls.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};

/// Whether the kernel started this process in secure-execution mode (setuid, setgid, file
/// capabilities, or a security module's say): `AT_SECURE` from the auxiliary vector.
///
/// `getauxval` reads the vector the kernel handed the process at `execve`, so the answer needs
/// no `/proc` access: a process that dropped its privileges or made itself non-dumpable, and so
/// can no longer read `/proc/self/auxv`, still gets the truth.
pub(crate) fn at_secure() -> bool {
    // SAFETY: getauxval takes any type and returns 0 (setting errno) for one it does not know;
    // it reads memory libc set up before main and never writes.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Forks this process's line has gone through since kcache first asked: 0 in the process that
/// first called, one more in each forked child. State that a child must not share with its
/// parent (a background thread, held locks, queued work) records the generation it was made in
/// and starts afresh when it differs.
pub(crate) fn fork_generation() -> u64 {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    once_without_waiting(&REGISTERED, || on_fork_child(count_fork));
    FORKS.load(Ordering::Acquire)
}

/// Runs `first` on the first call with `flag`, and returns at once from every other call, even
/// one made while that first call still runs. A `Once` makes the others wait, and a thread of a
/// forked child that waits for a `Once` its parent's thread was running at the fork waits
/// forever (seen: a child's first lock file, waiting for the registration of the hook that
/// closes inherited ones). For process-wide registrations whose absence for a moment is the
/// state before kcache made them.
pub(crate) fn once_without_waiting(flag: &AtomicBool, first: impl FnOnce()) {
    if !flag.load(Ordering::Acquire) && !flag.swap(true, Ordering::AcqRel) {
        first();
    }
}

static FORKS: AtomicU64 = AtomicU64::new(0);

/// Runs in the child right after `fork`, where only async-signal-safe work is allowed: an
/// atomic add is.
extern "C" fn count_fork() {
    FORKS.fetch_add(1, Ordering::AcqRel);
}

/// A section of work that a fork does not cut in two: while any is open, `fork` (in its
/// `pthread_atfork` prepare step) waits for it to end, and none starts until the fork is done.
/// For the few short sections that hold a lock a forked child needs too (the disk tier's
/// index): a child would otherwise inherit that lock held by a thread it does not have.
/// Sections must not nest, nor call code that may fork.
pub(crate) fn unforked() -> Unforked {
    watch_forks();
    Unforked {
        _open: SECTIONS.read().unwrap_or_else(PoisonError::into_inner),
    }
}

/// An open [`unforked`] section, closed when dropped.
pub(crate) struct Unforked {
    _open: RwLockReadGuard<'static, ()>,
}

/// Something that holds locks a forked child needs, taken on paths too hot for an
/// [`unforked`] section (the memory tier's hit path takes its shard's lock): the prepare step
/// of every fork takes them all, as malloc does with its arenas, so that the child never finds
/// one held by a thread it does not have. The parent and the child release them after the
/// fork. The locks must be the standard library's (parking_lot's wait in a table the whole
/// process shares, which a fork can leave locked).
pub(crate) trait ForkLocked: Send + Sync {
    /// Takes every such lock, in the order its other users take them, and returns the guards.
    /// Whoever holds one of them must not wait for an [`unforked`] section meanwhile.
    fn lock_for_fork(&self) -> Box<dyn Held + '_>;
}

/// Guards held across a fork.
pub(crate) trait Held {}

impl<T> Held for T {}

/// Has every fork take the locks of `locked` (see [`ForkLocked`]) for as long as it lives.
pub(crate) fn lock_at_forks(locked: Weak<dyn ForkLocked>) {
    watch_forks();
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    registered.retain(|known| known.strong_count() > 0);
    registered.push(locked);
}

/// Registers the prepare, parent and child steps that close the sections and take the
/// registered locks, once.
fn watch_forks() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    once_without_waiting(&REGISTERED, || {
        // SAFETY: the three handlers are 'static functions; they run on the forking thread,
        // and only take or release `SECTIONS` and the registered locks (the prepare step
        // before the fork, where any work is allowed; the others release what it took).
        let rc = unsafe {
            libc::pthread_atfork(
                Some(close_sections),
                Some(reopen_sections),
                Some(reopen_sections),
            )
        };
        // ENOMEM: a fork may then cut a section, as before kcache watched forks.
        debug_assert_eq!(rc, 0, "pthread_atfork failed");
    });
}

/// The standard library's lock, which waits on its own memory: parking_lot's would wait in a
/// table the whole process shares, which a fork can leave locked in the child.
static SECTIONS: RwLock<()> = RwLock::new(());

/// Whatever [`lock_at_forks`] registered.
static REGISTERED: Mutex<Vec<Weak<dyn ForkLocked>>> = Mutex::new(Vec::new());

/// What the forking thread holds from the prepare step to the end of the fork. Fields drop in
/// order: each object's guards before the object, the registry, then the sections.
struct Closed {
    _held: Vec<HeldLocks>,
    _registered: MutexGuard<'static, Vec<Weak<dyn ForkLocked>>>,
    _sections: RwLockWriteGuard<'static, ()>,
}

/// One registered object's guards, and the object, kept alive while they borrow it.
struct HeldLocks {
    _guards: Box<dyn Held>,
    _owner: Arc<dyn ForkLocked>,
}

thread_local! {
    static CLOSED: RefCell<Option<Closed>> = const { RefCell::new(None) };
}

extern "C" fn close_sections() {
    let sections = SECTIONS.write().unwrap_or_else(PoisonError::into_inner);
    let registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    let held = registered
        .iter()
        .filter_map(Weak::upgrade)
        .map(|owner| {
            let guards = owner.lock_for_fork();
            // SAFETY: only the lifetime changes. The guards borrow the object `owner` points
            // to, which does not move and lives while `owner` does; `HeldLocks` keeps `owner`
            // and drops the guards first.
            let guards =
                unsafe { std::mem::transmute::<Box<dyn Held + '_>, Box<dyn Held>>(guards) };
            HeldLocks {
                _guards: guards,
                _owner: owner,
            }
        })
        .collect();
    let closed = Closed {
        _held: held,
        _registered: registered,
        _sections: sections,
    };
    CLOSED.with(|slot| *slot.borrow_mut() = Some(closed));
}

/// In the parent and in the child. Threads that waited meanwhile to open a section or take a
/// lock are not in the child: waking them there is a wake-up nobody receives.
extern "C" fn reopen_sections() {
    CLOSED.with(|slot| drop(slot.borrow_mut().take()));
}

/// Registers `hook` to run in every child right after `fork`, before `fork` returns there.
/// The hook runs while only the forking thread exists and other threads' locks may be held
/// forever: it must do async-signal-safe work only (atomics, `close`), never lock or allocate.
/// Call it once per hook (each call adds a registration).
pub(crate) fn on_fork_child(hook: extern "C" fn()) {
    // SAFETY: pthread_atfork stores the function pointers, which are 'static; the hook's
    // contract (async-signal-safe work only) is stated above for every caller.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(hook)) };
    // ENOMEM is the one failure: the child then keeps the parent's state, as it did before
    // kcache watched forks; nothing more can be done without memory.
    debug_assert_eq!(rc, 0, "pthread_atfork failed");
}

/// Whether the calling thread is the process's main thread (its thread id is the process id):
/// the thread whose return from `main` ends the process.
pub(crate) fn is_main_thread() -> bool {
    // SAFETY: gettid takes nothing and cannot fail.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).is_ok_and(|tid| tid == std::process::id())
}

/// Registers `hook` to run at normal process exit (`exit`, a return from `main`), before
/// shared libraries' destructors. Hooks run in the reverse order of registration. Returns
/// whether libc took it.
pub(crate) fn at_exit(hook: extern "C" fn()) -> bool {
    // SAFETY: atexit stores a 'static function pointer and calls it at most once, at exit.
    unsafe { libc::atexit(hook) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_test_process_is_not_secure() {
        assert!(!at_secure());
    }

    #[test]
    fn only_the_main_thread_is_the_main_thread() {
        // The test harness runs tests on threads of its own.
        let here = is_main_thread();
        let spawned = std::thread::spawn(is_main_thread).join().unwrap();
        assert!(!spawned);
        assert_eq!(here, std::thread::current().name() == Some("main"));
    }

    #[test]
    fn a_forked_child_sees_the_next_generation() {
        let before = fork_generation();
        // SAFETY: the child only reads an atomic and _exits, which is async-signal-safe.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = (fork_generation() - before) as i32;
            // SAFETY: ends the child at once, without the test harness's exit path.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above; `status` is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            1,
            "the child is one fork further"
        );
        assert_eq!(fork_generation(), before, "the parent is unchanged");
    }

    #[test]
    fn a_call_made_while_the_first_runs_returns_without_running_or_waiting() {
        static FLAG: AtomicBool = AtomicBool::new(false);
        let (running, first_runs) = std::sync::mpsc::channel();
        let (finish, may_finish) = std::sync::mpsc::channel::<()>();
        let first = std::thread::spawn(move || {
            let mut ran = false;
            once_without_waiting(&FLAG, || {
                ran = true;
                running.send(()).unwrap();
                may_finish.recv().unwrap();
            });
            ran
        });
        first_runs.recv().unwrap();
        // The first call is still inside: a `Once` would block here (and the test hang).
        let mut ran_again = false;
        once_without_waiting(&FLAG, || ran_again = true);
        assert!(!ran_again);
        finish.send(()).unwrap();
        assert!(first.join().unwrap());
        once_without_waiting(&FLAG, || ran_again = true);
        assert!(!ran_again);
    }
}
