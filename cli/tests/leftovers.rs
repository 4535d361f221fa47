//! `clear`, `zero-stats` and `gc` on a directory holding things they cannot remove: each goes
//! through everything, removes what it can, names what it could not and exits with status 3.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

mod common;

use common::{json, run};
use kcache::disk::SHARDS;
use kcache::key::Key;
use kcache::{Persistence, PersistenceConfig};
use serde_json::Value;

fn key(n: u8) -> Key {
    Key::from_bytes([n; 32])
}

/// A chain of nested directories at `path` deeper than kcache removes, with a file at the
/// bottom.
fn plant_deep(path: &Path) {
    let mut bottom = path.to_path_buf();
    for _ in 0..40 {
        bottom.push("d");
    }
    std::fs::create_dir_all(&bottom).unwrap();
    std::fs::write(bottom.join("file"), b"x").unwrap();
}

/// A directory with a file and a subdirectory in it, which kcache removes.
fn plant_tree(path: &Path) {
    std::fs::create_dir_all(path.join("sub")).unwrap();
    std::fs::write(path.join("sub/file"), b"x").unwrap();
}

/// The status and the JSON output of `kcache --dir DIR ARGS --json`, and its stderr.
fn partial(dir: &Path, args: &[&str]) -> (Option<i32>, Value, String) {
    let mut args = args.to_vec();
    args.push("--json");
    let output: Output = run(dir, &args);
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["schema"], 1);
    (
        output.status.code(),
        value,
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn clear_removes_every_entry_it_can_and_names_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Persistence::open(PersistenceConfig::in_dir(dir.path())).unwrap();
    // In listing order the blocked names may come first: clear used to stop at the first.
    for n in 1..=6 {
        cache.put(&key(n), &[n; 10], Duration::ZERO).unwrap();
    }
    let deep = cache.entry_path(&key(7));
    plant_deep(&deep);
    let tree = cache.entry_path(&key(8));
    plant_tree(&tree);

    let (status, out, stderr) = partial(dir.path(), &["clear"]);
    assert_eq!(status, Some(3), "{stderr}");
    assert_eq!(out["removed"], 7);
    let left = out["not_removed"].as_array().unwrap();
    assert_eq!(left.len(), 1);
    let name = deep.file_name().unwrap().to_str().unwrap();
    assert_eq!(left[0]["name"], name);
    assert!(stderr.contains(name), "{stderr}");
    for n in 1..=6 {
        assert!(!cache.entry_path(&key(n)).exists());
    }
    assert!(!tree.exists());
    assert!(deep.exists());

    // Once it can be removed, clear finishes clean.
    std::fs::rename(&deep, dir.path().join("elsewhere")).unwrap();
    let out = json(dir.path(), &["clear", "--json"]);
    assert_eq!(out["removed"], 0);
    assert_eq!(out["not_removed"].as_array().unwrap().len(), 0);
}

#[test]
fn zero_stats_zeroes_every_counter_file_it_can() {
    let dir = tempfile::tempdir().unwrap();
    {
        let cache = Persistence::open(PersistenceConfig::in_dir(dir.path())).unwrap();
        cache.put(&key(1), b"v", Duration::ZERO).unwrap();
    }
    let own = format!(".stats-{:x}", std::process::id() % SHARDS);
    // The first file blocked, another replaced by a directory kcache removes.
    let blocked = if own == ".stats-0" {
        ".stats-1"
    } else {
        ".stats-0"
    };
    plant_deep(&dir.path().join(blocked));
    let tree = if own == ".stats-f" {
        ".stats-e"
    } else {
        ".stats-f"
    };
    plant_tree(&dir.path().join(tree));

    let (status, out, stderr) = partial(dir.path(), &["zero-stats"]);
    assert_eq!(status, Some(3), "{stderr}");
    let left = out["not_zeroed"].as_array().unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["name"], blocked);
    assert!(stderr.contains(blocked), "{stderr}");
    assert!(out["zeroed_unix_ns"].as_u64().unwrap() > 0);
    assert!(dir.path().join(tree).is_file());
    let stats = json(dir.path(), &["stats", "--json"]);
    assert_eq!(stats["counters"]["disk_writes"], 0, "{stats}");
}

#[test]
fn gc_goes_on_past_what_it_cannot_remove_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Persistence::open(PersistenceConfig::in_dir(dir.path())).unwrap();
    cache.put(&key(1), b"kept", Duration::ZERO).unwrap();
    plant_deep(&cache.entry_path(&key(2)));
    plant_tree(&cache.entry_path(&key(3)));

    let (status, out, stderr) = partial(dir.path(), &["gc"]);
    assert_eq!(status, Some(3), "{stderr}");
    assert_eq!(out["sweep"]["undeletable"], 1);
    assert_eq!(out["sweep"]["corrupt"], 1);
    assert_eq!(out["kept_entries"], 1);
    assert!(stderr.contains("could not remove 1"), "{stderr}");
    assert!(!cache.entry_path(&key(3)).exists());
    assert!(cache.entry_path(&key(2)).exists());
}
