//! A GPU runtime's shared library, opened at run time: kcache links against none, so that it
//! loads on machines without them. Every backend opens its runtime this one way, and a missing
//! library or symbol is [`Error::Unavailable`] with the reason, never a panic.

use std::ffi::OsString;
use std::fmt::Display;
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::error::{Error, Result};

/// An opened runtime library and what to call it in messages.
pub struct RuntimeLibrary {
    library: Library,
    /// What the library is ("CUDA driver", "NVRTC", "OpenCL library").
    what: &'static str,
    path: PathBuf,
}

/// The library the environment variable `name` names, if set and not empty. Read through
/// [`crate::env::var_os`], so a secure-execution process never takes a library from it.
pub fn from_env(name: &str) -> Option<OsString> {
    crate::env::var_os(name).filter(|p| !p.is_empty())
}

/// The error of a runtime that cannot be opened, in the one shape every backend reports.
pub fn cannot_load(what: &str, path: &Path, reason: impl Display) -> Error {
    Error::Unavailable(format!(
        "no {what}: cannot load {what} {}: {reason}",
        path.display()
    ))
}

impl RuntimeLibrary {
    /// Opens `path` (a path, or a soname searched the usual dlopen way).
    pub fn open(what: &'static str, path: &Path) -> Result<RuntimeLibrary> {
        // SAFETY: opening a shared library runs its initialisers. kcache opens only what the
        // caller or the environment names as this runtime, vouched for as for LD_PRELOAD, or
        // the runtime's well-known soname, whose initialisers run in any process.
        let library = unsafe { Library::new(path) }.map_err(|e| cannot_load(what, path, e))?;
        Ok(RuntimeLibrary {
            library,
            what,
            path: path.to_path_buf(),
        })
    }

    /// Keeps the library open for the rest of the process, for a runtime that must never be
    /// closed (one that starts threads or exit handlers of its own). Symbols copied out of it
    /// stay valid for good.
    pub fn keep_open(self) {
        std::mem::forget(self.library);
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Copies the function pointer `name` out of the library.
    ///
    /// # Safety
    /// `T` must be the `extern "C"` function type of `name` as the runtime defines it, and the
    /// pointer must be used only while this library stays open.
    pub unsafe fn symbol<T: Copy>(&self, name: &str) -> Result<T> {
        // SAFETY: forwarded from the caller's contract.
        match unsafe { self.library.get::<T>(name.as_bytes()) } {
            Ok(symbol) => Ok(*symbol),
            Err(e) => Err(Error::Unavailable(format!(
                "{} {} lacks {name}: {e}",
                self.what,
                self.path.display()
            ))),
        }
    }
}
