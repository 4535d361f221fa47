//! Taking entries out of a memory tier: one key, a device's, all of them, or what a cap
//! evicts. Entries are unlinked under their shard's lock and destroyed after it, unless leased.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use super::MemoryCache;
use super::entry::Entry;
use super::shared::{Building, Slot, bump};
use super::sync::Ordering;
use crate::{DeviceId, Error, Result};

/// Unlinked entries waiting for their destroy, which must happen outside every lock.
type Victims<K, V> = Vec<Arc<Entry<K, V>>>;

impl<K: Hash + Eq, V> MemoryCache<K, V> {
    /// Unlinks the ready entry for `key`. Its value is destroyed now if no lease holds it,
    /// else when the last lease goes. Returns whether an entry was unlinked; a key still being
    /// built is not affected. A failing destroy is returned as [`Error::Destroy`].
    pub fn remove<Q>(&self, key: &Q) -> Result<bool>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut table = self.shared.shard_of(hash).table.write();
        let Ok(found) = table.find_entry(hash, |slot| {
            matches!(slot, Slot::Ready(_)) && slot.key().borrow() == key
        }) else {
            return Ok(false);
        };
        let (Slot::Ready(entry), _) = found.remove() else {
            unreachable!("only ready slots match");
        };
        self.unlinked(&entry);
        drop(table);
        destroy_all(vec![entry]).map(|_| true)
    }

    /// Unlinks every entry recorded for `device` and bumps its eviction epoch, so that builds
    /// for it already in flight are discarded. Values are destroyed now unless leased. Every
    /// victim is attempted; the first destroy failure is returned. Returns the unlinked count.
    pub fn evict_device(&self, device: DeviceId) -> Result<usize> {
        self.evict_devices([device])
    }

    /// [`MemoryCache::evict_device`] for several devices at once: every epoch is bumped before
    /// one sweep over the shards unlinks the entries of all of them. Every victim is attempted;
    /// the first destroy failure is returned. Returns the unlinked count.
    pub fn evict_devices(&self, devices: impl IntoIterator<Item = DeviceId>) -> Result<usize> {
        let mut devices: Vec<DeviceId> = devices.into_iter().collect();
        devices.sort_unstable();
        devices.dedup();
        if devices.is_empty() {
            return Ok(0);
        }
        // The epochs the devices move to: a build whose builder saw an older one is doomed.
        let bumped: Vec<(DeviceId, u64)> = {
            let mut epochs = self.shared.epochs.lock();
            devices
                .iter()
                .map(|&device| {
                    let epoch = epochs.entry(device).or_insert(0);
                    *epoch += 1;
                    (device, *epoch)
                })
                .collect()
        };
        let listed = |device: DeviceId| devices.binary_search(&device).is_ok();
        let victims = self.unlink_where(
            |entry| entry.devices().iter().any(|&d| listed(d)),
            |building| {
                building
                    .snapshot
                    .device_epoch
                    .is_some_and(|(device, seen)| {
                        bumped
                            .binary_search_by_key(&device, |&(d, _)| d)
                            .is_ok_and(|i| seen < bumped[i].1)
                    })
            },
        );
        self.shared
            .counters
            .device_evictions
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        destroy_all(victims)
    }

    /// Unlinks every entry and bumps the cache generation. Values are destroyed now unless
    /// leased. Every victim is attempted; the first destroy failure is returned. Returns the
    /// unlinked count.
    pub fn clear(&self) -> Result<usize> {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        bump(&self.shared.counters.clears);
        let victims = self.unlink_where(
            |_| true,
            |building| self.invalidated_by_clear && building.snapshot.generation < generation,
        );
        self.shared.clock.lock().clear();
        destroy_all(victims)
    }

    fn over_cap(&self, entries: u64, weight: u64) -> bool {
        self.max_entries.is_some_and(|max| entries > max)
            || self.max_weight.is_some_and(|max| weight > max)
    }

    pub(super) fn enforce_caps(&self, newest: &Arc<Entry<K, V>>, entries: u64, weight: u64) {
        let sweep = self
            .shared
            .clock
            .lock()
            .admit(newest, entries, weight, |e, w| self.over_cap(e, w));
        drop(sweep.touched);
        let mut unlinked = Vec::with_capacity(sweep.victims.len());
        for victim in sweep.victims {
            let mut table = self.shared.shard_of(victim.hash).table.write();
            // Someone else (clear, remove, another sweep) may have unlinked it meanwhile.
            if let Ok(found) = table.find_entry(
                victim.hash,
                |slot| matches!(slot, Slot::Ready(e) if Arc::ptr_eq(e, &victim)),
            ) {
                let removed = found.remove().0;
                self.unlinked(&victim);
                drop(table);
                drop(removed);
                unlinked.push(victim);
            }
        }
        self.shared
            .counters
            .capacity_evictions
            .fetch_add(unlinked.len() as u64, Ordering::Relaxed);
        // No caller to return to: every failure goes to the hook (`destroy_all` keeps only the
        // first).
        for victim in unlinked {
            if let Some(Err(e)) = Arc::into_inner(victim).map(Entry::destroy_now) {
                self.shared.report_destroy_error(&e);
            }
        }
    }

    /// Bookkeeping for an entry just removed from the table.
    fn unlinked(&self, entry: &Arc<Entry<K, V>>) {
        entry.linked.store(false, Ordering::Release);
        self.shared.detach(entry);
        let c = &self.shared.counters;
        c.entries.fetch_sub(1, Ordering::Relaxed);
        c.weight.fetch_sub(entry.weight(), Ordering::Relaxed);
    }

    /// Unlinks the entries `doomed` picks and detaches the builds in flight `doomed_build`
    /// picks, which must be builds that started before the bump of their device's epoch or of
    /// the generation the caller made: those are discarded when they end, and a lookup that starts after this returns builds anew
    /// instead of joining one.
    fn unlink_where(
        &self,
        doomed: impl Fn(&Entry<K, V>) -> bool,
        doomed_build: impl Fn(&Building<K, V>) -> bool,
    ) -> Victims<K, V> {
        let mut victims = Vec::new();
        let mut detached = Vec::new();
        for shard in self.shared.shards.iter() {
            let mut table = shard.table.write();
            // Moved out whole, so that no entry or key is dropped here, under the lock.
            for slot in table.extract_if(|slot| match slot {
                Slot::Ready(entry) => doomed(entry),
                Slot::Building(building) => doomed_build(building),
            }) {
                match slot {
                    Slot::Ready(entry) => victims.push(entry),
                    Slot::Building(building) => detached.push(building),
                }
            }
            drop(table);
        }
        drop(detached);
        for victim in &victims {
            self.unlinked(victim);
        }
        victims
    }
}

/// Destroys each victim that no lease holds; leased ones are destroyed by their last release.
/// Returns how many were given, or the first destroy failure after attempting all.
fn destroy_all<K, V>(victims: Victims<K, V>) -> Result<usize> {
    let count = victims.len();
    let mut first = None;
    for victim in victims {
        if let Some(Err(e)) = Arc::into_inner(victim).map(Entry::destroy_now) {
            first.get_or_insert(e);
        }
    }
    match first {
        Some(e) => Err(Error::Destroy(e)),
        None => Ok(count),
    }
}
