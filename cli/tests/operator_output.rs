//! What the command prints is safe to show an operator: text that came from an entry never
//! reaches the terminal as control sequences, and a remote's password never leaves the process.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

mod common;

use common::{json, run};
use kcache::disk::Descriptor;
use kcache::key::Key;
use kcache::{Persistence, PersistenceConfig};
use serde_json::Value;

/// Sequences a descriptor may carry to a terminal: set the window title, clear the screen,
/// return to the start of the line, a C1 control sequence introducer, DEL, and a right-to-left
/// override that reorders what follows.
const BACKEND: &str = "cl\u{1b}[2J";
const DEVICE: &str = "gpu\u{1b}]0;owned\u{7}\rfake\u{9b}31m";
const NAME: &str = "k\u{7f}\u{202e}txt.exe";

/// Whether `text` holds a character a terminal would act on (newlines apart).
fn has_controls(text: &str) -> bool {
    text.chars()
        .any(|c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c))
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// A directory with one entry described by the hostile fields.
fn hostile_entry() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let disk = Persistence::open(PersistenceConfig::in_dir(dir.path())).unwrap();
    let descriptor = Descriptor::new(BACKEND, DEVICE, NAME);
    let key = Key::from_bytes([9; 32]);
    disk.put_described(&key, b"payload", Duration::ZERO, &descriptor)
        .unwrap();
    dir
}

#[test]
fn ls_and_inspect_escape_control_characters_of_entries() {
    let dir = hostile_entry();
    let ls = stdout(&run(dir.path(), &["ls"]));
    assert!(!has_controls(&ls), "{ls:?}");
    // Each shown as its escape (cells are cut to their width, so only their start).
    assert!(ls.contains(r"cl\u{1b}[2J"), "{ls}");
    assert!(ls.contains(r"gpu\u{1b}]0;owned\u{7}\…"), "{ls}");
    assert!(ls.contains(r"k\u{7f}\u{202e}txt.exe"), "{ls}");

    let inspect = stdout(&run(dir.path(), &["inspect", &"09".repeat(32)]));
    assert!(!has_controls(&inspect), "{inspect:?}");
    assert!(
        inspect.contains(r"backend:        cl\u{1b}[2J"),
        "{inspect}"
    );
    assert!(
        inspect.contains(r"device:         gpu\u{1b}]0;owned\u{7}\rfake\u{9b}31m"),
        "{inspect}"
    );
    assert!(
        inspect.contains(r"name:           k\u{7f}\u{202e}txt.exe"),
        "{inspect}"
    );

    let stats = stdout(&run(dir.path(), &["stats"]));
    assert!(!has_controls(&stats), "{stats:?}");
    assert!(stats.contains(r"cl\u{1b}[2J"), "{stats}");

    // The JSON escapes them too, C1 and DEL included, and reads back as written.
    for args in [
        &["ls", "--json"][..],
        &["inspect", &"09".repeat(32), "--json"],
    ] {
        let text = stdout(&run(dir.path(), args));
        assert!(!has_controls(&text), "{args:?}: {text:?}");
        let value = json(dir.path(), args);
        let entry = value.get("entries").map_or(&value, |e| &e[0]);
        assert_eq!(entry["backend"], BACKEND);
        assert_eq!(entry["device"], DEVICE);
        assert_eq!(entry["entry_name"], NAME);
    }
}

/// Runs `kcache --dir DIR ARGS` with `KCACHE_REMOTE_URL=url` and nothing else.
fn config_with_url(dir: &Path, url: &str, json: bool) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kcache"));
    command
        .env_clear()
        .env("KCACHE_REMOTE_URL", url)
        .arg("--dir")
        .arg(dir)
        .arg("config");
    if json {
        command.arg("--json");
    }
    stdout(&command.output().unwrap())
}

#[test]
fn config_masks_the_remote_password() {
    let dir = tempfile::tempdir().unwrap();
    for (url, shown) in [
        (
            "redis://kcache:hunter2@cache.example:6379/0",
            "redis://***:***@cache.example:6379/0",
        ),
        (
            "rediss://:hunter2@cache.example/",
            "rediss://:***@cache.example/",
        ),
        (
            "redis+unix:///run/redis.sock?pass=hunter2",
            "redis+unix:///run/redis.sock?pass=***",
        ),
    ] {
        let text = config_with_url(dir.path(), url, false);
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            text.contains(&format!("KCACHE_REMOTE_URL={shown}")),
            "{text}"
        );
        let json = config_with_url(dir.path(), url, true);
        assert!(!json.contains("hunter2"), "{json}");
        let value: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["environment"]["KCACHE_REMOTE_URL"], shown);
    }
}
