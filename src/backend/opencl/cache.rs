//! The OpenCL program cache: the caller's context and device, sources and options in, a built
//! `cl_program` out, through a lease on the memory tier, with program binaries on disk.

use std::cell::Cell;
use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::runtime::{self, ContextRef, Device, DeviceIdentity, Program};
use super::sys::{Api, CL_INVALID_BUILD_OPTIONS, cl_context};
use crate::backend::registry::Registry;
use crate::disk::{DiskCache, DiskStats};
use crate::error::{BuildError, DeviceId, Error, Result};
use crate::key::{Key, KeyBuilder};
use crate::memory::{self, Lease, MemoryCache};
use crate::tiered::TieredCache;

/// What a lookup returns: the program stays alive (and retained by the cache) while any lease
/// on it is held, even across eviction.
pub type ProgramLease = Lease<Vec<u8>, Program>;

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
    /// The disk tier's own counters (integrity rejects, puts, evictions, I/O errors, …),
    /// all zero without a disk tier. A disk tier shared with other caches counts for all.
    pub disk: DiskStats,
}

thread_local! {
    /// The memory-tier key is assembled here so that a hit allocates nothing.
    static KEY_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Built OpenCL programs, in memory and (optionally) as binaries on disk. One per process is
/// enough: it serves every context and device, from any number of threads.
pub struct OpenClCache {
    api: &'static Api,
    tiered: TieredCache<Vec<u8>, Program>,
    /// The caller's (context, device) pairs by address, with what the disk key needs of each
    /// device.
    devices: Registry<(usize, usize), DeviceIdentity>,
    source_builds: AtomicU64,
}

impl OpenClCache {
    /// A cache whose L1 follows `memory` and whose L2 is `disk` (`None`: memory only), with
    /// the operator key and key requirement of the [`DiskConfig`](crate::disk::DiskConfig) it
    /// was opened with. Fails with [`Error::Unavailable`] when no OpenCL library can be loaded.
    pub fn new(memory: memory::Options, disk: Option<Arc<DiskCache>>) -> Result<OpenClCache> {
        let api = Api::get()?;
        let memory = Arc::new(MemoryCache::new(memory, Program::release));
        Ok(OpenClCache {
            api,
            tiered: TieredCache::new(memory, disk),
            devices: Registry::default(),
            source_builds: AtomicU64::new(0),
        })
    }

    fn memory(&self) -> &MemoryCache<Vec<u8>, Program> {
        self.tiered.memory()
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
        let pair = (context.raw() as usize, device.raw() as usize);
        let mut key = KEY_BUFFER.take();
        // A hit touches neither the registration's reference count nor any other shared word.
        let hit = self.devices.probe(pair, |registered| {
            memory_key(&mut key, registered.id(), sources, options);
            self.memory().probe(&key[..])
        });
        if let Some(lease) = hit {
            KEY_BUFFER.set(key);
            return Ok(lease);
        }
        // (An error here drops the key buffer: the next lookup just allocates a new one.)
        let registered = self
            .devices
            .get_or_register(pair, || DeviceIdentity::query(self.api, device))?;
        memory_key(&mut key, registered.id(), sources, options);
        // A source build hands its binary to the write-back here, so the driver is asked once.
        let binary = Cell::new(None);
        let result = self.tiered.find_or_build(
            &key[..],
            Some(registered.id()),
            || disk_key(registered.info(), sources, options),
            |stored| {
                let program = runtime::build_from_binary(
                    self.api,
                    context,
                    device,
                    stored,
                    &options_cstring(options)?,
                )?;
                Ok((program, stored.len() as u64))
            },
            || self.build(context, device, sources, options, &binary),
            |_| {
                binary
                    .take()
                    .ok_or_else(|| BuildError::new(0, "the driver gave no program binary"))
            },
        );
        KEY_BUFFER.set(key);
        registered.confirm(self.memory(), result?)
    }

    /// Compiles from source; the binary, when the driver gives it, goes to `binary`.
    fn build(
        &self,
        context: ContextRef<'_>,
        device: Device,
        sources: &[&str],
        options: &str,
        binary: &Cell<Option<Vec<u8>>>,
    ) -> std::result::Result<(Program, u64), BuildError> {
        let program = runtime::build_from_source(
            self.api,
            context,
            device,
            sources,
            &options_cstring(options)?,
        )?;
        self.source_builds.fetch_add(1, Ordering::Relaxed);
        // The program works without its binary; only the disk tier misses out.
        let weight = match program.binary() {
            Ok(bytes) => {
                let weight = bytes.len() as u64;
                binary.set(Some(bytes));
                weight
            }
            Err(_) => 0,
        };
        Ok((program, weight))
    }

    /// Unlinks every program built for `device`, in any context. Each is released when its last
    /// lease is. Returns how many were unlinked.
    pub fn evict_device(&self, device: Device) -> Result<usize> {
        let device = device.raw() as usize;
        self.devices
            .evict(self.memory(), |r| r.handle().1 == device)
    }

    /// Unlinks every program of `context`, on any device. Call it before releasing the context.
    pub fn evict_context(&self, context: cl_context) -> Result<usize> {
        let context = context as usize;
        self.devices
            .evict(self.memory(), |r| r.handle().0 == context)
    }

    /// Unlinks every program; each is released when its last lease is.
    pub fn clear(&self) -> Result<usize> {
        self.memory().clear()
    }

    /// Programs in memory now.
    pub fn len(&self) -> usize {
        self.memory().len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory().is_empty()
    }

    pub fn stats(&self) -> OpenClStats {
        let tiers = self.tiered.stats();
        OpenClStats {
            memory: self.memory().stats(),
            source_builds: self.source_builds.load(Ordering::Relaxed),
            binary_loads: tiers.disk_hits,
            binaries_rejected: tiers.load_failures,
            // A binary the driver refused was still found on disk.
            disk_hits: tiers.disk_hits + tiers.load_failures,
            disk_misses: tiers.disk_absent,
            disk_errors: tiers.disk_errors + tiers.write_back_failures,
            disk: self.tiered.disk().map(|d| d.stats()).unwrap_or_default(),
        }
    }
}

fn options_cstring(options: &str) -> std::result::Result<CString, BuildError> {
    runtime::options_cstring(options)
        .map_err(|e| BuildError::new(CL_INVALID_BUILD_OPTIONS, e.to_string()))
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
