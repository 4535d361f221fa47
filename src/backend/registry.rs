//! Caller-owned handles (an OpenCL (context, device) pair, a CUDA context, a `VkDevice`) under
//! the [`DeviceId`] the memory tier records and evicts their entries by.
//!
//! A handle gets a fresh number each time it is registered: a context that was evicted and is
//! used again, or a new context at a reused address, can never hit the old one's entries.
//!
//! Eviction takes the rows out of the registry first and evicts their numbers second. A lookup
//! racing with it either installs before the memory tier's sweep (and is unlinked by it), or
//! starts its build after the epoch bump, installs, and then finds its row marked evicted in
//! [`Registration::confirm`], which unlinks the entry itself.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::error::{DeviceId, Error, Result};
use crate::ffi::sharded_lock::{ReadGuard, ShardedLock, WriteGuard};
use crate::memory::{Lease, MemoryCache};

/// One registered handle and what the backend learned about it when it was registered.
pub struct Registration<H, T> {
    id: DeviceId,
    handle: H,
    info: T,
    evicted: AtomicBool,
}

impl<H: Copy, T> Registration<H, T> {
    /// The number the memory tier knows this registration by.
    pub fn id(&self) -> DeviceId {
        self.id
    }

    pub fn handle(&self) -> H {
        self.handle
    }

    pub fn info(&self) -> &T {
        &self.info
    }

    /// Whether this registration was evicted (its device unregistered or torn down).
    pub fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Passes a lookup's outcome through unless this registration was evicted meanwhile: then
    /// the eviction may have swept before the entry was installed, so it is unlinked here (and
    /// destroyed with the lease), and the lookup, whatever its outcome, fails with
    /// [`Error::DeviceDestroyed`].
    pub fn confirm<K, V>(
        &self,
        memory: &MemoryCache<K, V>,
        found: Result<Lease<K, V>>,
    ) -> Result<Lease<K, V>>
    where
        K: Hash + Eq,
    {
        if !self.is_evicted() {
            return found;
        }
        if let Ok(lease) = found {
            memory.remove(lease.key())?;
        }
        Err(Error::DeviceDestroyed(self.id))
    }
}

/// The registrations of one backend cache.
pub struct Registry<H, T> {
    /// Read on every lookup, so sharded per thread like the memory tier's own locks.
    rows: ShardedLock<HashMap<H, Arc<Registration<H, T>>>>,
    next_id: AtomicI64,
}

impl<H: Hash + Eq + Copy, T> Default for Registry<H, T> {
    fn default() -> Self {
        Registry {
            rows: ShardedLock::new(HashMap::new()),
            next_id: AtomicI64::new(0),
        }
    }
}

impl<H: Hash + Eq + Copy, T> Registry<H, T> {
    /// The hit path: `probe` looks at `handle`'s registration under the read lock, without
    /// taking a reference to it (which would be one more shared write per lookup); `None` when
    /// `handle` is not registered. Eviction needs the write lock, so the registration `probe`
    /// sees is not evicted while it runs. `probe` must not block.
    pub fn probe<R>(
        &self,
        handle: H,
        probe: impl FnOnce(&Registration<H, T>) -> Option<R>,
    ) -> Option<R> {
        self.read().get(&handle).and_then(|row| probe(row))
    }

    /// The registration of `handle`; on first sight `describe` queries what the backend keeps
    /// about it. `describe` runs outside the lock (it calls into the driver), so two threads
    /// may both run it; one result is kept.
    pub fn get_or_register(
        &self,
        handle: H,
        describe: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<Registration<H, T>>> {
        if let Some(row) = self.read().get(&handle) {
            return Ok(Arc::clone(row));
        }
        let info = describe()?;
        let mut rows = self.write();
        let row = rows.entry(handle).or_insert_with(|| {
            Arc::new(Registration {
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
                handle,
                info,
                evicted: AtomicBool::new(false),
            })
        });
        Ok(Arc::clone(row))
    }

    /// Registers `handle` with `info`, which the caller prepared; `Err(info)` when `handle` is
    /// registered already, handed back untouched for the caller to dispose of.
    pub fn register(&self, handle: H, info: T) -> std::result::Result<Arc<Registration<H, T>>, T> {
        let mut rows = self.write();
        if rows.contains_key(&handle) {
            return Err(info);
        }
        let row = Arc::new(Registration {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            handle,
            info,
            evicted: AtomicBool::new(false),
        });
        rows.insert(handle, Arc::clone(&row));
        Ok(row)
    }

    // The lock is never poisoned: a panic under it leaves the map consistent, as every change
    // is one map call.
    fn read(&self) -> ReadGuard<'_, HashMap<H, Arc<Registration<H, T>>>> {
        self.rows.read()
    }

    fn write(&self) -> WriteGuard<'_, HashMap<H, Arc<Registration<H, T>>>> {
        self.rows.write()
    }

    /// Unregisters every registration `doomed` picks and evicts all their entries from
    /// `memory` in one sweep; see [`MemoryCache::evict_devices`] for what that returns.
    pub fn evict<K, V>(
        &self,
        memory: &MemoryCache<K, V>,
        doomed: impl Fn(&Registration<H, T>) -> bool,
    ) -> Result<usize>
    where
        K: Hash + Eq,
    {
        let taken = self.take(doomed);
        memory.evict_devices(taken.iter().map(|row| row.id))
    }

    /// Unregisters every registration `doomed` picks and returns them, marked evicted, for a
    /// backend that has its own teardown to run before their entries are evicted.
    pub fn take(
        &self,
        doomed: impl Fn(&Registration<H, T>) -> bool,
    ) -> Vec<Arc<Registration<H, T>>> {
        let mut taken = Vec::new();
        self.write().retain(|_, row| {
            if !doomed(row) {
                return true;
            }
            row.evicted.store(true, Ordering::Release);
            taken.push(Arc::clone(row));
            false
        });
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BuildError;
    use crate::memory::Options;

    fn memory() -> MemoryCache<Vec<u8>, u32> {
        MemoryCache::new(Options::default(), |_| Ok(()))
    }

    #[test]
    fn a_handle_registered_twice_hands_the_second_description_back() {
        let registry: Registry<u64, &str> = Registry::default();
        let first = registry.register(7, "first").ok().unwrap();
        assert_eq!(*first.info(), "first");
        assert_eq!(registry.register(7, "second").err(), Some("second"));
    }

    #[test]
    fn a_taken_registration_is_evicted_and_its_lookups_fail_as_device_destroyed() {
        let registry: Registry<u64, ()> = Registry::default();
        let memory = memory();
        let row = registry.get_or_register(1, || Ok(())).unwrap();
        let lease = memory
            .find_or_build(b"k".as_slice(), Some(row.id()), || Ok((1, 1)))
            .unwrap();
        let taken = registry.take(|r| r.handle() == 1);
        assert_eq!(taken.len(), 1);
        assert!(row.is_evicted());
        assert!(registry.probe(1, |_| Some(())).is_none());
        // Installed after the sweep: unlinked by `confirm`.
        assert!(matches!(
            row.confirm(&memory, Ok(lease)),
            Err(Error::DeviceDestroyed(id)) if id == row.id()
        ));
        assert_eq!(memory.len(), 0);
        // A failed build for it says why the lookup failed: the device went away.
        let failed = Err(Error::Build(BuildError::new(0, "unregistered")));
        assert!(matches!(
            row.confirm(&memory, failed),
            Err(Error::DeviceDestroyed(_))
        ));
        // Registered again, the handle gets a fresh number.
        let again = registry.get_or_register(1, || Ok(())).unwrap();
        assert_ne!(again.id(), row.id());
    }
}
