//! The directory's settings (`kcache.conf`): `kcache config set|get|unset` (the built binary)
//! writes them, and another process (this test) applies them when it opens the directory,
//! unless its environment or its code says otherwise; a file that cannot be used is ignored
//! with one warning. `kcache metrics` exports the directory's counters as counters.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

mod common;

use common::{json, run};
use kcache::key::Key;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::prometheus::Parser;
use kcache_testkit::strings::{disk, find_or_build, serialize, tiered};

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `kcache --dir DIR ARGS` with `env` as its only environment.
fn run_with_env(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kcache"))
        .env_clear()
        .envs(env.iter().copied())
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

fn entry_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".kce")
        })
        .count()
}

#[test]
fn settings_set_by_the_command_are_applied_by_another_process() {
    let tmp = tempfile::tempdir().unwrap();
    // A directory that does not exist yet: `set` creates it, private, as a first process would.
    let dir = tmp.path().join("cache");
    // `max_files` is ccache's spelling, taken as `max-files`.
    for (name, value) in [
        ("max-size", "1.5M"),
        ("max_files", "3"),
        ("lock-timeout", "7.5"),
    ] {
        let set = run(&dir, &["config", "set", name, value]);
        assert_eq!(set.status.code(), Some(0), "{}", stderr(&set));
    }
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let file = std::fs::read_to_string(dir.join("kcache.conf")).unwrap();
    assert_eq!(file, "max-size = 1.5M\nmax-files = 3\nlock-timeout = 7.5\n");
    let get = run(&dir, &["config", "get", "max-size"]);
    assert_eq!(
        (get.status.code(), stdout(&get)),
        (Some(0), "1.5M\n".into())
    );

    // This process opens the directory without saying anything of caps: the directory's apply.
    let cache = Persistence::open(PersistenceConfig::in_dir(&dir)).unwrap();
    assert_eq!(cache.max_size(), 1_500_000);
    assert_eq!(cache.max_files(), Some(3));
    assert_eq!(cache.lock_timeout(), Duration::from_millis(7500));
    // The file-count cap evicts: five entries written, three kept, the newest among them.
    let keys: Vec<Key> = (0..5u8).map(|i| Key::from_bytes([i; 32])).collect();
    for key in &keys {
        cache.put(key, b"payload", Duration::ZERO).unwrap();
    }
    cache.flush();
    assert_eq!(entry_files(&dir), 3);
    assert!(cache.get(&keys[4]).unwrap().is_some());
    drop(cache);

    // Values given in code win over the directory's.
    let explicit = Persistence::open(PersistenceConfig {
        max_size: Some(10_000_000),
        max_files: Some(0),
        ..PersistenceConfig::in_dir(&dir)
    })
    .unwrap();
    assert_eq!(
        (explicit.max_size(), explicit.max_files()),
        (10_000_000, None)
    );
    drop(explicit);

    // The environment wins over the directory's too, as `config` and `stats` report.
    let config = json(&dir, &["config", "--json"]);
    assert_eq!(config["cap_bytes"], 1_500_000);
    assert_eq!(config["max_files"], 3);
    assert_eq!(config["lock_timeout_s"], 7.5);
    assert_eq!(config["directory_settings"]["max-files"], "3");
    let env = [("KCACHE_MAX_SIZE", "2Mi"), ("KCACHE_MAX_FILES", "0")];
    let overridden = run_with_env(&dir, &env, &["config", "--json"]);
    let overridden: serde_json::Value = serde_json::from_slice(&overridden.stdout).unwrap();
    assert_eq!(overridden["cap_bytes"], 2 << 20);
    assert_eq!(overridden["max_files"], serde_json::Value::Null);
    let set = run_with_env(&dir, &env, &["config", "set", "max-size", "4G"]);
    assert!(
        stderr(&set).contains("KCACHE_MAX_SIZE=\"2Mi\" is set here, and overrides"),
        "{}",
        stderr(&set)
    );
    assert_eq!(
        json(&dir, &["stats", "--json"])["cap_bytes"],
        4_000_000_000u64
    );

    // Unset: the default again, other lines kept; `get` then says nothing, with status 1.
    assert_eq!(
        run(&dir, &["config", "unset", "max-size"]).status.code(),
        Some(0)
    );
    let get = run(&dir, &["config", "get", "max-size"]);
    assert_eq!((get.status.code(), stdout(&get)), (Some(1), String::new()));
    let reopened = Persistence::open(PersistenceConfig::in_dir(&dir)).unwrap();
    assert_eq!(reopened.max_size(), kcache::disk::DEFAULT_MAX_SIZE);
    assert_eq!(reopened.max_files(), Some(3));
}

#[test]
fn a_value_the_setting_does_not_take_is_refused_and_nothing_written() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, value) in [
        ("max-size", "0"),
        ("max-size", "lots"),
        ("max-files", "-1"),
        ("lock-timeout", "soon"),
        ("require-key", "maybe"),
    ] {
        let set = run(tmp.path(), &["config", "set", name, value]);
        assert_eq!(set.status.code(), Some(2), "{name} {value}");
        assert!(stderr(&set).contains(name), "{}", stderr(&set));
    }
    let unknown = run(tmp.path(), &["config", "set", "colour", "blue"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(!tmp.path().join("kcache.conf").exists());
    // Nor is a missing directory created for a refused value.
    let missing = tmp.path().join("missing");
    assert_eq!(
        run(&missing, &["config", "set", "max-size", "0"])
            .status
            .code(),
        Some(2)
    );
    assert!(!missing.exists());
}

#[test]
fn a_directory_that_requires_a_key_refuses_processes_without_one() {
    let tmp = tempfile::tempdir().unwrap();
    let set = run(tmp.path(), &["config", "set", "require-key", "true"]);
    assert_eq!(set.status.code(), Some(0), "{}", stderr(&set));
    let refused = Persistence::open(PersistenceConfig::in_dir(tmp.path()));
    assert!(
        matches!(refused, Err(kcache::Error::Untrusted(ref m)) if m.contains("require-key")),
        "{:?}",
        refused.map(|_| ())
    );
    // The setting can still be read and removed without a key.
    let get = run(tmp.path(), &["config", "get", "require-key"]);
    assert_eq!(stdout(&get), "true\n");
    assert_eq!(
        run(tmp.path(), &["config", "unset", "require-key"])
            .status
            .code(),
        Some(0)
    );
    assert!(Persistence::open(PersistenceConfig::in_dir(tmp.path())).is_ok());
}

#[test]
fn a_settings_file_that_cannot_be_used_is_ignored_with_one_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("kcache.conf");
    let cases: [(&[u8], u32, &str); 3] = [
        // A bad line: ignored, the good one applies.
        (
            b"max-files = 4\nmax-size = plenty\n",
            0o600,
            "line 2: max-size",
        ),
        // Writable by group: the whole file is ignored.
        (b"max-files = 4\n", 0o620, "writable by group or others"),
        (b"max-files = 4\n\xff\xfe", 0o600, "not UTF-8"),
    ];
    for (text, mode, warning) in cases {
        std::fs::write(&conf, text).unwrap();
        std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(mode)).unwrap();
        let stats = run(tmp.path(), &["stats", "--json"]);
        assert_eq!(stats.status.code(), Some(0), "{}", stderr(&stats));
        let warnings: Vec<String> = stderr(&stats)
            .lines()
            .filter(|l| l.contains("kcache.conf"))
            .map(str::to_owned)
            .collect();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains(warning), "{warnings:?}");
        let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
        assert_eq!(stats["cap_bytes"], kcache::disk::DEFAULT_MAX_SIZE);
        let expected = if warning.starts_with("line") { 4 } else { 0 };
        assert_eq!(
            stats["max_files"].as_u64().unwrap_or(0),
            expected,
            "{text:?}"
        );
    }
    // A symbolic link in its place is not followed.
    std::fs::remove_file(&conf).unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::write(&elsewhere, "max-files = 4\n").unwrap();
    std::os::unix::fs::symlink(&elsewhere, &conf).unwrap();
    let stats = run(tmp.path(), &["stats", "--json"]);
    assert!(
        stderr(&stats).contains("is a symbolic link"),
        "{}",
        stderr(&stats)
    );
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["max_files"], serde_json::Value::Null);
}

#[test]
fn sizes_take_ccache_units_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    for (value, bytes) in [
        ("62K", 62_000u64),
        ("62Ki", 63_488),
        ("1.5G", 1_500_000_000),
    ] {
        let env = [("KCACHE_MAX_SIZE", value)];
        let config = run_with_env(tmp.path(), &env, &["config", "--json"]);
        let config: serde_json::Value = serde_json::from_slice(&config.stdout).unwrap();
        assert_eq!(config["cap_bytes"], bytes, "{value}");
        let cache = Persistence::open(PersistenceConfig {
            max_size: Some(kcache::disk::parse_size(value).unwrap()),
            ..PersistenceConfig::in_dir(tmp.path())
        })
        .unwrap();
        assert_eq!(cache.max_size(), bytes);
    }
}

#[test]
fn metrics_export_the_directorys_counters_as_counters() {
    let Some(parser) = Parser::for_test() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    {
        let cache = tiered(Some(disk(tmp.path())));
        let lookup = |source: &str| {
            find_or_build(
                &cache,
                source,
                || Ok((format!("built {source}"), 1)),
                serialize,
            )
            .unwrap()
            .value()
            .clone()
        };
        // Two builds (and writes), then three memory hits.
        for source in ["a", "b", "a", "b", "a"] {
            assert_eq!(lookup(source), format!("built {source}"));
        }
    }
    {
        // A fresh memory tier: a disk hit.
        let cache = tiered(Some(disk(tmp.path())));
        let value = find_or_build(&cache, "a", || Ok(("rebuilt".to_owned(), 1)), serialize)
            .unwrap()
            .value()
            .clone();
        assert_eq!(value, "built a");
    }
    let metrics = run(tmp.path(), &["metrics"]);
    assert_eq!(metrics.status.code(), Some(0), "{}", stderr(&metrics));
    let parsed = parser.parse(&stdout(&metrics));
    for family in [
        "kcache_lookups",
        "kcache_builds",
        "kcache_disk_writes",
        "kcache_integrity_rejects",
        "kcache_evictions",
    ] {
        assert_eq!(parsed.types[family], "counter", "{family}");
    }
    for (series, expected) in [
        (r#"kcache_lookups_total{result="hit",tier="memory"}"#, 3.0),
        (r#"kcache_lookups_total{result="miss",tier="memory"}"#, 3.0),
        (r#"kcache_lookups_total{result="hit",tier="disk"}"#, 1.0),
        (r#"kcache_lookups_total{result="miss",tier="disk"}"#, 2.0),
        ("kcache_builds_total{}", 2.0),
        (r#"kcache_disk_writes_total{result="ok"}"#, 2.0),
        ("kcache_integrity_rejects_total{}", 0.0),
        (r#"kcache_lookups_total{result="hit",tier="remote"}"#, 0.0),
        // The gauges stay.
        (r#"kcache_entries{tier="disk"}"#, 2.0),
    ] {
        assert_eq!(parsed.value(series), expected, "{series}");
    }
}
