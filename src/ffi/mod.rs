//! The C ABI (`include/kcache.h`, generated from this module by cbindgen).
//!
//! Rules every exported function follows, and the helpers that implement them:
//!
//! - The body runs inside [`guard`] (functions returning [`kc_status`]) or [`guard_value`]
//!   (functions returning a value): a Rust error becomes its status through [`status_of`] plus
//!   a thread-local message for `kc_last_error_message()`, and a panic becomes `KC_ERR_PANIC`
//!   (or the given NULL/0), never an unwind into C. Only functions that return a constant
//!   (`kc_version`, `kc_cache_options_default`) have no body to guard.
//! - Pointer arguments are checked with [`non_null`] (byte ranges with [`byte_slice`]): NULL
//!   is `KC_ERR_INVALID_ARGUMENT` with a message naming the argument. `*_free`/`*_release`
//!   accept NULL.
//! - Out-parameters are written only on success.

mod args;
mod backend_common;
mod cache;
pub mod cuda;
pub mod disk;
pub mod opencl;
mod status;
pub mod vulkan;

pub use cache::*;
pub use status::*;
