//! The driver calls of the CUDA cache, as the backend skeleton asks for them: a context's
//! device, PTX (or CUDA C++ through NVRTC) linked into a cubin, a cubin loaded, and the keys.

use std::borrow::Cow;
use std::ffi::c_uint;
use std::sync::Arc;

use super::cache::Counters;
use super::driver::{CUcontext, CUdevice, CUmodule, CUresult, Driver};
use super::jit::JitOption;
use super::module::{Context, Module};
use super::nvrtc::{Compiled as NvrtcOutput, Nvrtc};
use crate::backend::handle_cache::{Compiled, Registered, Runtime};
use crate::disk::Descriptor;
use crate::error::{BuildError, Error, Result};
use crate::headers::{Embedded, Headers};
use crate::key::{Key, KeyBuilder};
use crate::memory::Built;
use crate::metrics::Backend;
use crate::stats::bump;

/// What a module is built from.
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    Ptx(&'a [u8]),
    Cuda {
        source: &'a str,
        options: &'a [&'a str],
        nvrtc: &'a Nvrtc,
        /// The in-memory headers NVRTC is given, found by their include names.
        embedded: &'a [Embedded<'a>],
        /// The headers the source reads, in memory or found through the options' `-I`
        /// directories.
        headers: &'a Headers,
    },
}

/// One lookup: the context, what the module is built from and the JIT options.
#[derive(Clone, Copy)]
pub(crate) struct Input<'a> {
    pub(super) context: Context,
    pub(super) source: Source<'a>,
    pub(super) options: &'a [JitOption],
}

/// What the cache learns about a context when it first sees it. A context evicted and then
/// used again (or a new context at a reused address) is registered anew, under a new number,
/// so it can never hit the old context's modules.
pub(crate) struct ContextInfo {
    pub(super) device: CUdevice,
    device_name: String,
    capability: (i32, i32),
}

/// The driver calls of the cache: a context's device, PTX (or NVRTC) and link, cubin load.
pub(crate) struct Cuda {
    pub(super) driver: Arc<Driver>,
    pub(super) counters: Counters,
}

impl Runtime for Cuda {
    /// The caller's context, by address.
    type Handle = usize;
    type Info = ContextInfo;
    type Value = Module;
    type Input<'a> = Input<'a>;
    const BACKEND: Backend = Backend::Cuda;

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
                source,
                options,
                headers,
                ..
            } => {
                if !headers.is_empty() {
                    key.extend_from_slice(&headers.digest());
                }
                append_strings(key, options);
                key.extend_from_slice(source.as_bytes());
            }
        }
    }

    fn disk_key(&self, context: &ContextInfo, input: Input<'_>) -> Result<Key> {
        disk_key(context, &self.driver, input)
    }

    fn load(&self, registered: &Registered<Self>, _: Input<'_>, cubin: &[u8]) -> Built<Module> {
        // The cubin passed the integrity check, so a refusal of the image itself is the
        // driver's own (a new driver build, another GPU mode): the disk tier drops it and the
        // PTX is linked again. Any other failure (out of memory, a lost context, the error of
        // an earlier asynchronous launch) says nothing about the cubin: the entry stays and the
        // caller gets the error, as a link would fail the same way.
        let raw = self
            .in_context(registered, || {
                self.driver.load_image(cubin).map_err(|code| {
                    BuildError::new(
                        code,
                        format!("cuModuleLoadDataEx: {}", self.driver.describe(code)),
                    )
                })
            })
            // A failed context push or pop is never an image refusal: transient too.
            .map_err(|e| {
                if refuses_image(e.code) {
                    e
                } else {
                    BuildError::transient(e.code, e.message)
                }
            })?;
        Ok((self.wrap(registered, raw), cubin.len() as u64))
    }

    fn build(
        &self,
        registered: &Registered<Self>,
        input: Input<'_>,
    ) -> std::result::Result<Compiled<Module>, BuildError> {
        // A loaded module cannot give its cubin back: the link's is the one the disk keeps.
        let (raw, cubin, kernels) = self.in_context(registered, || self.link(registered, input))?;
        Ok(Compiled {
            value: self.wrap(registered, raw),
            weight: cubin.len() as u64,
            bytes: Some(cubin.into()),
            descriptor: Descriptor::new("cuda", &registered.info().device_name, &kernels),
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
    /// with the module's context current. Returns the module, the cubin and the names of the
    /// PTX's kernels.
    fn link(
        &self,
        registered: &Registered<Self>,
        input: Input<'_>,
    ) -> std::result::Result<(CUmodule, Vec<u8>, String), BuildError> {
        let ptx = match input.source {
            Source::Ptx(ptx) => Cow::Borrowed(ptx),
            Source::Cuda {
                source,
                options,
                nvrtc,
                embedded,
                ..
            } => {
                bump(&self.counters.nvrtc_compiles, 1);
                let jit = !input.options.is_empty();
                let driver = self.driver.version();
                let program = Program {
                    source,
                    embedded,
                    options,
                };
                let compiled = compile_cuda(nvrtc, driver, registered.info(), program, jit)
                    .inspect_err(|_| {
                        bump(&self.counters.nvrtc_failures, 1);
                    })?;
                if compiled.is_cubin {
                    // NVRTC's own cubin: no driver JIT, so no PTX version for it to refuse.
                    let raw = self
                        .driver
                        .load_image(&compiled.image)
                        .map_err(|code| self.load_error(code))?;
                    return Ok((raw, compiled.image, entry_names(&compiled.ptx)));
                }
                Cow::Owned(compiled.image)
            }
        };
        bump(&self.counters.links, 1);
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
                bump(&self.counters.link_failures, 1);
                BuildError::new(code, log)
            })?;
        let raw = self
            .driver
            .load_image(&cubin)
            .map_err(|code| self.load_error(code))?;
        Ok((raw, cubin, entry_names(&ptx)))
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

/// The `cuModuleLoadDataEx` results that condemn the image rather than the moment:
/// `CUDA_ERROR_INVALID_IMAGE` (200), `CUDA_ERROR_NO_BINARY_FOR_GPU` (209),
/// `CUDA_ERROR_INVALID_PTX` (218) and `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` (222).
fn refuses_image(code: CUresult) -> bool {
    matches!(code, 200 | 209 | 218 | 222)
}

/// Runs NVRTC on `program` for the context's device unless the options pick an architecture (a real one,
/// `sm_XY`, gives a cubin; a virtual one PTX). For the device, a cubin for its own
/// architecture when NVRTC knows it and no JIT options (`jit`) ask for the driver's JIT: it
/// needs no driver JIT, so an NVRTC newer than the driver works, and it is the
/// non-relocatable code a program gets from `nvcc`. Otherwise PTX for the highest
/// architecture NVRTC supports up to the device's, which the driver JIT-compiles upward; PTX
/// from an NVRTC newer than the driver (`driver`, `cuDriverGetVersion`) is refused before
/// compiling, as the driver's JIT would refuse it.
fn compile_cuda(
    nvrtc: &Nvrtc,
    driver: i32,
    context: &ContextInfo,
    program: Program<'_>,
    jit: bool,
) -> std::result::Result<NvrtcOutput, BuildError> {
    let Program {
        source,
        embedded,
        options,
    } = program;
    if let Some(arch) = picked_arch(options) {
        let cubin = arch.starts_with("sm_");
        if !cubin {
            ptx_for_driver(nvrtc, driver)?;
        }
        return nvrtc.compile_to(source, embedded, options, cubin);
    }
    let (major, minor) = context.capability;
    let device = major * 10 + minor;
    let archs = nvrtc.supported_archs();
    let cubin = !jit && archs.contains(&device);
    let arch = if cubin {
        format!("--gpu-architecture=sm_{device}")
    } else {
        ptx_for_driver(nvrtc, driver)?;
        let best = archs.iter().rev().find(|&&a| a <= device).ok_or_else(|| {
            let (nvrtc_major, nvrtc_minor) = nvrtc.version();
            BuildError::new(
                -1,
                format!(
                    "NVRTC {nvrtc_major}.{nvrtc_minor} supports no architecture up to the \
                     device's {major}.{minor}"
                ),
            )
        })?;
        format!("--gpu-architecture=compute_{best}")
    };
    let mut all: Vec<&str> = options.to_vec();
    all.push(&arch);
    nvrtc.compile_to(source, embedded, &all, cubin)
}

/// What NVRTC compiles: the source, its in-memory headers and the caller's options.
#[derive(Clone, Copy)]
struct Program<'a> {
    source: &'a str,
    embedded: &'a [Embedded<'a>],
    options: &'a [&'a str],
}

/// Refuses to make PTX for the driver's JIT with an NVRTC of a newer CUDA release: its PTX
/// names a PTX ISA the driver does not know, and the link would fail with
/// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` (222) after a wasted compile. The error carries that
/// code and says what works instead.
fn ptx_for_driver(nvrtc: &Nvrtc, driver: i32) -> std::result::Result<(), BuildError> {
    const CUDA_ERROR_UNSUPPORTED_PTX_VERSION: i32 = 222;
    if !nvrtc.is_newer_than(driver) {
        return Ok(());
    }
    let (major, minor) = nvrtc.version();
    Err(BuildError::new(
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        format!(
            "NVRTC {major}.{minor} is newer than the driver (CUDA {}.{}): the driver's JIT \
             cannot take its PTX, which JIT options, a virtual architecture (compute_XY) or a \
             device NVRTC does not know need. Pass NVRTC options (--maxrregcount, \
             -arch=sm_XY) instead of JIT options, or use the driver's own NVRTC",
            driver / 1000,
            driver % 1000 / 10
        ),
    ))
}

/// The architecture the NVRTC options name (`-arch=X`, `--gpu-architecture=X`, or either
/// flag followed by `X`), if any.
pub(super) fn picked_arch<'a>(options: &[&'a str]) -> Option<&'a str> {
    const FLAGS: [&str; 2] = ["-arch", "--gpu-architecture"];
    options.iter().enumerate().find_map(|(i, o)| {
        if FLAGS.contains(o) {
            return options.get(i + 1).copied();
        }
        FLAGS
            .iter()
            .find_map(|flag| o.strip_prefix(flag)?.strip_prefix('='))
    })
}

/// The names the PTX's `.entry` directives give its kernels, space-separated (mangled for
/// CUDA C++ kernels not declared `extern "C"`, as the driver knows them).
fn entry_names(ptx: &[u8]) -> String {
    let text = String::from_utf8_lossy(ptx);
    let mut names = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if !words.any(|w| w == ".entry") {
            continue;
        }
        // `.entry name(` or `.entry name (`: the name ends at the parenthesis.
        match words.next().and_then(|w| w.split('(').next()) {
            Some(name) if !name.is_empty() => names.push(name.to_owned()),
            _ => {}
        }
    }
    names.join(" ")
}

/// A count, then each string length-prefixed: no two lists encode alike.
fn append_strings(out: &mut Vec<u8>, strings: &[&str]) {
    out.extend_from_slice(&(strings.len() as u64).to_le_bytes());
    for s in strings {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
}

/// The disk key: what makes a cubin valid for a GPU (device name, compute capability, the
/// driver's CUDA version and its build, whose PTX JIT made the cubin; for CUDA C++ the NVRTC
/// version and build, whose own cubins are NVRTC's machine code) and what it was built from,
/// but no handle, so it holds across processes and contexts. NVRTC options keep their order: `-I` search order and repeated `-D` depend on it.
fn disk_key(context: &ContextInfo, driver: &Driver, input: Input<'_>) -> Result<Key> {
    let mut builder = KeyBuilder::new();
    builder
        .backend("cuda")
        .device_name(&context.device_name)
        .driver_version(driver.version().to_string())
        .extra("driver_build", driver.build())
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
            headers,
            ..
        } => {
            headers.add_to(&mut builder);
            let (major, minor) = nvrtc.version();
            let mut encoded = Vec::new();
            append_strings(&mut encoded, options);
            builder
                .extra("input", "cuda")
                .compiler_version(format!("nvrtc {major}.{minor}"))
                .extra("nvrtc_build", nvrtc.build())
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

#[cfg(test)]
mod tests {
    use super::{entry_names, picked_arch};

    #[test]
    fn the_architecture_an_option_names() {
        assert_eq!(picked_arch(&["-DX", "-arch=sm_80"]), Some("sm_80"));
        assert_eq!(
            picked_arch(&["--gpu-architecture=compute_75"]),
            Some("compute_75")
        );
        assert_eq!(picked_arch(&["-arch", "sm_90"]), Some("sm_90"));
        assert_eq!(picked_arch(&["-architecture=x", "-DARCH"]), None);
    }

    #[test]
    fn entry_names_are_the_ptx_kernels() {
        let ptx = b".version 7.0\n.target sm_50\n.visible .entry add(\n .param .u64 a\n)\n{\n}\n\
                    .entry _Z5scalePf (.param .u64 p)\n{\n}\n.func helper()\n";
        assert_eq!(entry_names(ptx), "add _Z5scalePf");
        assert_eq!(entry_names(b".version 7.0\n"), "");
    }
}
