//! Warm end to end on PoCL: the stored binary carries the work-group code that launches
//! compiled, so that the next process's first launches compile nothing; and a lone process's
//! miss costs what a plain build costs.
//!
//! A PoCL program binary is PoCL's own directory for the program, packed: its bitcode,
//! work-group code for any local size (compiled by the first binary query, which can take
//! longer than the build, and holds PoCL's compiler meanwhile) and the code specialised for
//! each launch configuration compiled so far. It is packed once, at the first query, and never
//! again. Querying the cached program right after its build would freeze a binary without any
//! launch's code, and compete with the caller's first launches for PoCL's compiler. So on PoCL
//! the bytes are held back ([`DiskBytes::held`](crate::disk::DiskBytes::held)):
//! - when another process waits for the entry, the background writer builds a *sibling* from
//!   the same source ([`Sibling`]) and stores its binary. It costs a build more than querying
//!   the cached program, but it leaves the caller's program alone: PoCL 3.1 aborts
//!   (`pocl_release_dlhandle_cache: Assertion 'found->ref_count > 0' failed`) when a program's
//!   binary is queried on one thread while the caller launches on another; measured in about
//!   one in seven two-process runs of `benches/node.rs`, against none in eighteen with the
//!   sibling;
//! - at flush (and when the cache is freed), the cached program's binary, which then holds
//!   what its launches compiled: stored, or replacing the sibling's when it is larger (in
//!   `tests/node_flight.rs` on PoCL 3.1 it was the same size, and nothing was rewritten).
//!
//! Other drivers' binaries do not change with launches, and the cached program is queried
//! directly on the background writer.

use std::ffi::CString;

use super::runtime::{self, ContextRef, Device, DeviceIdentity, Program};
use super::sys::{Api, cl_context};
use crate::error::BuildError;

/// The platform name PoCL reports.
const POCL_PLATFORM: &str = "Portable Computing Language";

/// Whether the binaries of programs built for `identity` are held back (see above).
pub(super) fn applies_to(identity: &DeviceIdentity) -> bool {
    identity.platform_name == POCL_PLATFORM
}

/// A second build of a program's source, made on the background writer for its binary.
pub(super) struct Sibling {
    api: &'static Api,
    /// A reference to the cached program: it keeps the context alive until the sibling is
    /// built.
    of: Program,
    context: cl_context,
    device: Device,
    source: String,
    options: CString,
}

// SAFETY: the context handle is used only while `of`, which holds a reference to that
// context, is alive; OpenCL contexts are thread-safe (OpenCL 1.1+, appendix A.2).
unsafe impl Send for Sibling {}

impl Sibling {
    pub(super) fn new(
        api: &'static Api,
        of: &Program,
        context: ContextRef<'_>,
        device: Device,
        sources: &[&str],
        options: &CString,
    ) -> Option<Sibling> {
        Some(Sibling {
            api,
            of: of.retain().ok()?,
            context: context.raw(),
            device,
            source: sources.concat(),
            options: options.clone(),
        })
    }

    /// Builds the sibling and returns its binary.
    pub(super) fn binary(self) -> Result<Vec<u8>, BuildError> {
        // SAFETY: `self.of` holds a reference to the context, so it is live.
        let context = unsafe { ContextRef::from_raw(self.context) };
        let sibling = runtime::build_from_source(
            self.api,
            context,
            self.device,
            &[&self.source],
            &self.options,
        )?;
        drop(self.of);
        sibling
            .binary()
            .map_err(|e| BuildError::new(0, e.to_string()))
    }
}
