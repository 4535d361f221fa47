//! What the layer remembers about the application's programs and kernels, by handle.
//!
//! A source program the application builds through the layer stays the application's handle
//! (its reference count, context and source are the driver's), while the built program behind
//! it comes from kcache: queries about the build and kernel creation go to that one. Kernels
//! made from it are linked back to the application's program, which each of them keeps alive
//! (as a driver's kernel keeps its program), so that `CL_KERNEL_PROGRAM` names it.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

/// Handles are addresses: foldhash, as the memory tier uses, rather than SipHash on the path
/// of every intercepted query.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use crate::backend::opencl::Program;

/// A source program of the application's.
pub(super) struct Source {
    pub context: usize,
    pub text: String,
    /// The program kcache served its last build from; `None` until then. A program whose
    /// build goes to the driver is forgotten.
    pub built: Option<Program>,
    /// The options of a served compile: `built` is a compiled object (`clCompileProgram`).
    pub object_options: Option<String>,
}

#[derive(Default)]
pub(super) struct Tracked {
    programs: RwLock<HashMap<usize, Source>>,
    /// Kernel made from a served build → the application's program.
    kernels: RwLock<HashMap<usize, usize>>,
    /// How many kernels are linked: releases and queries of kernels skip the lock at zero.
    linked: AtomicUsize,
}

impl Tracked {
    /// Remembers a new source program; one left at the same address by a program freed
    /// behind the layer's back is replaced.
    pub fn add(&self, program: usize, context: usize, text: String) {
        let stale = self.programs.write().insert(
            program,
            Source {
                context,
                text,
                built: None,
                object_options: None,
            },
        );
        drop(stale);
    }

    /// Forgets `program`: freed, or a handle the driver reused for a program that is not a
    /// source program. True when its build was served.
    pub fn forget(&self, program: usize) -> bool {
        if !self.is_tracked(program) {
            return false;
        }
        let gone = self.programs.write().remove(&program);
        gone.is_some_and(|source| source.built.is_some())
    }

    pub fn is_tracked(&self, program: usize) -> bool {
        self.programs.read().contains_key(&program)
    }

    /// The context and source of a tracked program.
    pub fn source(&self, program: usize) -> Option<(usize, String)> {
        let programs = self.programs.read();
        programs
            .get(&program)
            .map(|source| (source.context, source.text.clone()))
    }

    /// Sets the served build of a tracked program: an executable, or a compiled object with
    /// the options of its compile.
    pub fn set_built(&self, program: usize, built: Program, object_options: Option<String>) {
        let mut programs = self.programs.write();
        let old = match programs.get_mut(&program) {
            Some(source) => {
                source.object_options = object_options;
                source.built.replace(built)
            }
            None => Some(built),
        };
        drop(programs);
        drop(old);
    }

    /// The handle of the served build of `program`, if any. It lives as long as the
    /// application holds `program`, which it does while it passes it to a call.
    pub fn built(&self, program: usize) -> Option<usize> {
        let programs = self.programs.read();
        let source = programs.get(&program)?;
        source.built.as_ref().map(|built| built.raw() as usize)
    }

    /// The options of the served compile of `program`, if its served build is a compiled
    /// object.
    pub fn object_options(&self, program: usize) -> Option<String> {
        let programs = self.programs.read();
        programs.get(&program)?.object_options.clone()
    }

    pub fn link_kernel(&self, kernel: usize, program: usize) {
        if self.kernels.write().insert(kernel, program).is_none() {
            self.linked.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Unlinks `kernel`, returning the program it was linked to.
    pub fn unlink_kernel(&self, kernel: usize) -> Option<usize> {
        if self.linked.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let program = self.kernels.write().remove(&kernel);
        if program.is_some() {
            self.linked.fetch_sub(1, Ordering::Relaxed);
        }
        program
    }

    /// Whether a kernel made from the served build of `program` is still alive.
    pub fn has_kernels(&self, program: usize) -> bool {
        self.linked.load(Ordering::Relaxed) != 0
            && self.kernels.read().values().any(|&p| p == program)
    }

    /// The application's program of a linked kernel.
    pub fn program_of(&self, kernel: usize) -> Option<usize> {
        if self.linked.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.kernels.read().get(&kernel).copied()
    }
}
