//! The synchronisation primitives of the memory tier, behind one facade so that the model
//! checker (`--features shuttle`) can substitute its own and explore interleavings.

/// A wrapper around the lock type `$inner` whose guard methods take the guard even from a
/// poisoned lock, as parking_lot's mutex (which never poisons) does: a panic while a guard was
/// held (in a caller's `Hash` or `Eq`, say) must not make every later call on that lock panic.
macro_rules! unpoisoned {
    ($(#[$meta:meta])* $name:ident($($inner:ident)::+) { $($method:ident -> $guard:ident),+ }) => {
        $(#[$meta])*
        pub struct $name<T>($($inner)::+<T>);

        impl<T> $name<T> {
            pub fn new(value: T) -> Self {
                Self($($inner)::+::new(value))
            }
            $(
                pub fn $method(&self) -> $guard<'_, T> {
                    self.0
                        .$method()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                }
            )+
        }
    };
}

/// The facade over the implementation `$root` (`std` or `shuttle`): its atomics and threads, its
/// mutex and condition variable, the mutex taking the guard even when poisoned. The caller adds
/// a reader-writer lock.
macro_rules! facade {
    ($root:ident) => {
        pub use $root::sync::MutexGuard;
        pub use $root::sync::atomic::{AtomicBool, AtomicU8, AtomicU64};
        pub use $root::thread::ThreadId;

        pub fn current_thread() -> ThreadId {
            $root::thread::current().id()
        }

        unpoisoned!(
            #[derive(Default)]
            Mutex($root::sync::Mutex) { lock -> MutexGuard }
        );

        #[derive(Default)]
        pub struct Condvar($root::sync::Condvar);

        impl Condvar {
            pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
                self.0
                    .wait(guard)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            }
            pub fn notify_all(&self) {
                self.0.notify_all();
            }
        }
    };
}

// The standard library's mutex waits on its own memory: parking_lot's waits in a table the whole
// process shares, which a fork can leave locked in the child. The shard lock is sharded per
// thread (a hot key's hits write no shared lock word), and fork-safe: see `ffi::sharded_lock`.
#[cfg(not(feature = "shuttle"))]
mod imp {
    pub(crate) use crate::ffi::sharded_lock::ShardedLock as RwLock;
    facade!(std);
}

#[cfg(feature = "shuttle")]
mod imp {
    pub use shuttle::sync::{RwLockReadGuard, RwLockWriteGuard};
    facade!(shuttle);
    unpoisoned!(
        #[derive(Default)]
        RwLock(shuttle::sync::RwLock) { read -> RwLockReadGuard, write -> RwLockWriteGuard }
    );
}

pub(crate) use imp::*;
pub(crate) use std::sync::atomic::Ordering;
