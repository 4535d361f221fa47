//! The C ABI (`include/kcache.h`, generated from this module by cbindgen).
//!
//! One C object per file: `cache.rs` (`kc_cache`), `lease.rs` (`kc_lease`), `key_builder.rs`
//! (`kc_key_builder`), `persistence*.rs` (`kc_persistence`), `buffer.rs` (`kc_buffer`), `tiered.rs`
//! (`kc_tiered_find_or_build`), `log.rs` (`kc_set_log_callback`), `metrics.rs`
//! (`kc_metrics_render`), one file per backend (Vulkan's pipeline descriptions in
//! `vulkan_spec.rs`); `status.rs` holds the status codes and the other library-level functions,
//! `args.rs` the argument conventions they all share, `backend_common.rs` what the backends' C APIs
//! do alike.
//!
//! Names (see `docs/c-api-conventions.md`): every exported function is `kc_<object>_<verb>`,
//! `<object>` being an opaque type's name without `kc_`, or a library or backend function
//! (`kc_version`, `kc_<backend>_available`, `kc_tiered_find_or_build`, …). Each verb has one
//! meaning: `new` creates and `free` destroys (accepting NULL); a lease is `release`d (accepting
//! NULL) or `clone`d; `find_or_build` looks up and builds on a miss, `get` only looks up;
//! `stats` fills a `kc_<object>_statistics`.
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
//!   accept NULL. A handle is cast to the Rust value it stands for only through `args::Handle`.
//! - Out-parameters are written only on success.
//! - What every pointer argument must be (a live handle, a writable out-parameter, a readable
//!   range, a C string) is said once, in the header's preamble (`cbindgen.toml`) and in
//!   `docs/c-api-conventions.md`; an exported function's comment says only what it needs beyond
//!   that, not under a `# Safety` heading of its own, so that the header does not repeat it.

// The exported functions' contract is the C API's, said once (see above).
#![allow(clippy::missing_safety_doc)]

mod args;
mod backend_common;
pub mod buffer;
mod cache;
pub mod cuda;
pub mod key_builder;
mod lease;
pub(crate) mod lock_fds;
pub mod log;
pub mod metrics;
pub mod opencl;
pub mod persistence;
pub mod persistence_entries;
pub mod persistence_stats;
pub(crate) mod process;
pub(crate) mod sharded_lock;
mod status;
pub mod store_options;
pub mod tiered;
pub mod vulkan;
pub mod vulkan_device;
pub mod vulkan_spec;

pub use cache::*;
pub use lease::*;
pub use status::*;
