//! A reader-writer lock sharded per thread whose readers never wait on a process-wide lock: the
//! lock of the memory tier's tables (which every fork takes, see `ForkLocked`) and of the
//! backends' registries (written only when a device is registered or evicted, and not taken
//! by a fork: a fork during such a write leaves the registry locked in the child).
//!
//! A plain reader-writer lock makes every reader write its one lock word, and on a shared hot
//! set that cache line then travels between cores on every hit. A sharded lock gives each
//! thread a word of its own: a reader takes the shard of its thread index, a writer every shard
//! in order (misses and evictions only). crossbeam's `ShardedLock` does the same, but hands out
//! its thread indices under one process-wide mutex, taken when a thread first reads and when it
//! exits: a thread of the parent inside that mutex at a fork leaves it locked in the child,
//! whose first read on a thread that had not read yet then waits forever (seen in the
//! hundred-fork test). Here the index is [`crate::thread_index`]'s, taken without a lock,
//! and the shards are the standard library's locks, whose holders' forks the memory tier
//! already waits for (`ForkLocked`). The only `unsafe` is handing out the value the shards
//! guard; it lives here with kcache's other code of the process's life.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::thread_index;

/// Shards per lock; more spread readers wider but make every write take more locks.
const SHARDS: usize = 8;

/// One shard's lock word, alone on its cache lines (two: the adjacent-line prefetcher pairs
/// them).
#[derive(Default)]
#[repr(align(128))]
struct Shard(RwLock<()>);

/// A reader-writer lock over `T` whose readers on different threads write different cache
/// lines. Never poisoned: a panic under a guard leaves the value as the panicking code left it,
/// as parking_lot's lock does.
#[derive(Default)]
pub(crate) struct ShardedLock<T> {
    shards: [Shard; SHARDS],
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&T` to several threads at once and `&mut T` to one: as
// `std::sync::RwLock`, it is `Sync` when `T` may be shared and sent. (`Send` when `T` is
// comes with the fields.)
unsafe impl<T: Send + Sync> Sync for ShardedLock<T> {}

impl<T> ShardedLock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            shards: Default::default(),
            value: UnsafeCell::new(value),
        }
    }

    /// Shared access: the calling thread's shard, read.
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let shard = thread_index::current().unwrap_or(0) % SHARDS;
        ReadGuard {
            _shard: self.shards[shard]
                .0
                .read()
                .unwrap_or_else(PoisonError::into_inner),
            value: &self.value,
        }
    }

    /// Exclusive access: every shard, written, in order (so two writers never deadlock).
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        WriteGuard {
            _shards: std::array::from_fn(|i| {
                self.shards[i]
                    .0
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
            }),
            value: &self.value,
        }
    }
}

/// Shared access to a [`ShardedLock`]'s value.
pub(crate) struct ReadGuard<'a, T> {
    _shard: RwLockReadGuard<'a, ()>,
    value: &'a UnsafeCell<T>,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds a shard for reading, and a `&mut T` exists only in a
        // `WriteGuard`, which holds every shard for writing: none exists while this guard does.
        unsafe { &*self.value.get() }
    }
}

/// Exclusive access to a [`ShardedLock`]'s value.
pub(crate) struct WriteGuard<'a, T> {
    _shards: [RwLockWriteGuard<'a, ()>; SHARDS],
    value: &'a UnsafeCell<T>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds every shard for writing: no other guard exists.
        unsafe { &*self.value.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds every shard for writing, so no other guard, reading or
        // writing, exists; `&mut self` makes this borrow the only one through this guard.
        unsafe { &mut *self.value.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_see_every_write_and_writers_exclude_each_other() {
        let lock = Arc::new(ShardedLock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        {
                            let mut w = lock.write();
                            w.0 += 1;
                            w.1 += 1;
                        }
                        let r = lock.read();
                        assert_eq!(r.0, r.1, "a reader saw half a write");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.read(), (8000, 8000));
    }

    #[test]
    fn a_panic_under_the_write_guard_leaves_the_lock_usable() {
        let lock = Arc::new(ShardedLock::new(1));
        let panicked = std::thread::spawn({
            let lock = Arc::clone(&lock);
            move || {
                let mut w = lock.write();
                *w = 2;
                panic!("under the guard");
            }
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(*lock.read(), 2);
        *lock.write() = 3;
        assert_eq!(*lock.read(), 3);
    }
}
