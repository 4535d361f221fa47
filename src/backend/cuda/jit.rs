//! The JIT options a PTX link may be given, as the C API passes them.

use crate::error::{Error, Result};

/// One JIT option for linking PTX. Options whose value is a pointer (log buffers) or an
/// output (wall time) belong to kcache and cannot be passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JitOption {
    /// `CU_JIT_MAX_REGISTERS`.
    MaxRegisters(u32),
    /// `CU_JIT_THREADS_PER_BLOCK`. Not with [`JitOption::Target`], which NVIDIA documents it
    /// cannot be combined with: the lookup is refused.
    ThreadsPerBlock(u32),
    /// `CU_JIT_OPTIMIZATION_LEVEL` (0–4).
    OptimizationLevel(u32),
    /// `CU_JIT_TARGET`: a `CUjit_target` value such as 90 for `sm_90`, or
    /// `CU_COMPUTE_ACCELERATED_TARGET_BASE` (0x10000) + 90 for `sm_90a`; the driver refuses
    /// any other value.
    Target(u32),
    /// `CU_JIT_FALLBACK_STRATEGY`. NVIDIA documents that it "cannot be used with cuLink*
    /// APIs", and kcache always links: a lookup given it is refused.
    FallbackStrategy(u32),
    /// `CU_JIT_GENERATE_DEBUG_INFO`.
    GenerateDebugInfo(bool),
    /// `CU_JIT_LOG_VERBOSE`: the JIT's information log (registers, spills, …) goes to kcache's
    /// log at `info` (`KCACHE_LOG=info`), one message per link.
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

/// Refuses what the driver documents as invalid for a link, up front: the same option twice
/// (the link would depend on the order), `CU_JIT_FALLBACK_STRATEGY` (not for `cuLink*`), and
/// `CU_JIT_THREADS_PER_BLOCK` with `CU_JIT_TARGET`.
pub(super) fn check(options: &[JitOption]) -> Result<()> {
    let refuse = |why: String| Err(Error::InvalidArgument(why));
    for (i, a) in options.iter().enumerate() {
        if options[..i].iter().any(|b| b.raw().0 == a.raw().0) {
            return refuse(format!("JIT option {} is given twice", a.raw().0));
        }
    }
    let has = |f: fn(&JitOption) -> bool| options.iter().any(f);
    if has(|o| matches!(o, JitOption::FallbackStrategy(_))) {
        return refuse(
            "CU_JIT_FALLBACK_STRATEGY cannot be used with the cuLink* calls kcache links with"
                .into(),
        );
    }
    if has(|o| matches!(o, JitOption::ThreadsPerBlock(_)))
        && has(|o| matches!(o, JitOption::Target(_)))
    {
        return refuse("CU_JIT_THREADS_PER_BLOCK cannot be combined with CU_JIT_TARGET".into());
    }
    Ok(())
}
