//! What every test of the command needs: running the built `kcache` on a directory, with an
//! empty environment so that no `KCACHE_*` variable of the caller leaks in.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Runs `kcache --dir DIR ARGS`.
pub fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kcache"))
        .env_clear()
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

/// The JSON a successful `kcache --dir DIR ARGS` printed, of schema 1.
pub fn json(dir: &Path, args: &[&str]) -> Value {
    let output = run(dir, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["schema"], 1);
    value
}

/// The directory counter `name` of the JSON of `stats --json`.
#[allow(dead_code)] // Only the counter tests read counters.
pub fn counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name}"))
}
