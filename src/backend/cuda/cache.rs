//! The CUDA module cache: the caller's context, PTX and JIT options in, a loaded `CUmodule`
//! out, through a lease on the memory tier, with the linked cubins on disk.

use std::borrow::Cow;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::driver::{CUcontext, CUdevice, CUfunction, CUmodule, CUresult, Driver};
use super::nvrtc::Nvrtc;
use crate::backend::handle_cache::{
    Compiled, Destroy, HandleCache, Registered, Runtime, common_calls,
};
use crate::disk::{DiskCache, DiskStats};
use crate::error::{BuildError, DestroyError, Error, Result};
use crate::key::{Key, KeyBuilder};
use crate::memory::{self, Built, Lease};

/// A CUDA context the caller owns. kcache never creates or destroys contexts; it only makes
/// the caller's current for a moment (push/pop) when it links, loads or unloads a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Context(CUcontext);

// SAFETY: a CUcontext is a driver handle usable from any thread (the driver keeps a per-thread
// binding, not per-handle thread affinity).
unsafe impl Send for Context {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for Context {}

impl Context {
    /// Wraps a caller's context; `None` for NULL.
    ///
    /// # Safety
    /// `raw` must be a live context of the driver the cache was created with, and must stay
    /// live until the caller has evicted it from every cache that saw it
    /// ([`CudaCache::evict_context`]).
    pub unsafe fn from_raw(raw: CUcontext) -> Option<Context> {
        (!raw.is_null()).then_some(Context(raw))
    }

    pub fn raw(self) -> CUcontext {
        self.0
    }
}

/// One JIT option for linking PTX. Options whose value is a pointer (log buffers) or an
/// output (wall time) belong to kcache and cannot be passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JitOption {
    /// `CU_JIT_MAX_REGISTERS`.
    MaxRegisters(u32),
    /// `CU_JIT_THREADS_PER_BLOCK`.
    ThreadsPerBlock(u32),
    /// `CU_JIT_OPTIMIZATION_LEVEL` (0–4).
    OptimizationLevel(u32),
    /// `CU_JIT_TARGET`: a `CUjit_target` value such as 90 for `sm_90`.
    Target(u32),
    /// `CU_JIT_FALLBACK_STRATEGY`.
    FallbackStrategy(u32),
    /// `CU_JIT_GENERATE_DEBUG_INFO`.
    GenerateDebugInfo(bool),
    /// `CU_JIT_LOG_VERBOSE`.
    LogVerbose(bool),
    /// `CU_JIT_GENERATE_LINE_INFO`.
    GenerateLineInfo(bool),
    /// `CU_JIT_CACHE_MODE`.
    CacheMode(u32),
}

impl JitOption {
    /// From a `CUjit_option` number and its integer value, as the C API passes them.
    pub fn from_raw(option: u32, value: u32) -> Result<JitOption> {
        Ok(match option {
            0 => JitOption::MaxRegisters(value),
            1 => JitOption::ThreadsPerBlock(value),
            7 => JitOption::OptimizationLevel(value),
            9 => JitOption::Target(value),
            10 => JitOption::FallbackStrategy(value),
            11 => JitOption::GenerateDebugInfo(value != 0),
            12 => JitOption::LogVerbose(value != 0),
            13 => JitOption::GenerateLineInfo(value != 0),
            14 => JitOption::CacheMode(value),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "CUjit_option {option} cannot be passed to kcache (pointer-valued, \
                     output-only or unknown)"
                )));
            }
        })
    }

    /// The `CUjit_option` number and its integer value.
    pub fn raw(self) -> (u32, u32) {
        match self {
            JitOption::MaxRegisters(v) => (0, v),
            JitOption::ThreadsPerBlock(v) => (1, v),
            JitOption::OptimizationLevel(v) => (7, v),
            JitOption::Target(v) => (9, v),
            JitOption::FallbackStrategy(v) => (10, v),
            JitOption::GenerateDebugInfo(v) => (11, u32::from(v)),
            JitOption::LogVerbose(v) => (12, u32::from(v)),
            JitOption::GenerateLineInfo(v) => (13, u32::from(v)),
            JitOption::CacheMode(v) => (14, v),
        }
    }
}

/// A loaded module owned by the cache, unloaded (with its context current) when the entry is
/// destroyed, i.e. after eviction once no lease holds it.
pub struct Module {
    raw: CUmodule,
    context: CUcontext,
    driver: Arc<Driver>,
}

// SAFETY: CUDA driver handles may be used from any thread; the cache unloads the module
// exactly once, from the memory tier's destroy, after the last lease is gone.
unsafe impl Send for Module {}
// SAFETY: as above; the handles are never mutated through `&Module`.
unsafe impl Sync for Module {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("raw", &self.raw)
            .field("context", &self.context)
            .finish()
    }
}

impl Module {
    pub fn raw(&self) -> CUmodule {
        self.raw
    }

    /// The context the module was loaded in: launch its kernels with this context current.
    pub fn context(&self) -> CUcontext {
        self.context
    }

    /// `cuModuleGetFunction`: the kernel `name`, valid while a lease on this module is held.
    /// [`Error::NotFound`] when the module has no such kernel.
    pub fn function(&self, name: &str) -> Result<CUfunction> {
        // SAFETY: the module and its context are live while `self` is (the entry is destroyed
        // only after the last lease drops, and the caller keeps the context until eviction).
        let found = unsafe {
            self.driver
                .with_context(self.context, || self.driver.function(self.raw, name))
        }??;
        found.ok_or(Error::NotFound)
    }

    /// Unloads the module with its context current; a null `raw` was unloaded already.
    fn unload(&mut self) -> std::result::Result<(), DestroyError> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        // SAFETY: the module belongs to `self.context`, which the caller keeps alive until it
        // has evicted it; `raw` was taken out above, so this is the only unload of the module.
        let unloaded = unsafe { self.driver.scoped(self.context, || self.driver.unload(raw)) };
        let (what, code) = match unloaded {
            Ok(0) => return Ok(()),
            Ok(code) => ("cuModuleUnload", code),
            Err(failed) => failed,
        };
        Err(DestroyError::new(
            code,
            format!("{what} failed: {}", self.driver.describe(code)),
        ))
    }
}

/// The memory tier's way to give the module back, reporting what the driver said.
impl Destroy for Module {
    fn destroy(mut self) -> std::result::Result<(), DestroyError> {
        self.unload()
    }
}

/// A module dropped outside the cache (a build abandoned half-way) is unloaded all the same.
impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.unload();
    }
}

/// What a lookup returns: the module stays loaded while any lease on it is held, even after
/// its context was evicted from the cache.
pub type ModuleLease = Lease<Vec<u8>, Module>;

/// Where a cache gets its driver and its disk tier.
#[derive(Default)]
pub struct CudaOptions {
    pub memory: memory::Options,
    /// `None`: memory only. Its operator key and key requirement are those of the
    /// [`DiskConfig`](crate::disk::DiskConfig) it was opened with.
    pub disk: Option<Arc<DiskCache>>,
    /// A driver already loaded; `None` loads one with [`Driver::load`].
    pub driver: Option<Arc<Driver>>,
    /// NVRTC already loaded; `None` loads it with [`Nvrtc::load`] on the first
    /// [`CudaCache::find_or_build_source`].
    pub nvrtc: Option<Arc<Nvrtc>>,
}

/// What a module is built from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Ptx(&'a [u8]),
    Cuda {
        source: &'a str,
        options: &'a [&'a str],
        nvrtc: &'a Nvrtc,
    },
}

/// One lookup: the context, what the module is built from and the JIT options.
#[derive(Clone, Copy)]
pub(crate) struct Input<'a> {
    context: Context,
    source: Source<'a>,
    options: &'a [JitOption],
}

/// What the cache learns about a context when it first sees it. A context evicted and then
/// used again (or a new context at a reused address) is registered anew, under a new number,
/// so it can never hit the old context's modules.
pub(crate) struct ContextInfo {
    device: CUdevice,
    device_name: String,
    capability: (i32, i32),
}

#[derive(Default)]
struct Counters {
    links: AtomicU64,
    link_failures: AtomicU64,
    nvrtc_compiles: AtomicU64,
    nvrtc_failures: AtomicU64,
}

/// Counters of a [`CudaCache`]: the memory tier's plus where each module came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CudaStats {
    pub memory: memory::Stats,
    /// PTX linked into a cubin (`cuLinkCreate` … `cuLinkComplete`).
    pub links: u64,
    /// Links that failed (bad PTX, bad options); the caller got [`Error::Build`].
    pub link_failures: u64,
    /// Modules loaded from a disk cubin without any PTX JIT.
    pub cubin_loads: u64,
    /// Disk cubins the driver refused; each was removed and the PTX linked again.
    pub cubins_rejected: u64,
    pub disk_hits: u64,
    pub disk_misses: u64,
    /// Disk reads or writes that failed; the lookup went on without the disk.
    pub disk_errors: u64,
    /// CUDA C++ sources compiled to PTX by NVRTC.
    pub nvrtc_compiles: u64,
    /// NVRTC compiles that failed; the caller got [`Error::Build`].
    pub nvrtc_failures: u64,
    /// The disk tier's own counters (integrity rejects, puts, evictions, I/O errors, …),
    /// all zero without a disk tier. A disk tier shared with other caches counts for all.
    pub disk: DiskStats,
}

/// The driver calls of the cache: a context's device, PTX (or NVRTC) and link, cubin load.
pub(crate) struct Cuda {
    driver: Arc<Driver>,
    counters: Counters,
}

impl Runtime for Cuda {
    /// The caller's context, by address.
    type Handle = usize;
    type Info = ContextInfo;
    type Value = Module;
    type Input<'a> = Input<'a>;

    fn describe(&self, input: Input<'_>) -> Result<ContextInfo> {
        // SAFETY: `Context` guarantees a live context.
        let (device, device_name, capability) = unsafe {
            self.driver.with_context(input.context.raw(), || {
                let device = self.driver.current_device()?;
                Ok::<_, Error>((
                    device,
                    self.driver.device_name(device)?,
                    self.driver.compute_capability(device)?,
                ))
            })
        }??;
        Ok(ContextInfo {
            device,
            device_name,
            capability,
        })
    }

    /// The kind of input, the JIT options in the caller's order (each a fixed 8 bytes, after a
    /// count), for CUDA C++ the NVRTC options (each length-prefixed, after a count), then the
    /// PTX or source text.
    fn memory_key(key: &mut Vec<u8>, input: Input<'_>) {
        key.push(match input.source {
            Source::Ptx(_) => 0,
            Source::Cuda { .. } => 1,
        });
        key.extend_from_slice(&(input.options.len() as u64).to_le_bytes());
        for option in input.options {
            let (o, v) = option.raw();
            key.extend_from_slice(&o.to_le_bytes());
            key.extend_from_slice(&v.to_le_bytes());
        }
        match input.source {
            Source::Ptx(ptx) => key.extend_from_slice(ptx),
            Source::Cuda {
                source, options, ..
            } => {
                append_strings(key, options);
                key.extend_from_slice(source.as_bytes());
            }
        }
    }

    fn disk_key(&self, context: &ContextInfo, input: Input<'_>) -> Result<Key> {
        disk_key(context, self.driver.version(), input)
    }

    fn load(&self, registered: &Registered<Self>, _: Input<'_>, cubin: &[u8]) -> Built<Module> {
        // The cubin passed the integrity check, so a refusal is the driver's own (a driver
        // build with the same version number, a changed GPU mode): the disk tier drops it and
        // the PTX is linked again.
        let raw = self.in_context(registered, || {
            self.driver.load_image(cubin).map_err(|code| {
                BuildError::new(
                    code,
                    format!("cuModuleLoadDataEx: {}", self.driver.describe(code)),
                )
            })
        })?;
        Ok((self.wrap(registered, raw), cubin.len() as u64))
    }

    fn build(
        &self,
        registered: &Registered<Self>,
        input: Input<'_>,
    ) -> std::result::Result<Compiled<Module>, BuildError> {
        // A loaded module cannot give its cubin back: the link's is the one the disk keeps.
        let (raw, cubin) = self.in_context(registered, || self.link(registered, input))?;
        Ok(Compiled {
            value: self.wrap(registered, raw),
            weight: cubin.len() as u64,
            bytes: Some(cubin),
        })
    }
}

impl Cuda {
    fn wrap(&self, registered: &Registered<Self>, raw: CUmodule) -> Module {
        Module {
            raw,
            context: registered.handle() as CUcontext,
            driver: Arc::clone(&self.driver),
        }
    }

    /// Runs `f` with the registered context current.
    fn in_context<T>(
        &self,
        registered: &Registered<Self>,
        f: impl FnOnce() -> std::result::Result<T, BuildError>,
    ) -> std::result::Result<T, BuildError> {
        let context = registered.handle() as CUcontext;
        // SAFETY: the context was wrapped in a `Context` by the caller of the lookup.
        match unsafe { self.driver.scoped(context, f) } {
            Ok(done) => done,
            Err((what, code)) => Err(BuildError::new(
                code,
                format!("{what} failed: {}", self.driver.describe(code)),
            )),
        }
    }

    /// Compiles CUDA C++ to PTX if need be, links the PTX into a cubin and loads that; runs
    /// with the module's context current. Returns the module and the cubin.
    fn link(
        &self,
        registered: &Registered<Self>,
        input: Input<'_>,
    ) -> std::result::Result<(CUmodule, Vec<u8>), BuildError> {
        let ptx = match input.source {
            Source::Ptx(ptx) => Cow::Borrowed(ptx),
            Source::Cuda {
                source,
                options,
                nvrtc,
            } => {
                bump(&self.counters.nvrtc_compiles);
                let ptx =
                    compile_cuda(nvrtc, registered.info(), source, options).inspect_err(|_| {
                        bump(&self.counters.nvrtc_failures);
                    })?;
                Cow::Owned(ptx)
            }
        };
        bump(&self.counters.links);
        let raw_options: Vec<(c_uint, usize)> = input
            .options
            .iter()
            .map(|o| {
                let (option, value) = o.raw();
                (option, value as usize)
            })
            .collect();
        let cubin = self
            .driver
            .link_ptx(&ptx, &raw_options)
            .map_err(|(code, log)| {
                bump(&self.counters.link_failures);
                BuildError::new(code, log)
            })?;
        let raw = self
            .driver
            .load_image(&cubin)
            .map_err(|code| self.load_error(code))?;
        Ok((raw, cubin))
    }

    fn load_error(&self, code: CUresult) -> BuildError {
        BuildError::new(
            code,
            format!(
                "cuModuleLoadDataEx refused the cubin it just linked: {}",
                self.driver.describe(code)
            ),
        )
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Cache of `CUmodule`s per (context, PTX, JIT options), backed by cubins on disk keyed by
/// (device name, compute capability, driver version, options, PTX).
///
/// The caller owns its contexts. Before destroying one (or resetting a device's primary
/// context), call [`CudaCache::evict_context`] (or [`CudaCache::evict_device`]): the modules
/// are unloaded then, with their context current, or when the last lease on each drops.
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
            cache: HandleCache::new(runtime, options.memory, options.disk),
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
            .get_or_init(|| Nvrtc::load().map(Arc::new))
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
        self.lookup(context, Source::Ptx(ptx), options)
    }

    /// The module for CUDA C++ `source`, compiled to PTX by NVRTC with `nvrtc_options` and
    /// linked with `jit_options`; otherwise as [`CudaCache::find_or_build_ptx`]. Unless the
    /// options name an architecture (`-arch` / `--gpu-architecture`), the PTX targets the
    /// context's device. The NVRTC version is part of the disk key. Kernels are looked up by
    /// their symbol name: declare them `extern "C"` to keep it unmangled.
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
        if source.is_empty() {
            return Err(Error::InvalidArgument("the CUDA source is empty".into()));
        }
        let nvrtc = self.nvrtc()?;
        let source = Source::Cuda {
            source,
            options: nvrtc_options,
            nvrtc,
        };
        self.lookup(context, source, jit_options)
    }

    fn lookup(
        &self,
        context: Option<Context>,
        source: Source<'_>,
        options: &[JitOption],
    ) -> Result<ModuleLease> {
        let context = match context {
            Some(context) => context,
            None => self.current_context()?.ok_or_else(|| {
                Error::InvalidArgument(
                    "no CUDA context is current on this thread and none was given".into(),
                )
            })?,
        };
        check_unique(options)?;
        let input = Input {
            context,
            source,
            options,
        };
        self.cache.find_or_build(context.raw() as usize, input)
    }

    /// Unlinks every module loaded in `context`; each is unloaded (with `context` current) now,
    /// or when its last lease drops. Call it before destroying the context. Returns how many
    /// were unlinked.
    pub fn evict_context(&self, context: CUcontext) -> Result<usize> {
        let context = context as usize;
        self.cache.evict(|r| r.handle() == context)
    }

    /// Unlinks every module of every context on device `device` (a `CUdevice` ordinal): for a
    /// primary-context reset or a device going away.
    pub fn evict_device(&self, device: CUdevice) -> Result<usize> {
        self.cache.evict(|r| r.info().device == device)
    }

    common_calls!();

    pub fn stats(&self) -> CudaStats {
        let c = &self.cache.runtime().counters;
        let get = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let tiers = self.cache.stats();
        CudaStats {
            memory: tiers.memory,
            links: get(&c.links),
            link_failures: get(&c.link_failures),
            cubin_loads: tiers.loads,
            cubins_rejected: tiers.rejected,
            disk_hits: tiers.disk_hits,
            disk_misses: tiers.disk_misses,
            disk_errors: tiers.disk_errors,
            nvrtc_compiles: get(&c.nvrtc_compiles),
            nvrtc_failures: get(&c.nvrtc_failures),
            disk: tiers.disk,
        }
    }
}

/// The same option twice would make the link order-dependent; refuse it up front.
fn check_unique(options: &[JitOption]) -> Result<()> {
    for (i, a) in options.iter().enumerate() {
        if options[..i].iter().any(|b| b.raw().0 == a.raw().0) {
            return Err(Error::InvalidArgument(format!(
                "JIT option {} is given twice",
                a.raw().0
            )));
        }
    }
    Ok(())
}

/// Runs NVRTC for the context's device unless the options pick an architecture.
fn compile_cuda(
    nvrtc: &Nvrtc,
    context: &ContextInfo,
    source: &str,
    options: &[&str],
) -> std::result::Result<Vec<u8>, BuildError> {
    let picks_arch = options
        .iter()
        .any(|o| o.starts_with("-arch") || o.starts_with("--gpu-architecture"));
    let arch;
    let mut all: Vec<&str> = options.to_vec();
    if !picks_arch {
        let (major, minor) = context.capability;
        arch = format!("--gpu-architecture=compute_{major}{minor}");
        all.push(&arch);
    }
    nvrtc.compile(source, &all)
}

/// A count, then each string length-prefixed: no two lists encode alike.
fn append_strings(out: &mut Vec<u8>, strings: &[&str]) {
    out.extend_from_slice(&(strings.len() as u64).to_le_bytes());
    for s in strings {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
}

/// The disk key: what makes a cubin valid for a GPU (device name, compute capability, driver
/// version, which is also the PTX compiler's; for CUDA C++ the NVRTC version) and what it was
/// built from, but no handle, so it holds across processes and contexts. NVRTC options keep
/// their order: `-I` search order and repeated `-D` depend on it.
fn disk_key(context: &ContextInfo, driver_version: i32, input: Input<'_>) -> Result<Key> {
    let mut builder = KeyBuilder::new();
    builder
        .backend("cuda")
        .device_name(&context.device_name)
        .driver_version(driver_version.to_string())
        .extra(
            "compute_capability",
            format!("{}.{}", context.capability.0, context.capability.1),
        );
    match input.source {
        Source::Ptx(ptx) => {
            builder.extra("input", "ptx").source(ptx);
        }
        Source::Cuda {
            source,
            options,
            nvrtc,
        } => {
            let (major, minor) = nvrtc.version();
            let mut encoded = Vec::new();
            append_strings(&mut encoded, options);
            builder
                .extra("input", "cuda")
                .compiler_version(format!("nvrtc {major}.{minor}"))
                .extra("nvrtc_options", encoded)
                .source(source);
        }
    }
    for option in input.options {
        let (o, v) = option.raw();
        builder.option(o.to_string(), v.to_string());
    }
    builder.finish()
}
