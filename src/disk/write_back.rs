//! Writing a built value's entry after its caller has it, and releasing the entry's lock once
//! it is published.
//!
//! Most values' bytes are made and written as soon as the background writer gets to them. A
//! backend whose bytes are costly to make, and better for waiting, holds them back
//! ([`DiskBytes::held`]): the entry is written when another process waits for it (the lock's
//! wanted mark, or another node's mark on a shared store's lease), else at the next flush,
//! which is when the process frees its cache or exits at the latest (see `exit`). A lone
//! process then pays for its bytes once, at flush, instead of beside the caller's next work; a
//! process that waits gets them within the writer's poll interval.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::writer::Cause;
use super::{Descriptor, Disk, Entry, Inner, KeyLock, bump, store};
use crate::error::BuildError;
use crate::key::Key;
use crate::log;

type Maker = Box<dyn FnOnce() -> Result<Vec<u8>, BuildError> + Send>;

/// What the disk tier keeps of a built value: bytes made already, or functions the background
/// writer runs to make them (a driver's binary query can cost more than the build, and nobody
/// waits for it there).
pub struct DiskBytes(Making);

enum Making {
    /// Made and written as soon as the writer gets to it.
    Now(Maker),
    /// Made and written when wanted or at flush, see [`DiskBytes::held`].
    Held { wanted: Maker, settled: Maker },
}

impl DiskBytes {
    /// Bytes made on the background writer by `make`.
    pub fn later(make: impl FnOnce() -> Result<Vec<u8>, BuildError> + Send + 'static) -> Self {
        DiskBytes(Making::Now(Box::new(make)))
    }

    /// Bytes held back, for a driver whose bytes are better made late (PoCL's binary carries
    /// the code the program's launches compiled) and would slow the caller's next work down
    /// if made now (PoCL's binary query compiles): made on the background writer by `wanted`
    /// when another process waits for the entry, or else by `settled` at the next flush. After
    /// `wanted`, `settled` still runs at the next flush, and its bytes replace the entry when
    /// they are larger.
    pub fn held(
        wanted: impl FnOnce() -> Result<Vec<u8>, BuildError> + Send + 'static,
        settled: impl FnOnce() -> Result<Vec<u8>, BuildError> + Send + 'static,
    ) -> Self {
        DiskBytes(Making::Held {
            wanted: Box::new(wanted),
            settled: Box::new(settled),
        })
    }
}

impl From<Vec<u8>> for DiskBytes {
    fn from(bytes: Vec<u8>) -> Self {
        DiskBytes::later(move || Ok(bytes))
    }
}

impl Disk {
    /// Writes the entry for `key`, described by `descriptor`, from `bytes` on the background
    /// writer, then releases `lock`; `done` learns whether it was written. Bytes held back
    /// ([`DiskBytes::held`]) are made as wanted when a process waits on `lock`, or when
    /// `wanted_elsewhere` is set (another node waits on a shared store's lease). A failure is counted in
    /// `failed_writes` and marked on the lock, so that waiting processes build rather than
    /// wait for an entry that will not come.
    pub(crate) fn write_back(
        &self,
        (key, build_time, descriptor): (Key, Duration, Descriptor),
        lock: Option<KeyLock>,
        bytes: DiskBytes,
        wanted_elsewhere: Option<Arc<AtomicBool>>,
        done: impl FnOnce(bool) + Send + 'static,
    ) {
        let inner = Arc::clone(&self.inner);
        let (wanted, settled) = match bytes.0 {
            Making::Now(make) => {
                return self.inner.writer.submit(move || {
                    done(publish(&inner, &key, &descriptor, make, build_time, lock));
                });
            }
            Making::Held { wanted, settled } => (wanted, settled),
        };
        let job = move |cause, lock: Option<KeyLock>| {
            if cause == Cause::Flush {
                return done(publish(
                    &inner,
                    &key,
                    &descriptor,
                    settled,
                    build_time,
                    lock,
                ));
            }
            let written = publish(&inner, &key, &descriptor, wanted, build_time, lock);
            done(written);
            if written {
                let writer = Arc::clone(&inner);
                writer.writer.park(None, move |_| {
                    grow(&inner, &key, &descriptor, settled, build_time)
                });
            }
        };
        // The poll owns the lock and reads its mark; the write takes it from the poll (which
        // the writer drops after the write), and releases it once the entry is published. A
        // writer with too many polls drops this one before the write: the lock is released
        // then, and the write, at the flush, has none.
        let lock = lock.map(|lock| Arc::new(Mutex::new(Some(lock))));
        let taken = lock.as_ref().map(Arc::downgrade);
        let poll = (lock.is_some() || wanted_elsewhere.is_some()).then(|| {
            Box::new(move || {
                wanted_elsewhere
                    .as_ref()
                    .is_some_and(|w| w.load(Ordering::Relaxed))
                    || lock
                        .as_ref()
                        .is_some_and(|l| locked(l).as_ref().is_some_and(KeyLock::wanted))
            }) as Box<dyn Fn() -> bool + Send>
        });
        self.inner.writer.park(poll, move |cause| {
            let lock = taken
                .and_then(|lock| lock.upgrade())
                .and_then(|lock| locked(&lock).take());
            job(cause, lock)
        });
    }
}

impl Disk {
    /// Writes `entry`, verified from a store behind this tier, on the background writer, so
    /// that the next process of this node reads it here, then releases `lock` (the processes
    /// of this node waiting for it then read the entry).
    pub(crate) fn copy_in(&self, key: &Key, entry: Entry, lock: Option<KeyLock>) {
        let inner = Arc::clone(&self.inner);
        let key = *key;
        self.inner.writer.submit(move || {
            let descriptor = entry.descriptor().cloned().unwrap_or_default();
            let written = store::put(
                &inner,
                &key,
                entry.payload(),
                entry.build_time(),
                &descriptor,
            );
            if let Err(e) = written {
                log::info(|| format!("disk copy of a stored entry failed: {e}"));
                if let Some(lock) = &lock {
                    lock.abandon();
                }
            }
            drop(lock);
        });
    }

    /// Runs `job` on the background writer, after the writes submitted before it.
    pub(crate) fn later(&self, job: impl FnOnce() + Send + 'static) {
        self.inner.writer.submit(job);
    }
}

/// The lock a parked write shares with its poll; no code panics while holding it.
fn locked(lock: &Mutex<Option<KeyLock>>) -> MutexGuard<'_, Option<KeyLock>> {
    lock.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes the bytes and writes the entry, then releases `lock`; whether it was written.
fn publish(
    inner: &Arc<Inner>,
    key: &Key,
    descriptor: &Descriptor,
    make: Maker,
    build_time: Duration,
    lock: Option<KeyLock>,
) -> bool {
    let written = make()
        .map_err(|e| format!("the value could not be serialized: {}", e.message))
        .and_then(|bytes| {
            store::put(inner, key, &bytes, build_time, descriptor)
                .map(|()| bytes)
                .map_err(|e| e.to_string())
        });
    match written {
        Ok(bytes) => {
            // Published: processes of this node waiting for it need not wait for the stores
            // behind.
            drop(lock);
            tell_behind(inner, key, &bytes, build_time, descriptor);
            true
        }
        Err(why) => {
            log::info(|| format!("disk write of {} failed: {why}", inner.entry_name(key)));
            bump(&inner.counters.failed_writes, 1);
            if let Some(lock) = &lock {
                lock.abandon();
            }
            false
        }
    }
}

/// Rewrites the entry for `key` with the bytes `make` returns when they are larger than the
/// stored ones. A failure costs only this rewrite: the entry written before stays.
fn grow(inner: &Arc<Inner>, key: &Key, descriptor: &Descriptor, make: Maker, build_time: Duration) {
    let Ok(bytes) = make() else {
        return;
    };
    if bytes.len() as u64 > store::stored_len(inner, key).unwrap_or(0)
        && store::put(inner, key, &bytes, build_time, descriptor).is_ok()
    {
        tell_behind(inner, key, &bytes, build_time, descriptor);
    }
}

/// Tells what sits behind the tier of an entry published for a value built here.
fn tell_behind(inner: &Inner, key: &Key, payload: &[u8], build_time: Duration, d: &Descriptor) {
    if let Some(behind) = inner.behind.get() {
        behind.published(key, payload, build_time, d);
    }
}
