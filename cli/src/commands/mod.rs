//! The subcommands, one module each. Each returns its exit status, or a [`Failure`] for
//! stderr; this module holds what several of them share.

mod clear;
mod config;
pub mod evict;
mod gc;
mod inspect;
mod ls;
pub mod metrics;
pub mod settings;
mod stats;
mod target;
mod verify;
mod zero_stats;

use kcache::Error;
use kcache::disk::{Check, Descriptor};
use serde::Serialize;

pub use clear::clear;
pub use config::config;
pub use gc::{GcArgs, gc};
pub use inspect::inspect;
pub use ls::ls;
pub use stats::stats;
pub use target::Target;
pub use verify::verify;
pub use zero_stats::zero_stats;

/// Version of every `--json` schema (`docs/command.md`): bumped only when a field changes
/// meaning or goes away; fields may be added without a bump.
pub const SCHEMA: u32 = 1;

/// The backend shown for an entry whose descriptor is not known: format 1 (it has none), or
/// not verified with this process's key (another key generation, corrupt).
const UNKNOWN_BACKEND: &str = "unknown";

/// The descriptor of a checked entry, when its tag was checked and it has one.
pub fn descriptor_of(check: &Check) -> Option<&Descriptor> {
    match check {
        Check::Verified(h) | Check::StaleSchema(h) => h.descriptor.as_ref(),
        Check::OtherKey(_) | Check::Corrupt(_) | Check::Gone => None,
    }
}

/// The backend `ls --backend` and `stats` file a checked entry under.
fn backend_of(check: &Check) -> &str {
    descriptor_of(check).map_or(UNKNOWN_BACKEND, Descriptor::backend)
}

/// Lowercase hex, as entry file names spell fingerprints and keys.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `e` with `what` before its message, same kind.
fn with_context(e: Error, what: &str) -> Error {
    match e {
        Error::Untrusted(m) => Error::Untrusted(format!("{what}: {m}")),
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        Error::Io(m) => Error::Io(format!("{what}: {m}")),
        Error::Unavailable(m) => Error::Unavailable(format!("{what}: {m}")),
        other => other,
    }
}

/// The error's own message, without the variant's prefix where the variant is named apart.
fn error_message(e: &Error) -> String {
    match e {
        Error::Unavailable(m) | Error::Io(m) | Error::InvalidArgument(m) => m.clone(),
        Error::Untrusted(m) => format!("untrusted: {m}"),
        other => other.to_string(),
    }
}

fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Unavailable(_) => "unavailable",
        Error::Untrusted(_) => "untrusted",
        Error::InvalidArgument(_) => "invalid-argument",
        Error::Io(_) => "io",
        _ => "other",
    }
}

/// A name a command could not remove or zero, and why.
#[derive(Serialize)]
struct NotDoneJson {
    name: String,
    error: String,
}

/// The exit status of a command that went through everything but could not remove or zero
/// some of it (`clear`, `zero-stats`, `gc`): each such name is on stderr.
const PARTIAL: u8 = 3;

/// Says on stderr what could not be done, one line per name, and returns the exit status.
fn partial_status(what: &str, left: &[NotDoneJson]) -> u8 {
    for n in left {
        eprintln!("kcache: cannot {what} {}: {}", n.name, n.error);
    }
    if left.is_empty() { 0 } else { PARTIAL }
}
