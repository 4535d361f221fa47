//! What a test needs from the machine beyond the Rust toolchain: a server (`redis-server`,
//! SeaweedFS), a driver (an OpenCL platform, a Vulkan device), a program or a file. A plain
//! `cargo test` skips a test whose need the machine lacks, saying which and how to get it;
//! `scripts/test`, which installs them all, sets `KCACHE_TEST_REQUIRE_ALL=1`, under which a
//! missing need fails the test instead, so that nothing is skipped there unseen.
//!
//! Tests use it through the test kit's functions that return `Option` (`RedisServer::start`,
//! `SeaweedServer::start`, `Context::for_test`, `TestGpu::for_test`, `Parser::for_test`, ...):
//! `let Some(server) = RedisServer::start() else { return };`.
//!
//! This file uses only the standard library, so that kcache's own unit tests include it by path
//! (as they include seaweed.rs).

use std::io::Write;
use std::path::PathBuf;

/// The variable under which a missing need fails the test (`scripts/test` sets it).
pub const REQUIRE_ALL: &str = "KCACHE_TEST_REQUIRE_ALL";

/// Something the machine lacks: what, and how to get it.
#[derive(Debug)]
pub struct Missing {
    what: String,
    install: String,
}

impl Missing {
    /// `what` is missing (`SeaweedFS is not installed`); `install` says how to get it.
    pub fn new(what: impl Into<String>, install: impl Into<String>) -> Missing {
        Missing {
            what: what.into(),
            install: install.into(),
        }
    }
}

/// The need's value; or, when it is missing, `None` once the test is said to be skipped (a
/// panic instead under [`REQUIRE_ALL`]).
pub fn met<T>(need: Result<T, Missing>) -> Option<T> {
    let missing = match need {
        Ok(value) => return Some(value),
        Err(missing) => missing,
    };
    let line = format!("{} ({})", missing.what, missing.install);
    if std::env::var_os(REQUIRE_ALL).is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("{line}; {REQUIRE_ALL} is set, so this fails instead of being skipped");
    }
    // The test harness runs each test on a thread named after it.
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(|name| format!(" {name}"))
        .unwrap_or_default();
    // Written to the standard error itself, not through `eprintln!`: the harness captures
    // what the macros print and shows it only for a failed test, and a skip must be seen. One
    // write, so that the harness's own lines do not cut into it.
    let _ = std::io::stderr().write_all(format!("skipped{test}: {line}\n").as_bytes());
    None
}

/// `name` as found in `PATH` (a path, with a `/`, as it is), or what is missing: `install`
/// says how to get it.
pub fn program(name: &str, install: &str) -> Result<PathBuf, Missing> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = if name.contains('/') {
        vec![PathBuf::new()]
    } else {
        std::env::split_paths(&path).collect()
    };
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| Missing::new(format!("{name} is not installed"), install))
}

/// `path` if it is a file, or what is missing: `install` says how to get it.
pub fn file(path: impl Into<PathBuf>, install: &str) -> Result<PathBuf, Missing> {
    let path = path.into();
    if path.is_file() {
        Ok(path)
    } else {
        Err(Missing::new(
            format!("{} is missing", path.display()),
            install,
        ))
    }
}

/// `python` if it runs and imports `modules` (`numpy, pyopencl`), or what is missing: `install`
/// says how to get it.
pub fn python(python: &str, modules: &str, install: &str) -> Result<PathBuf, Missing> {
    let imported = std::process::Command::new(python)
        .args(["-c", &format!("import {modules}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if imported {
        Ok(PathBuf::from(python))
    } else {
        Err(Missing::new(
            format!("{python} cannot import {modules}"),
            install,
        ))
    }
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
