//! What the cache hands out: a module loaded in a caller's context, unloaded with that
//! context current once it has left the cache and no lease holds it.

use std::sync::Arc;

use super::driver::{CUcontext, CUfunction, CUmodule, Driver};
use crate::backend::handle_cache::Destroy;
use crate::error::{DestroyError, Error, Result};
use crate::memory::Lease;

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
    /// ([`CudaCache::evict_context`](super::CudaCache::evict_context)).
    pub unsafe fn from_raw(raw: CUcontext) -> Option<Context> {
        (!raw.is_null()).then_some(Context(raw))
    }

    pub fn raw(self) -> CUcontext {
        self.0
    }
}

/// A loaded module owned by the cache, unloaded (with its context current) when the entry is
/// destroyed, i.e. after eviction once no lease holds it.
pub struct Module {
    pub(super) raw: CUmodule,
    pub(super) context: CUcontext,
    pub(super) driver: Arc<Driver>,
}

// SAFETY: CUDA driver handles may be used from any thread; the cache unloads the module
// exactly once, from the memory tier's destroy, after the last lease is gone.
unsafe impl Send for Module {}
// SAFETY: as above; the handles are never mutated through `&Module`.
unsafe impl Sync for Module {}

debug_fields!(Module { raw, context });

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
