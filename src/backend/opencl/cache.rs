//! The OpenCL program cache: the caller's context and device, sources and options in, a built
//! `cl_program` out, through a lease on the memory tier, with program binaries on disk.

use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::pocl::{self, Sibling, SiblingBuilds};
use super::runtime::{self, ContextRef, Device, DeviceIdentity, Make, Program};
use super::sys::{Api, CL_INVALID_BUILD_OPTIONS, cl_context};
use crate::Persistence;
use crate::backend::handle_cache::{Compiled, HandleCache, Registered, Runtime, common_calls};
use crate::disk::{Descriptor, DiskBytes, DiskStats};
use crate::error::{BuildError, Error, Result};
use crate::headers::{Embedded, Headers, Unknowable, opencl_search};
use crate::key::{Key, KeyBuilder};
use crate::log;
use crate::memory::{self, Built, Lease};
use crate::metrics::Backend;

/// What a lookup returns: the program stays alive (and retained by the cache) while any lease
/// on it is held, even across eviction.
pub type ProgramLease = Lease<Vec<u8>, Program>;

crate::stats::statistics! {
    /// Counters of an [`OpenClCache`]: the memory tier's plus where each built program came from.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct OpenClStats {
        nested memory: memory::Stats,
        /// Programs compiled from source (`clBuildProgram` on a source program), those built on
        /// PoCL for another process's entry (a sibling, see `docs/opencl.md`) included.
        event source_builds,
        /// Programs loaded from a stored binary, the disk tier's or the remote tier's
        /// (`clCreateProgramWithBinary` + `clBuildProgram`).
        event binary_loads,
        /// Disk binaries the driver refused; each was removed and the source built instead.
        event binaries_rejected,
        event disk_hits,
        event disk_misses,
        /// Disk reads or writes that failed; the lookup went on without the disk.
        event disk_errors,
        /// Builds kcache could not key, compiled from source and cached nowhere: a computed
        /// `#include` it cannot expand, an option that reads a file (see
        /// `docs/opencl.md`). Counted in `source_builds` too.
        event passed_through,
        /// The disk tier's own counters (integrity rejects, puts, evictions, I/O errors, …),
        /// all zero without a disk tier. A disk tier shared with other caches counts for all.
        nested disk: DiskStats,
    }
}

impl OpenClStats {
    /// The share of lookups that compiled nothing: memory hits and binary loads over the
    /// memory tier's lookups; `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::backend::hit_rate(&self.memory, self.binary_loads)
    }
}

/// How an [`OpenClCache`] is set up.
#[derive(Clone, Default)]
pub struct OpenClOptions {
    /// Caps and hooks of the memory tier. A program loaded from disk weighs its binary's size
    /// in `max_weight`; one built from source its source's length.
    pub memory: memory::Options,
    /// Where program binaries persist; `None` keeps everything in memory. Its operator key and
    /// key requirement are those of the [`PersistenceConfig`](crate::PersistenceConfig) it was opened
    /// with.
    pub persistence: Option<Arc<Persistence>>,
}

/// What a program is built from, on which (context, device) pair.
#[derive(Clone, Copy)]
pub(crate) struct Input<'a> {
    context: ContextRef<'a>,
    device: Device,
    sources: &'a [&'a str],
    options: &'a str,
    /// The headers the sources read, found through the options' `-I` directories.
    headers: &'a Headers,
    /// An executable, or a compiled object (`clCompileProgram`) with its embedded headers.
    make: Make<'a>,
}

/// The OpenCL calls of the cache: identity of a device, build from source, load a binary.
pub(crate) struct OpenCl {
    api: &'static Api,
    /// Shared with the sibling builds, which count themselves.
    source_builds: Arc<AtomicU64>,
    /// Whether binaries are wanted: there is a disk tier.
    stores: bool,
    /// Where the sibling builds are counted besides `source_builds`.
    siblings: Arc<SiblingBuilds>,
    passed_through: AtomicU64,
}

impl Runtime for OpenCl {
    /// The caller's (context, device) pair, by address.
    type Handle = (usize, usize);
    type Info = DeviceIdentity;
    type Value = Program;
    type Input<'a> = Input<'a>;
    const BACKEND: Backend = Backend::OpenCl;

    fn describe(&self, input: Input<'_>) -> Result<DeviceIdentity> {
        DeviceIdentity::query_with(self.api, input.device)
    }

    /// What the program is made into, the headers' digest (when the sources read any), the
    /// length-prefixed options, then the program text. The driver concatenates the source strings, so the split between them
    /// does not matter.
    fn memory_key(key: &mut Vec<u8>, input: Input<'_>) {
        // What the program is made into, and whether a headers' digest follows.
        match (input.make, input.headers.is_empty()) {
            (Make::Executable, true) => key.push(0),
            (Make::Executable, false) => key.push(1),
            (Make::Object(_), _) => key.push(2),
        }
        if !input.headers.is_empty() {
            key.extend_from_slice(&input.headers.digest());
        }
        key.extend_from_slice(&(input.options.len() as u64).to_le_bytes());
        key.extend_from_slice(input.options.as_bytes());
        for source in input.sources {
            key.extend_from_slice(source.as_bytes());
        }
    }

    fn disk_key(&self, identity: &DeviceIdentity, input: Input<'_>) -> Result<Key> {
        let object = matches!(input.make, Make::Object(_));
        disk_key(
            identity,
            input.sources,
            input.options,
            input.headers,
            object,
        )
    }

    fn load(
        &self,
        registered: &Registered<Self>,
        input: Input<'_>,
        stored: &[u8],
    ) -> Built<Program> {
        let binary = if pocl::applies_to(registered.info()) {
            pocl::loadable(stored)
        } else {
            stored.into()
        };
        let program = runtime::build_from_binary(
            self.api,
            input.context,
            input.device,
            &binary,
            &options_cstring(input.options)?,
            input.make,
        )?;
        Ok((program, stored.len() as u64))
    }

    fn build(
        &self,
        registered: &Registered<Self>,
        input: Input<'_>,
    ) -> std::result::Result<Compiled<Program>, BuildError> {
        let options = options_cstring(input.options)?;
        let program = runtime::make_from_source(
            self.api,
            input.context,
            input.device,
            input.sources,
            &options,
            input.make,
        )?;
        self.source_builds.fetch_add(1, Ordering::Relaxed);
        // A driver without the query (OpenCL 1.1) leaves the entry unnamed.
        let descriptor = Descriptor::new(
            "opencl",
            &registered.info().device_name,
            &program.kernel_names().unwrap_or_default(),
        );
        // Until its binary is known the program weighs its source's length.
        let weight = input.sources.iter().map(|s| s.len() as u64).sum();
        // A compiled object has no launches whose code PoCL would add to its binary.
        let executable = matches!(input.make, Make::Executable);
        let bytes = if !self.stores {
            None
        } else if executable && pocl::applies_to(registered.info()) {
            // Held back until another process wants it (a sibling's binary) or the cache is
            // flushed (the program's own, under the layer's gate); see `pocl`. The writer
            // holds references of its own, so the program outlives an early eviction.
            let sibling = Sibling::new(
                self.api,
                &program,
                input.context,
                input.device,
                input.sources,
                &options,
                (Arc::clone(&self.source_builds), Arc::clone(&self.siblings)),
            );
            let settled = program.retain().ok();
            sibling.zip(settled).map(|(sibling, settled)| {
                DiskBytes::held(
                    move || sibling.binary(),
                    move || pocl::settled_binary(&settled),
                )
            })
        } else {
            // Asked for here, on the caller's thread, before anything else has the program: a
            // background query could meet the caller's launches in the driver. Other drivers'
            // binaries are made by the build, so the query costs a copy. The program works
            // without its binary; only the tiers miss out.
            program
                .binary()
                .inspect_err(|e| log::info(|| format!("OpenCL binary not stored: {e}")))
                .ok()
                .map(DiskBytes::from)
        };
        Ok(Compiled {
            value: program,
            weight,
            bytes,
            descriptor,
        })
    }
}

/// Built OpenCL programs, in memory and (optionally) as binaries on disk. One per process is
/// enough: it serves every context and device, from any number of threads.
pub struct OpenClCache {
    cache: HandleCache<OpenCl>,
}

impl OpenClCache {
    /// Fails with [`Error::Unavailable`] when no OpenCL library can be loaded.
    pub fn new(options: OpenClOptions) -> Result<OpenClCache> {
        let runtime = OpenCl {
            api: Api::get()?,
            source_builds: Arc::default(),
            stores: options.persistence.is_some(),
            siblings: SiblingBuilds::new(options.persistence.as_ref()),
            passed_through: AtomicU64::new(0),
        };
        Ok(OpenClCache {
            cache: HandleCache::new(runtime, options.memory, options.persistence),
        })
    }

    /// The built program for `sources` (concatenated in order, as `clCreateProgramWithSource`
    /// does) and `options` on `device` in `context`: from memory, else from a disk binary, else
    /// compiled; concurrent callers of one missing program share one build.
    ///
    /// The headers the sources `#include` are inputs too: found as the compiler finds them
    /// (beside the file that includes them, in the options' `-I` directories, in the working
    /// directory) and read on every lookup, so that a changed header is a miss. A build whose
    /// inputs kcache cannot know (a computed `#include` it cannot expand, an option
    /// such as `-include` that reads a file) is compiled and cached nowhere: its lease is the
    /// only reference, and `passed_through` counts it.
    ///
    /// A build failure is [`Error::Build`] whose message holds the compiler log. Programs built
    /// for a (context, device) pair that is being evicted concurrently come back as
    /// [`Error::DeviceDestroyed`].
    pub fn find_or_build(
        &self,
        context: ContextRef<'_>,
        device: Device,
        sources: &[&str],
        options: &str,
    ) -> Result<ProgramLease> {
        match self.lookup(context, device, sources, options, Make::Executable, &[]) {
            Ok(found) => found,
            Err(unknowable) => {
                self.passed_through(&unknowable);
                let input = Input {
                    context,
                    device,
                    sources,
                    options,
                    headers: &Headers::default(),
                    make: Make::Executable,
                };
                let pair = (context.raw() as usize, device.raw() as usize);
                self.cache.build_unlisted(pair, input)
            }
        }
    }

    /// The tiered lookup of a program made into `make` (an executable, or a compiled object
    /// with the `embedded` headers, whose texts are keyed) whose inputs kcache knows;
    /// `Err(why)` when it cannot know them, for the caller to pass the build through.
    pub(crate) fn lookup(
        &self,
        context: ContextRef<'_>,
        device: Device,
        sources: &[&str],
        options: &str,
        make: Make<'_>,
        embedded: &[Embedded<'_>],
    ) -> std::result::Result<Result<ProgramLease>, Unknowable> {
        if context.raw().is_null() || device.raw().is_null() {
            return Ok(Err(Error::InvalidArgument(
                "the context and the device must not be null".into(),
            )));
        }
        let headers = Headers::read(sources, &opencl_search(options)?, embedded)?;
        let pair = (context.raw() as usize, device.raw() as usize);
        let input = Input {
            context,
            device,
            sources,
            options,
            headers: &headers,
            make,
        };
        Ok(self.cache.find_or_build(pair, input))
    }

    /// Counts a build passed through; the first one of the process says why.
    pub(crate) fn passed_through(&self, why: &Unknowable) {
        let runtime = self.cache.runtime();
        runtime.passed_through.fetch_add(1, Ordering::Relaxed);
        self.cache.passed_through(why);
    }

    /// Unlinks every program built for `device`, in any context. Each is released when its last
    /// lease is. Returns how many were unlinked.
    pub fn evict_device(&self, device: Device) -> Result<usize> {
        let device = device.raw() as usize;
        self.cache.evict(|r| r.handle().1 == device)
    }

    /// Unlinks every program of `context`, on any device. Call it before releasing the context.
    pub fn evict_context(&self, context: cl_context) -> Result<usize> {
        let context = context as usize;
        self.cache.evict(|r| r.handle().0 == context)
    }

    common_calls!();

    /// Waits until the binary of every program built so far is written to the disk tier (or
    /// failed to be); dropping the cache does it too. On PoCL, binaries are held back until
    /// another process waits for them or until this flush, so that they carry the work-group
    /// code the programs' launches compiled and the next process's first launches compile
    /// nothing (see `docs/node.md`): flush after your warm-up launches.
    pub fn flush(&self) {
        self.cache.flush();
    }

    /// Zeroes the event counters of the cache and of its tiers (a disk tier shared with other
    /// caches is reset for them too); gauges (entries, leases, pending writes) stay.
    pub fn reset_stats(&self) {
        self.cache.reset_stats();
        let runtime = self.cache.runtime();
        crate::stats::zero(&[&runtime.source_builds, &runtime.passed_through]);
    }

    pub fn stats(&self) -> OpenClStats {
        let tiers = self.cache.stats();
        OpenClStats {
            memory: tiers.memory,
            source_builds: self.cache.runtime().source_builds.load(Ordering::Relaxed),
            binary_loads: tiers.loads,
            binaries_rejected: tiers.rejected,
            disk_hits: tiers.disk_hits,
            disk_misses: tiers.disk_misses,
            disk_errors: tiers.disk_errors,
            passed_through: self.cache.runtime().passed_through.load(Ordering::Relaxed),
            disk: tiers.disk,
        }
    }
}

fn options_cstring(options: &str) -> std::result::Result<CString, BuildError> {
    runtime::options_cstring(options)
        .map_err(|e| BuildError::new(CL_INVALID_BUILD_OPTIONS, e.to_string()))
}

/// The key under which the disk tier keeps the binary of `sources` built with `options` for
/// `device`, with the headers they read now (from the working directory). Lookups compute it
/// themselves; this is for tools that inspect or remove entries. A build kcache cannot key is
/// [`Error::InvalidArgument`].
pub fn program_disk_key(device: Device, sources: &[&str], options: &str) -> Result<Key> {
    let identity = DeviceIdentity::query(device)?;
    let headers = opencl_search(options)
        .and_then(|search| Headers::read(sources, &search, &[]))
        .map_err(|why| Error::InvalidArgument(format!("a build kcache cannot key: {why}")))?;
    disk_key(&identity, sources, options, &headers, false)
}

/// The disk key: what makes a binary valid (platform, device, driver and compiler versions)
/// and what it was built from (the headers it reads included), whether it is a compiled
/// object, but no handle, so it holds across processes and contexts.
fn disk_key(
    identity: &DeviceIdentity,
    sources: &[&str],
    options: &str,
    headers: &Headers,
    object: bool,
) -> Result<Key> {
    let mut builder = KeyBuilder::new();
    headers.add_to(&mut builder);
    if object {
        builder.extra("program-kind", "compiled-object");
    }
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
