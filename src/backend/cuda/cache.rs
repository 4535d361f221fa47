//! The CUDA module cache: the caller's context, PTX and JIT options in, a loaded `CUmodule`
//! out, through a lease on the memory tier, with the linked cubins on disk.

use std::sync::{Arc, OnceLock};

use super::driver::{CUcontext, CUdevice, Driver};
use super::jit::{JitOption, check};
use super::module::Context;
// Also where the test helpers find it.
pub(super) use super::module::ModuleLease;
use super::nvrtc::Nvrtc;
use super::runtime::{Cuda, Input, Source, picked_arch};
use crate::Persistence;
use crate::backend::handle_cache::{HandleCache, common_calls};
use crate::disk::DiskStats;
use crate::error::{Error, Result};
use crate::headers::{Embedded, Headers, nvrtc_search};
use crate::memory;
use crate::stats::{Live, bump};

/// Where a cache gets its driver and its disk tier.
#[derive(Default)]
pub struct CudaOptions {
    pub memory: memory::Options,
    /// `None`: memory only. Its operator key and key requirement are those of the
    /// [`PersistenceConfig`](crate::PersistenceConfig) it was opened with.
    pub persistence: Option<Arc<Persistence>>,
    /// A driver already loaded; `None` loads one with [`Driver::load`].
    pub driver: Option<Arc<Driver>>,
    /// NVRTC already loaded; `None` loads it with [`Nvrtc::load_for_driver`] on the first
    /// [`CudaCache::find_or_build_source`].
    pub nvrtc: Option<Arc<Nvrtc>>,
}

crate::stats::statistics! {
    /// Counters of a [`CudaCache`]: the memory tier's plus where each module came from.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct CudaStats {
        nested memory: memory::Stats,
        /// PTX linked into a cubin (`cuLinkCreate` … `cuLinkComplete`).
        counted links,
        /// Links that failed (bad PTX, bad options); the caller got [`Error::Build`].
        counted link_failures,
        /// Modules loaded from a stored cubin (the disk tier's or the remote tier's) without any
        /// PTX JIT.
        event cubin_loads,
        /// Disk cubins the driver refused; each was removed and the PTX linked again.
        event cubins_rejected,
        event disk_hits,
        event disk_misses,
        /// Disk reads or writes that failed; the lookup went on without the disk.
        event disk_errors,
        /// CUDA C++ sources compiled to PTX by NVRTC.
        counted nvrtc_compiles,
        /// NVRTC compiles that failed; the caller got [`Error::Build`].
        counted nvrtc_failures,
        /// CUDA C++ builds kcache could not key (a header it cannot find, a computed
        /// `#include`, an option that reads a file, see `docs/cuda.md`), compiled and cached
        /// nowhere. Counted in `nvrtc_compiles` too.
        counted passed_through,
        /// The disk tier's own counters (integrity rejects, puts, evictions, I/O errors, …),
        /// all zero without a disk tier. A disk tier shared with other caches counts for all.
        nested disk: DiskStats,
    }
    /// The driver calls the cache counts, zeroed by [`CudaCache::reset_stats`].
    live pub(super) struct Counters;
}

impl CudaStats {
    /// The share of lookups that compiled nothing: memory hits and cubin loads over the
    /// memory tier's lookups; `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        crate::backend::hit_rate(&self.memory, self.cubin_loads)
    }
}

/// Cache of `CUmodule`s per (context, PTX, JIT options), backed by cubins on disk keyed by
/// (device name, compute capability, driver version and build, options, PTX).
///
/// The caller owns its contexts. Before destroying one, call [`CudaCache::evict_context`];
/// before the last `cuDevicePrimaryCtxRelease` of a device's primary context, and before
/// `cuDevicePrimaryCtxReset` or `cudaDeviceReset`, call [`CudaCache::evict_device`]. The
/// modules are unloaded then, with their context current, or when the last lease on each
/// drops. The cache knows a context by its address, and a primary context retained again
/// comes back at the same address without its modules: without the eviction, lookups there
/// hand out modules of the destroyed context.
pub struct CudaCache {
    cache: HandleCache<Cuda>,
    nvrtc: OnceLock<Result<Arc<Nvrtc>>>,
}

impl CudaCache {
    /// Fails with [`Error::Unavailable`] when no driver is given and none can be loaded.
    pub fn new(options: CudaOptions) -> Result<CudaCache> {
        let driver = match options.driver {
            Some(driver) => driver,
            None => Arc::new(Driver::load()?),
        };
        let runtime = Cuda {
            driver,
            counters: Counters::default(),
        };
        Ok(CudaCache {
            cache: HandleCache::new(runtime, options.memory, options.persistence),
            nvrtc: match options.nvrtc {
                Some(nvrtc) => OnceLock::from(Ok(nvrtc)),
                None => OnceLock::new(),
            },
        })
    }

    pub fn driver(&self) -> &Arc<Driver> {
        &self.cache.runtime().driver
    }

    /// NVRTC, loaded on first use; a failed load is remembered, not retried.
    pub fn nvrtc(&self) -> Result<&Arc<Nvrtc>> {
        self.nvrtc
            .get_or_init(|| Nvrtc::load_for_driver(self.driver().version()).map(Arc::new))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The calling thread's current context, `None` when there is none.
    pub fn current_context(&self) -> Result<Option<Context>> {
        let raw = self.driver().current_context()?;
        // SAFETY: the driver reports it as current, hence live; the lifetime obligation is the
        // caller's, as documented on the cache.
        Ok(unsafe { Context::from_raw(raw) })
    }

    /// The module for `ptx` linked with `options` in `context` (`None`: the calling thread's
    /// current context): from memory, else from a disk cubin, else linked from the PTX.
    /// Concurrent callers of one missing module share one link.
    ///
    /// A PTX or link error is [`Error::Build`] with the `CUresult` as its code and the JIT
    /// error log as its message. A module built for a context that is evicted concurrently
    /// comes back as [`Error::DeviceDestroyed`].
    pub fn find_or_build_ptx(
        &self,
        context: Option<Context>,
        ptx: &[u8],
        options: &[JitOption],
    ) -> Result<ModuleLease> {
        if ptx.is_empty() {
            return Err(Error::InvalidArgument("the PTX is empty".into()));
        }
        self.lookup(context, Source::Ptx(ptx), options, true)
    }

    /// The module for CUDA C++ `source`, compiled by NVRTC with `nvrtc_options`; otherwise as
    /// [`CudaCache::find_or_build_ptx`]. Unless the options name an architecture (`-arch` /
    /// `--gpu-architecture`), the code targets the context's device. JIT options only reach
    /// the driver's linker, which only compiles PTX: given `jit_options`, the source is
    /// compiled to PTX and linked with them, and naming a real architecture (`sm_XY`, which
    /// makes NVRTC's own cubin, loaded without a link) with them is [`Error::InvalidArgument`].
    /// NVRTC's version and build are part of the disk key. Kernels are looked up by their
    /// symbol name: declare them `extern "C"` to keep it unmangled.
    ///
    /// No NVRTC library: [`Error::Unavailable`]. A compile error: [`Error::Build`] with the
    /// `nvrtcResult` as its code and the compiler log as its message.
    pub fn find_or_build_source(
        &self,
        context: Option<Context>,
        source: &str,
        nvrtc_options: &[&str],
        jit_options: &[JitOption],
    ) -> Result<ModuleLease> {
        self.find_or_build_source_with_headers(context, source, &[], nvrtc_options, jit_options)
    }

    /// As [`CudaCache::find_or_build_source`], with in-memory `headers` given to NVRTC
    /// (`nvrtcCreateProgram`'s headers) as (include name, text) pairs: an `#include` of that
    /// name reads the text, before any file. The texts of those the source includes are keyed.
    pub fn find_or_build_source_with_headers(
        &self,
        context: Option<Context>,
        source: &str,
        headers: &[(&str, &str)],
        nvrtc_options: &[&str],
        jit_options: &[JitOption],
    ) -> Result<ModuleLease> {
        if source.is_empty() {
            return Err(Error::InvalidArgument("the CUDA source is empty".into()));
        }
        if let Some(arch) = picked_arch(nvrtc_options).filter(|a| a.starts_with("sm_"))
            && !jit_options.is_empty()
        {
            return Err(Error::InvalidArgument(format!(
                "JIT options apply only to PTX, but the NVRTC options name the real \
                 architecture {arch}, whose cubin is loaded without a link: name compute_XY \
                 to have the PTX linked with them, or pass no JIT options"
            )));
        }
        let nvrtc = self.nvrtc()?;
        let embedded: Vec<Embedded<'_>> = headers
            .iter()
            .map(|&(name, text)| Embedded { name, text })
            .collect();
        let (headers, keyed) = match nvrtc_search(nvrtc_options)
            .and_then(|search| Headers::read(&[source], &search, &embedded))
        {
            Ok(headers) => (headers, true),
            Err(why) => {
                bump(&self.cache.runtime().counters.passed_through, 1);
                self.cache.passed_through(&why);
                (Headers::default(), false)
            }
        };
        let source = Source::Cuda {
            source,
            options: nvrtc_options,
            nvrtc,
            embedded: &embedded,
            headers: &headers,
        };
        self.lookup(context, source, jit_options, keyed)
    }

    /// `keyed` false: the source reads what kcache cannot key, so the module is built and
    /// cached nowhere.
    fn lookup(
        &self,
        context: Option<Context>,
        source: Source<'_>,
        options: &[JitOption],
        keyed: bool,
    ) -> Result<ModuleLease> {
        let context = match context {
            Some(context) => context,
            None => self.current_context()?.ok_or_else(|| {
                Error::InvalidArgument(
                    "no CUDA context is current on this thread and none was given".into(),
                )
            })?,
        };
        check(options)?;
        let input = Input {
            context,
            source,
            options,
        };
        if keyed {
            self.cache.find_or_build(context.raw() as usize, input)
        } else {
            self.cache.build_unlisted(context.raw() as usize, input)
        }
    }

    /// Unlinks every module loaded in `context`; each is unloaded (with `context` current) now,
    /// or when its last lease drops. Call it before destroying the context. Returns how many
    /// were unlinked.
    pub fn evict_context(&self, context: CUcontext) -> Result<usize> {
        let context = context as usize;
        self.cache.evict(|r| r.handle() == context)
    }

    /// Unlinks every module of every context on device `device` (a `CUdevice` ordinal): call
    /// it before the last `cuDevicePrimaryCtxRelease` of the device's primary context, before
    /// `cuDevicePrimaryCtxReset` / `cudaDeviceReset`, or when the device goes away.
    pub fn evict_device(&self, device: CUdevice) -> Result<usize> {
        self.cache.evict(|r| r.info().device == device)
    }

    common_calls!();

    /// Waits until every cubin built so far is written to the disk tier (or failed to be);
    /// dropping the cache does it too.
    pub fn flush(&self) {
        self.cache.flush();
    }

    /// Zeroes the event counters of the cache and of its tiers (a disk tier shared with other
    /// caches is reset for them too); gauges (entries, leases, pending writes) stay.
    pub fn reset_stats(&self) {
        self.cache.reset_stats();
        self.cache.runtime().counters.zero();
    }

    pub fn stats(&self) -> CudaStats {
        let tiers = self.cache.stats();
        CudaStats {
            memory: tiers.memory,
            cubin_loads: tiers.loads,
            cubins_rejected: tiers.rejected,
            disk_hits: tiers.disk_hits,
            disk_misses: tiers.disk_misses,
            disk_errors: tiers.disk_errors,
            disk: tiers.disk,
            ..self.cache.runtime().counters.snapshot()
        }
    }
}
