//! The one place kcache reads its `KCACHE_*` environment (and the `XDG_CACHE_HOME` / `HOME`
//! fallbacks of the cache directory). What it says about them goes through [`crate::log`].
//!
//! In a secure-execution process (setuid, setgid, or granted file capabilities: the kernel sets
//! `AT_SECURE`), the environment belongs to the less privileged user who started it. A library
//! path taken from there would run that user's code with the program's privileges, and a
//! directory or key file would make the program trust that user's files. So, as the OpenCL ICD
//! loader and the Vulkan loader do with `secure_getenv`, every variable read through
//! [`var_os`](crate::env::var_os) is absent in such a process: only values the program passes
//! explicitly count. Two variables are read all the same, because they can only take something
//! away: `KCACHE_DISABLE=1` ([`disk_disabled`](crate::env::disk_disabled)) and
//! `KCACHE_REQUIRE_KEY` ([`require_key`](crate::env::require_key)).
//!
//! A process that changes its own ids after it started (a root daemon that switches to a
//! service user, one that makes itself non-dumpable) is not in that mode: its environment came
//! from whoever started it, with the privileges it had then, and is read as usual.

use std::ffi::OsString;

/// Whether this process runs in secure-execution mode: the kernel's `AT_SECURE` flag, which it
/// sets at `execve` whenever the program gains privileges the caller lacked (setuid, setgid,
/// file capabilities, a security module's say). Ids changed later, by the process itself, do
/// not count: whoever could do that was trusted with the environment to begin with. Read from
/// the auxiliary vector, not `/proc`, which a process that dropped privileges may not be
/// allowed to read.
pub fn secure_execution() -> bool {
    crate::ffi::process::at_secure()
}

/// The value of `name`, or `None` when it is unset or the process is in secure-execution mode.
/// An empty value is returned as it is: each caller decides what empty means for its variable.
pub fn var_os(name: &str) -> Option<OsString> {
    if secure_execution() {
        None
    } else {
        std::env::var_os(name)
    }
}

/// `KCACHE_DISABLE=1`: the disk tier is off. Read in secure-execution mode too, unlike most
/// variables: it names no file and no library and only removes the disk tier, so the user who
/// started a setuid program gains nothing by setting it but a slower run of that program.
pub fn disk_disabled() -> bool {
    std::env::var_os("KCACHE_DISABLE").is_some_and(|v| v == "1")
}

/// `KCACHE_REQUIRE_KEY`, read in secure-execution mode too: like `KCACHE_DISABLE` it can only
/// take the disk tier away (from a process with no operator key), never make kcache trust
/// anything.
pub fn require_key() -> Option<OsString> {
    std::env::var_os("KCACHE_REQUIRE_KEY")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_test_process_is_not_secure() {
        // The tests run without setuid bits or file capabilities: the kernel did not set
        // AT_SECURE, so the environment is honoured.
        assert!(!secure_execution());
        assert_eq!(var_os("PATH"), std::env::var_os("PATH"));
    }
}
