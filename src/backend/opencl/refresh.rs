//! Warm end to end on PoCL: the stored binary carries the work-group code that launches
//! compiled, so that the next process's first launches compile nothing.
//!
//! A PoCL program binary is PoCL's own directory for the program, packed: its bitcode,
//! work-group code for any local size (compiled by the first binary query, which can take
//! longer than the build) and the code specialised for each launch configuration compiled so
//! far. It is packed once, at the first query, and never again. Querying the cached program
//! right after its build would freeze a binary without any launch's code, so on PoCL:
//! - for the processes waiting on this build, the background writer builds a *sibling* from
//!   the same source ([`Sibling`]) and stores its binary; the cached program is not queried;
//! - at flush and at drop, [`Refresh::run`] queries each program built here, whose binary now
//!   holds what its launches compiled, and rewrites the entry when that is larger.
//!
//! Other drivers' binaries do not change with launches, and the cached program is queried
//! directly on the background writer.

use std::ffi::CString;
use std::time::Duration;

use parking_lot::Mutex;

use super::runtime::{self, ContextRef, Device, DeviceIdentity, Program};
use super::sys::{Api, cl_context};
use crate::disk::{Descriptor, DiskCache};
use crate::error::BuildError;
use crate::key::Key;

/// The platform name PoCL reports.
const POCL_PLATFORM: &str = "Portable Computing Language";

/// Whether programs built for `identity` get a sibling and a refresh.
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

/// Programs built here whose stored binary may grow with what their launches compiled.
#[derive(Default)]
pub(super) struct Refresh {
    built: Mutex<Vec<(Key, Descriptor, Program, Duration)>>,
}

impl Refresh {
    /// Remembers a program built here in `build_time`, with a reference of its own.
    pub(super) fn note(
        &self,
        key: Key,
        descriptor: &Descriptor,
        program: &Program,
        build_time: Duration,
    ) {
        if let Ok(program) = program.retain() {
            let noted = (key, descriptor.clone(), program, build_time);
            self.built.lock().push(noted);
        }
    }

    /// Rewrites each remembered entry whose program's binary is larger than the stored one,
    /// and forgets the program (its binary is packed now, and will not grow again). Returns
    /// how many entries were rewritten; a failure costs only its refresh.
    pub(super) fn run(&self, disk: &DiskCache) -> u64 {
        let built = std::mem::take(&mut *self.built.lock());
        let mut rewritten = 0;
        for (key, descriptor, program, build_time) in built {
            let Ok(binary) = program.binary() else {
                continue;
            };
            let stored = disk.stored_len(&key).unwrap_or(0);
            if binary.len() as u64 > stored
                && disk
                    .put_described(&key, &binary, build_time, &descriptor)
                    .is_ok()
            {
                rewritten += 1;
            }
        }
        rewritten
    }
}
