//! Lookups that hand out a `cl_program` reference of the caller's own instead of a lease, for
//! one device or several: what code written against `clCreateProgramWithSource` +
//! `clBuildProgram` + `clReleaseProgram` expects, so that porting it changes only the call
//! that made the program.

use super::cache::OpenClCache;
use super::runtime::{ContextRef, Device, Program};
use super::sys::Api;
use crate::error::{Error, Result};

impl OpenClCache {
    /// As [`OpenClCache::find_or_build`], but the program comes back as a reference of its own
    /// (`clRetainProgram`): drop it, or release its [`Program::into_raw`] handle with
    /// `clReleaseProgram`. The cache keeps its own reference; eviction gives up only that one,
    /// so the program lives until both are gone.
    pub fn find_or_build_program(
        &self,
        context: ContextRef<'_>,
        device: Device,
        sources: &[&str],
        options: &str,
    ) -> Result<Program> {
        self.find_or_build(context, device, sources, options)?
            .value()
            .retain()
    }

    /// [`OpenClCache::find_or_build_program`] for each of `devices`, or for every device of
    /// `context` when `None` (as `clBuildProgram` with no device list): one program per
    /// device, in that order, each built (and kept on disk) for its device alone, under that
    /// device's identity. Each device's outcome is its own: a build failure's
    /// [`Error::Build`] holds that device's compiler log.
    ///
    /// Fails as a whole only when the devices cannot be listed: an empty `devices`, or a
    /// context the driver cannot report the devices of.
    pub fn find_or_build_programs(
        &self,
        context: ContextRef<'_>,
        devices: Option<&[Device]>,
        sources: &[&str],
        options: &str,
    ) -> Result<Vec<Result<Program>>> {
        let devices = match devices {
            Some(devices) => devices.to_vec(),
            None if context.raw().is_null() => {
                return Err(Error::InvalidArgument(
                    "the context must not be null".into(),
                ));
            }
            None => context_devices(context)?,
        };
        if devices.is_empty() {
            return Err(Error::InvalidArgument("no device to build for".into()));
        }
        Ok(devices
            .into_iter()
            .map(|device| self.find_or_build_program(context, device, sources, options))
            .collect())
    }
}

/// The devices of `context` (`CL_CONTEXT_DEVICES`), in its order: those a lookup without a
/// device list builds for.
pub fn context_devices(context: ContextRef<'_>) -> Result<Vec<Device>> {
    context.devices(Api::get()?)
}
