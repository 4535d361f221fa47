//! The OpenCL program cache: the caller's context and device, sources and options in, a built
//! `cl_program` out, through a lease on the memory tier, with program binaries on disk.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use super::runtime::{self, ContextRef, Device, DeviceIdentity, Program};
use super::sys::{Api, CL_INVALID_BUILD_OPTIONS, cl_context};
use crate::disk::DiskCache;
use crate::error::{BuildError, DeviceId, Error, Result};
use crate::key::{Key, KeyBuilder};
use crate::memory::{self, Lease, MemoryCache};

/// What a lookup returns: the program stays alive (and retained by the cache) while any lease
/// on it is held, even across eviction.
pub type ProgramLease = Lease<Vec<u8>, Program>;

/// The caller's (context, device) pair under the number the memory tier evicts by.
struct Registered {
    id: DeviceId,
    context: usize,
    device: usize,
    identity: DeviceIdentity,
}

#[derive(Default)]
struct Counters {
    source_builds: AtomicU64,
    binary_loads: AtomicU64,
    binaries_rejected: AtomicU64,
    disk_hits: AtomicU64,
    disk_misses: AtomicU64,
    disk_errors: AtomicU64,
}

/// Counters of an [`OpenClCache`]: the memory tier's plus where each built program came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenClStats {
    pub memory: memory::Stats,
    /// Programs compiled from source (`clBuildProgram` on a source program).
    pub source_builds: u64,
    /// Programs loaded from a disk binary (`clCreateProgramWithBinary` + `clBuildProgram`).
    pub binary_loads: u64,
    /// Disk binaries the driver refused; each was removed and the source built instead.
    pub binaries_rejected: u64,
    pub disk_hits: u64,
    pub disk_misses: u64,
    /// Disk reads or writes that failed; the lookup went on without the disk.
    pub disk_errors: u64,
}

/// A compiled program's binary on its way to disk: key, bytes, compile time.
type WriteBack = (Key, Vec<u8>, Duration);

thread_local! {
    /// The memory-tier key is assembled here so that a hit allocates nothing.
    static KEY_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Built OpenCL programs, in memory and (optionally) as binaries on disk. One per process is
/// enough: it serves every context and device, from any number of threads.
pub struct OpenClCache {
    api: &'static Api,
    memory: MemoryCache<Vec<u8>, Program>,
    disk: Option<Arc<DiskCache>>,
    devices: RwLock<HashMap<(usize, usize), Arc<Registered>>>,
    next_device: AtomicI64,
    counters: Counters,
}

impl OpenClCache {
    /// A cache whose L1 follows `memory` and whose L2 is `disk` (`None`: memory only). Fails
    /// with [`Error::Unavailable`] when no OpenCL library can be loaded.
    pub fn new(memory: memory::Options, disk: Option<Arc<DiskCache>>) -> Result<OpenClCache> {
        let api = Api::get()?;
        let memory = MemoryCache::new(memory, Program::release);
        Ok(OpenClCache {
            api,
            memory,
            disk,
            devices: RwLock::new(HashMap::new()),
            next_device: AtomicI64::new(0),
            counters: Counters::default(),
        })
    }

    fn register(&self, context: ContextRef<'_>, device: Device) -> Result<Arc<Registered>> {
        let pair = (context.raw() as usize, device.raw() as usize);
        if let Some(registered) = self.devices.read().get(&pair) {
            return Ok(Arc::clone(registered));
        }
        // Queried outside the lock: it calls into the driver.
        let identity = DeviceIdentity::query(self.api, device)?;
        let mut devices = self.devices.write();
        let registered = devices.entry(pair).or_insert_with(|| {
            Arc::new(Registered {
                id: self.next_device.fetch_add(1, Ordering::Relaxed),
                context: pair.0,
                device: pair.1,
                identity,
            })
        });
        Ok(Arc::clone(registered))
    }

    /// The built program for `sources` (concatenated in order, as `clCreateProgramWithSource`
    /// does) and `options` on `device` in `context`: from memory, else from a disk binary, else
    /// compiled; concurrent callers of one missing program share one build.
    ///
    /// A build failure is [`Error::Build`] whose message holds the compiler log. Programs built
    /// for a (context, device) pair that is being evicted concurrently come back as
    /// [`Error::DeviceDestroyed`].
    pub fn get_or_build(
        &self,
        context: ContextRef<'_>,
        device: Device,
        sources: &[&str],
        options: &str,
    ) -> Result<ProgramLease> {
        if context.raw().is_null() || device.raw().is_null() {
            return Err(Error::InvalidArgument(
                "the context and the device must not be null".into(),
            ));
        }
        let registered = self.register(context, device)?;
        let mut key = KEY_BUFFER.take();
        memory_key(&mut key, registered.id, sources, options);
        // Set by the build step when the program was compiled and its binary should go to
        // disk: written after the flight, so that waiters do not wait for the write's fsync.
        let mut built = None;
        let result = self
            .memory
            .find_or_build(&key[..], Some(registered.id), || {
                let (program, weight, write_back) =
                    self.build(&registered, context, device, sources, options)?;
                built = Some(write_back);
                Ok((program, weight))
            });
        KEY_BUFFER.set(key);
        let lease = result?;
        let Some(write_back) = built else {
            return Ok(lease);
        };
        let still_registered = {
            let devices = self.devices.read();
            devices
                .get(&(registered.context, registered.device))
                .map(|r| r.id)
                == Some(registered.id)
        };
        if !still_registered {
            // The pair was evicted between the registry lookup and the install, so that
            // eviction may have missed this entry: unlink it ourselves (see `evict`).
            self.memory.remove(lease.key().as_slice())?;
            return Err(Error::DeviceDestroyed(registered.id));
        }
        if let (Some(disk), Some((key, binary, build_time))) = (&self.disk, write_back) {
            if disk.put(&key, &binary, build_time).is_err() {
                self.bump(&self.counters.disk_errors);
            }
        }
        Ok(lease)
    }

    /// The program from a disk binary, else compiled from source; with a compiled program
    /// comes what to write to disk once it is installed.
    fn build(
        &self,
        registered: &Registered,
        context: ContextRef<'_>,
        device: Device,
        sources: &[&str],
        options: &str,
    ) -> std::result::Result<(Program, u64, Option<WriteBack>), BuildError> {
        let options_c = runtime::options_cstring(options)
            .map_err(|e| BuildError::new(CL_INVALID_BUILD_OPTIONS, e.to_string()))?;
        let disk = self.disk.as_ref().and_then(|disk| {
            match disk_key(&registered.identity, sources, options) {
                Ok(key) => Some((disk, key)),
                Err(_) => {
                    self.bump(&self.counters.disk_errors);
                    None
                }
            }
        });
        if let Some((disk, key)) = &disk {
            if let Some((program, weight)) =
                self.load_binary(disk, key, context, device, &options_c)
            {
                return Ok((program, weight, None));
            }
        }
        let start = Instant::now();
        let program = runtime::build_from_source(self.api, context, device, sources, &options_c)?;
        let build_time = start.elapsed();
        self.bump(&self.counters.source_builds);
        match program.binary() {
            Ok(binary) => {
                let weight = binary.len() as u64;
                let write_back = disk.map(|(_, key)| (key, binary, build_time));
                Ok((program, weight, write_back))
            }
            // The program works without its binary; only the disk tier misses out.
            Err(_) => {
                self.bump(&self.counters.disk_errors);
                Ok((program, 0, None))
            }
        }
    }

    /// The program from the disk binary under `key`, if there is one the driver accepts. A
    /// binary that passed the integrity check but that the driver refuses is stale (a driver
    /// rebuilt under the same version string, say): it is removed so that the source build
    /// that follows replaces it.
    fn load_binary(
        &self,
        disk: &DiskCache,
        key: &Key,
        context: ContextRef<'_>,
        device: Device,
        options: &CString,
    ) -> Option<(Program, u64)> {
        let binary = match disk.get(key) {
            Ok(Some(entry)) => entry.into_payload(),
            // A corrupt entry has been removed by the disk tier: a miss like an absent one.
            Ok(None) | Err(Error::Integrity(_)) => {
                self.bump(&self.counters.disk_misses);
                return None;
            }
            Err(_) => {
                self.bump(&self.counters.disk_errors);
                return None;
            }
        };
        self.bump(&self.counters.disk_hits);
        match runtime::build_from_binary(self.api, context, device, &binary, options) {
            Ok(program) => {
                self.bump(&self.counters.binary_loads);
                Some((program, binary.len() as u64))
            }
            Err(_) => {
                self.bump(&self.counters.binaries_rejected);
                if disk.discard_unloadable(key).is_err() {
                    self.bump(&self.counters.disk_errors);
                }
                None
            }
        }
    }

    fn bump(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Unlinks every program built for `device`, in any context. Each is released when its last
    /// lease is. Returns how many were unlinked.
    pub fn evict_device(&self, device: Device) -> Result<usize> {
        self.evict(|r| r.device == device.raw() as usize)
    }

    /// Unlinks every program of `context`, on any device. Call it before releasing the context.
    pub fn evict_context(&self, context: cl_context) -> Result<usize> {
        self.evict(|r| r.context == context as usize)
    }

    fn evict(&self, matches: impl Fn(&Registered) -> bool) -> Result<usize> {
        // Rows leave the registry before their entries are evicted; a build racing with this
        // either installs before `evict_device` runs (and is unlinked by it) or finds its row
        // gone afterwards (and unlinks itself in `get_or_build`).
        let victims: Vec<Arc<Registered>> = {
            let mut devices = self.devices.write();
            let keys: Vec<(usize, usize)> = devices
                .iter()
                .filter(|(_, r)| matches(r))
                .map(|(pair, _)| *pair)
                .collect();
            keys.iter()
                .filter_map(|pair| devices.remove(pair))
                .collect()
        };
        let mut unlinked = 0;
        let mut first_error = None;
        for victim in victims {
            match self.memory.evict_device(victim.id) {
                Ok(n) => unlinked += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(unlinked),
        }
    }

    /// Unlinks every program; each is released when its last lease is.
    pub fn clear(&self) -> Result<usize> {
        self.memory.clear()
    }

    /// Programs in memory now.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    pub fn stats(&self) -> OpenClStats {
        let c = &self.counters;
        let get = |v: &AtomicU64| v.load(Ordering::Relaxed);
        OpenClStats {
            memory: self.memory.stats(),
            source_builds: get(&c.source_builds),
            binary_loads: get(&c.binary_loads),
            binaries_rejected: get(&c.binaries_rejected),
            disk_hits: get(&c.disk_hits),
            disk_misses: get(&c.disk_misses),
            disk_errors: get(&c.disk_errors),
        }
    }
}

/// The memory-tier key: the registered pair's number stands for (context, device), then the
/// length-prefixed options, then the program text. The driver concatenates the source strings,
/// so the split between them does not matter.
fn memory_key(key: &mut Vec<u8>, device: DeviceId, sources: &[&str], options: &str) {
    key.clear();
    key.extend_from_slice(&device.to_le_bytes());
    key.extend_from_slice(&(options.len() as u64).to_le_bytes());
    key.extend_from_slice(options.as_bytes());
    for source in sources {
        key.extend_from_slice(source.as_bytes());
    }
}

/// The key under which the disk tier keeps the binary of `sources` built with `options` for
/// `device`. Lookups compute it themselves; this is for tools that inspect or remove entries.
pub fn program_disk_key(device: Device, sources: &[&str], options: &str) -> Result<Key> {
    let identity = DeviceIdentity::query(Api::get()?, device)?;
    disk_key(&identity, sources, options)
}

/// The disk key: what makes a binary valid (platform, device, driver and compiler versions)
/// and what it was built from, but no handle, so it holds across processes and contexts.
fn disk_key(identity: &DeviceIdentity, sources: &[&str], options: &str) -> Result<Key> {
    let mut builder = KeyBuilder::new();
    builder
        .backend("opencl")
        .device_name(&identity.device_name)
        .device_vendor(&identity.platform_name)
        .driver_version(&identity.driver_version)
        .compiler_version(&identity.opencl_c_version)
        .source(sources.concat())
        // Kept whole: OpenCL options are order-sensitive (`-I` search order, repeated `-D`).
        .extra("build-options", options)
        .extra("platform-version", &identity.platform_version)
        .extra("device-version", &identity.device_version);
    builder.finish()
}
