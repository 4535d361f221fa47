//! The `kcache` command end to end: the built binary against real directories filled through
//! the library (and one through the OpenCL backend on PoCL).

use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod common;

use common::{json, run};
use kcache::backend::opencl::DeviceIdentity;
use kcache::disk::OperatorKey;
use kcache::key::Key;
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::Context;
use kcache_testkit::prometheus::Parser;
use serde_json::Value;

/// Runs `kcache ARGS` with no `KCACHE_*` (nor any other) variable but those in `env`.
fn run_env(env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kcache"))
        .env_clear()
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// Checks that a command was refused: exit status 2, `why` on stderr, nothing on stdout.
fn refused(output: &Output, why: &str) {
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(output).contains(why), "{}", stderr(output));
    assert_eq!(stdout(output), "");
}

/// Runs a `--json` command that must succeed and parses its output.
fn key(n: u8) -> Key {
    Key::from_bytes([n; 32])
}

fn open(dir: &Path) -> Persistence {
    Persistence::open(PersistenceConfig::in_dir(dir)).unwrap()
}

/// A fresh directory holding the program of `source`, built on the first OpenCL device: the
/// directory, the context, the disk tier on it, the program's key and the size of its entry.
/// `None` when there is no OpenCL device (the test skipped).
fn stored(source: &str) -> Option<(tempfile::TempDir, Context, Arc<Persistence>, Key, u64)> {
    let dir = tempfile::tempdir().unwrap();
    let context = Context::for_test()?;
    let disk = Arc::new(open(dir.path()));
    // The binary is written in the background: the cache is flushed to wait for it.
    let key = context.store_program(Arc::clone(&disk), source);
    let size = fs::metadata(disk.entry_path(&key)).unwrap().len();
    Some((dir, context, disk, key, size))
}

/// A new directory holding entries for keys 1 to `count`, each with `len` bytes of its number.
fn filled(count: u8, len: usize) -> (tempfile::TempDir, Persistence) {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    for n in 1..=count {
        cache.put(&key(n), &vec![n; len], Duration::ZERO).unwrap();
    }
    (dir, cache)
}

fn operator_key(byte: u8) -> OperatorKey {
    OperatorKey::new(vec![byte; 32]).unwrap()
}

fn open_keyed(dir: &Path, byte: u8) -> Persistence {
    Persistence::open(PersistenceConfig {
        key: Some(operator_key(byte)),
        ..PersistenceConfig::in_dir(dir)
    })
    .unwrap()
}

/// Bytes an entry written by `Persistence::put` adds to its payload: the format 2 header with
/// the default descriptor (backend `custom`, no device, no name: 2 + 12 bytes) and the tag.
const OVERHEAD: u64 = 104 + 2 + 12;

/// Flips one bit of the byte at `offset` of the file, as storage corruption would.
fn flip_byte(path: &Path, offset: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset] ^= 0x80;
    fs::write(path, bytes).unwrap();
}

fn set_age(path: &Path, age: Duration) {
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(SystemTime::now() - age)
        .unwrap();
}

#[test]
fn stats_and_ls_report_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let written = [(1u8, 100usize, 5u64), (2, 2000, 250), (3, 30_000, 7)];
    for (n, len, millis) in written {
        cache
            .put(&key(n), &vec![n; len], Duration::from_millis(millis))
            .unwrap();
    }
    let keyed = open_keyed(dir.path(), 9);
    keyed.put(&key(4), &[4; 10], Duration::ZERO).unwrap();
    set_age(&cache.entry_path(&key(1)), Duration::from_secs(3600));

    let stats = json(dir.path(), &["stats", "--json"]);
    let payload: u64 = written.iter().map(|w| w.1 as u64).sum::<u64>() + 10;
    assert_eq!(stats["entries"], 4);
    assert_eq!(stats["bytes"], payload + 4 * OVERHEAD);
    assert_eq!(stats["cap_bytes"], 1u64 << 30);
    let generations = stats["generations"].as_array().unwrap();
    assert_eq!(generations.len(), 2);
    assert_eq!(generations[0]["fingerprint"], "0000000000000000");
    assert_eq!(generations[0]["current"], true);
    assert_eq!(generations[0]["entries"], 3);
    assert_eq!(generations[1]["current"], false);
    assert_eq!(generations[1]["entries"], 1);
    assert_eq!(generations[1]["bytes"], 10 + OVERHEAD);
    let oldest = stats["oldest_used_unix_ns"].as_u64().unwrap();
    let newest = stats["newest_used_unix_ns"].as_u64().unwrap();
    assert!(newest - oldest >= 3_500_000_000_000, "{oldest} {newest}");

    let ls = json(dir.path(), &["ls", "--json"]);
    let rows = ls["entries"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for (n, len, millis) in written {
        let row = rows.iter().find(|r| r["key"] == key(n).to_hex()).unwrap();
        assert_eq!(row["size"], len as u64 + OVERHEAD);
        assert_eq!(row["status"], "ok");
        assert_eq!(row["current"], true);
        assert_eq!(row["build_time_ns"], millis * 1_000_000);
        let name = cache.entry_path(&key(n));
        assert_eq!(row["name"], name.file_name().unwrap().to_str().unwrap());
    }
    let other = rows.iter().find(|r| r["key"] == key(4).to_hex()).unwrap();
    assert_eq!(other["status"], "other-key");
    assert_eq!(other["current"], false);
    assert!(other["build_time_ns"].is_null());

    let by_size = json(dir.path(), &["ls", "--json", "--sort", "size"]);
    let sizes: Vec<u64> = by_size["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes[0], 30_000 + OVERHEAD);
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    let by_age = json(dir.path(), &["ls", "--json", "--sort", "age"]);
    assert_eq!(by_age["entries"][0]["key"], key(1).to_hex());

    // Listing changed nothing: not the mtime the age order rests on.
    let again = json(dir.path(), &["ls", "--json", "--sort", "age"]);
    assert_eq!(again["entries"][0], by_age["entries"][0]);
    let human = run(dir.path(), &["ls"]);
    assert!(stdout(&human).contains("4 entries"), "{}", stdout(&human));
}

#[test]
fn looking_at_a_directory_over_its_cap_evicts_nothing() {
    let (dir, cache) = filled(3, 1000);
    let env = [
        ("KCACHE_DIR", dir.path().to_str().unwrap()),
        ("KCACHE_MAX_SIZE", "2Ki"),
    ];
    let output = run_env(&env, &["stats", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stats: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(stats["cap_bytes"], 2048);
    assert_eq!(stats["entries"], 3);
    for args in [&["ls"][..], &["verify"], &["config"]] {
        assert_eq!(run_env(&env, args).status.code(), Some(0));
    }
    assert!((1..=3).all(|n| cache.entry_path(&key(n)).exists()));
    let bad = run_env(&[env[0], ("KCACHE_MAX_SIZE", "lots")], &["stats"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("KCACHE_MAX_SIZE=\"lots\" is not a positive size"));
}

#[test]
fn an_opencl_program_shows_in_ls_and_verifies() {
    let source = "// kcache command\n__kernel void twice(__global float *y) {\n\
                  size_t i = get_global_id(0);\n y[i] = 2.0f * y[i];\n}\n";
    let Some((dir, context, _disk, key, size)) = stored(source) else {
        return;
    };

    let ls = json(dir.path(), &["ls", "--json"]);
    let rows = ls["entries"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["key"], key.to_hex());
    assert_eq!(rows[0]["size"], size);
    assert_eq!(rows[0]["status"], "ok");
    assert!(rows[0]["build_time_ns"].as_u64().unwrap() > 0);
    // The descriptor the backend wrote: its name, the device's, the program's kernels.
    let device = DeviceIdentity::query(context.device()).unwrap().device_name;
    assert_eq!(rows[0]["backend"], "opencl");
    assert_eq!(rows[0]["device"], device.as_str());
    assert_eq!(rows[0]["entry_name"], "twice");

    let inspect = json(dir.path(), &["inspect", "--json", &key.to_hex()[..12]]);
    assert_eq!(inspect["status"], "ok");
    assert_eq!(inspect["header"]["key"], key.to_hex());
    let descriptor = (2 + "opencl".len() + 2 + device.len() + 2 + "twice".len()) as u64;
    assert_eq!(
        inspect["header"]["payload_len"],
        size - 72 - 2 - descriptor - 32
    );
    assert_eq!(inspect["header"]["tag"], "blake3");
    let verify = run(dir.path(), &["verify"]);
    assert_eq!(verify.status.code(), Some(0), "{}", stderr(&verify));
    assert!(stdout(&verify).contains("1 entries checked: 1 verified, 0 corrupt"));
}

#[test]
fn verify_finds_a_flipped_byte_and_removes_exactly_that_entry() {
    let (dir, cache) = filled(3, 500);
    let corrupt = cache.entry_path(&key(2));
    flip_byte(&corrupt, 300);
    fs::write(dir.path().join("notes.txt"), "not an entry").unwrap();

    let found = run(dir.path(), &["verify"]);
    assert_eq!(found.status.code(), Some(1));
    let name = corrupt.file_name().unwrap().to_str().unwrap();
    assert!(
        stdout(&found).contains(&format!("corrupt: {name}: tag mismatch")),
        "{}",
        stdout(&found)
    );
    // Piped: no progress bar.
    assert_eq!(stderr(&found), "");
    assert!(corrupt.exists(), "verify without --remove removes nothing");

    let removed = run(dir.path(), &["verify", "--remove", "--json"]);
    assert_eq!(removed.status.code(), Some(1));
    let report: Value = serde_json::from_str(&stdout(&removed)).unwrap();
    assert_eq!(report["checked"], 3);
    assert_eq!(report["verified"], 2);
    assert_eq!(report["corrupt"][0]["name"], name);
    assert_eq!(report["corrupt"][0]["removed"], true);
    assert!(!corrupt.exists());
    for n in [1, 3] {
        assert!(cache.entry_path(&key(n)).exists());
        assert_eq!(cache.get(&key(n)).unwrap().unwrap().payload(), &[n; 500]);
    }
    assert!(dir.path().join("notes.txt").exists());

    let clean = run(dir.path(), &["verify"]);
    assert_eq!(clean.status.code(), Some(0));
    assert!(stdout(&clean).contains("2 entries checked: 2 verified, 0 corrupt"));
    let inspect = run(dir.path(), &["inspect", &key(2).to_hex()]);
    assert_eq!(inspect.status.code(), Some(2));
    assert!(stderr(&inspect).contains("no entry whose key starts with"));
}

#[test]
fn inspect_reports_a_corrupt_entry_with_status_1() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    cache
        .put(&key(1), &[1; 64], Duration::from_millis(3))
        .unwrap();
    let path = cache.entry_path(&key(1));
    let name = path.file_name().unwrap().to_str().unwrap().to_owned();
    let good = run(dir.path(), &["inspect", &name]);
    assert_eq!(good.status.code(), Some(0));
    assert!(
        stdout(&good).contains("verified: tag checked"),
        "{}",
        stdout(&good)
    );
    assert!(
        stdout(&good).contains("build time:     3 ms"),
        "{}",
        stdout(&good)
    );
    // The tag's last byte.
    flip_byte(&path, 64 + OVERHEAD as usize - 1);
    let bad = run(dir.path(), &["inspect", "--json", &name]);
    assert_eq!(bad.status.code(), Some(1));
    let value: Value = serde_json::from_str(&stdout(&bad)).unwrap();
    assert_eq!(value["status"], "corrupt");
    assert_eq!(value["reason"], "tag mismatch");
    assert!(path.exists(), "inspect removes nothing");
}

#[test]
fn gc_by_age_by_size_and_by_key_generation() {
    let (dir, cache) = filled(5, 1000);
    for n in 1..=5 {
        // Entry n was last used (6 - n) days ago: entry 1 is the least recently used.
        set_age(
            &cache.entry_path(&key(n)),
            Duration::from_secs(86400 * (6 - u64::from(n))),
        );
    }
    let entry_size = 1000 + OVERHEAD;

    let dry = json(
        dir.path(),
        &["gc", "--older-than", "3d12h", "--dry-run", "--json"],
    );
    let would: Vec<&str> = dry["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert_eq!(would, ["older-than", "older-than"]);
    assert_eq!(dry["bytes_freed"], 2 * entry_size);
    assert!((1..=5).all(|n| cache.entry_path(&key(n)).exists()));

    let aged = json(dir.path(), &["gc", "--older-than", "3d12h", "--json"]);
    assert_eq!(aged["dry_run"], false);
    assert_eq!(aged["removed"].as_array().unwrap().len(), 2);
    assert!(!cache.entry_path(&key(1)).exists());
    assert!(!cache.entry_path(&key(2)).exists());
    assert_eq!(aged["kept_entries"], 3);

    // Room for two entries: the least recently used of the three goes.
    let cap = (2 * entry_size + 10).to_string();
    let sized = json(dir.path(), &["gc", "--max-size", &cap, "--json"]);
    assert_eq!(sized["removed"][0]["reason"], "max-size");
    assert_eq!(sized["removed"][0]["size"], entry_size);
    assert!(!cache.entry_path(&key(3)).exists());
    assert!(cache.entry_path(&key(4)).exists() && cache.entry_path(&key(5)).exists());
    assert_eq!(sized["kept_bytes"], 2 * entry_size);

    // Another key generation: removed by the sweep unless its key is retained.
    let keyed = open_keyed(dir.path(), 9);
    keyed.put(&key(6), &[6; 10], Duration::ZERO).unwrap();
    let key_file = dir.path().join("retired.key");
    fs::write(&key_file, [9u8; 32]).unwrap();
    fs::set_permissions(&key_file, fs::Permissions::from_mode(0o600)).unwrap();
    let retained = json(
        dir.path(),
        &["gc", "--retain-key", key_file.to_str().unwrap(), "--json"],
    );
    assert_eq!(retained["sweep"]["stale_fingerprint"], 0);
    assert!(keyed.entry_path(&key(6)).exists());
    // With that key, its entry verifies and this configuration's are another generation.
    let with_key = json(
        dir.path(),
        &["--key-file", key_file.to_str().unwrap(), "ls", "--json"],
    );
    let statuses: Vec<(&str, &str)> = with_key["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                &e["key"].as_str().unwrap()[..2],
                e["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [("04", "other-key"), ("05", "other-key"), ("06", "ok")]
    );
    let swept = json(dir.path(), &["gc", "--json"]);
    assert_eq!(swept["sweep"]["stale_fingerprint"], 1);
    assert!(!keyed.entry_path(&key(6)).exists());
    assert!(key_file.exists(), "gc leaves foreign files alone");
}

#[test]
fn config_explains_an_untrusted_directory_and_a_relative_kcache_dir() {
    let parent = tempfile::tempdir().unwrap();
    let shared = parent.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o770)).unwrap();
    let report = run(&shared, &["config", "--json"]);
    assert_eq!(report.status.code(), Some(1), "the tier is off");
    let value: Value = serde_json::from_str(&stdout(&report)).unwrap();
    assert_eq!(value["enabled"], false);
    assert_eq!(value["trusted"], false);
    assert_eq!(value["dir_source"], "--dir");
    assert_eq!(value["error"]["kind"], "untrusted");
    let message = value["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("writable by group or others (mode 770)"),
        "{message}"
    );
    let human = run(&shared, &["config"]);
    assert!(
        stdout(&human).contains("disk tier:    off: untrusted:"),
        "{}",
        stdout(&human)
    );
    // Every other command refuses it with the same reason.
    refused(&run(&shared, &["stats"]), "writable by group or others");

    let xdg = parent.path().to_str().unwrap();
    let relative = run_env(
        &[("KCACHE_DIR", "relative/cache"), ("XDG_CACHE_HOME", xdg)],
        &["config", "--json"],
    );
    let value: Value = serde_json::from_str(&stdout(&relative)).unwrap();
    assert_eq!(value["dir_source"], "XDG_CACHE_HOME");
    assert_eq!(value["dir"], parent.path().join("kcache").to_str().unwrap());
    assert_eq!(value["environment"]["KCACHE_DIR"], "relative/cache");
    let notes = value["notes"].to_string();
    assert!(notes.contains("relative path: ignored"), "{notes}");
    assert!(
        !parent.path().join("kcache").exists(),
        "config creates nothing"
    );

    // KCACHE_DISABLE=1 does not stop `--dir`, and `config` creates no missing directory.
    let missing = parent.path().join("missing");
    let explicit = run_env(
        &[("KCACHE_DISABLE", "1")],
        &["--dir", missing.to_str().unwrap(), "config", "--json"],
    );
    let value: Value = serde_json::from_str(&stdout(&explicit)).unwrap();
    assert_eq!(value["exists"], false);
    assert_eq!(value["enabled"], true);
    assert!(value["notes"].to_string().contains("KCACHE_DISABLE=1"));
    assert!(!missing.exists());

    let disabled = run_env(
        &[("KCACHE_DISABLE", "1"), ("KCACHE_DIR", xdg)],
        &["config", "--json"],
    );
    assert_eq!(disabled.status.code(), Some(1));
    let value: Value = serde_json::from_str(&stdout(&disabled)).unwrap();
    assert_eq!(value["error"]["kind"], "unavailable");
    assert!(
        value["error"]["message"]
            .as_str()
            .unwrap()
            .contains("KCACHE_DISABLE=1")
    );
}

#[test]
fn clear_removes_this_keys_entries_only() {
    let (dir, cache) = filled(2, 10);
    let keyed = open_keyed(dir.path(), 9);
    keyed.put(&key(3), &[3; 10], Duration::ZERO).unwrap();
    let notes = dir.path().join("notes.txt");
    fs::write(&notes, "mine").unwrap();

    let cleared = json(dir.path(), &["clear", "--json"]);
    assert_eq!(cleared["removed"], 2);
    assert_eq!(cleared["bytes_freed"], 2 * (10 + OVERHEAD));
    assert!(!cache.entry_path(&key(1)).exists() && !cache.entry_path(&key(2)).exists());
    assert!(keyed.entry_path(&key(3)).exists());
    assert_eq!(fs::read_to_string(&notes).unwrap(), "mine");
}

#[test]
fn bad_arguments_and_missing_directories_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    refused(&run(&missing, &["ls"]), "does not exist");
    assert!(!missing.exists(), "nothing is created");
    refused(
        &run(dir.path(), &["gc", "--older-than", "7"]),
        "a number and a unit",
    );
    refused(
        &run(dir.path(), &["gc", "--max-size", "lots"]),
        "invalid size",
    );
    refused(
        &run(dir.path(), &["inspect", "not-hex"]),
        "neither an entry file name nor a key",
    );
    refused(
        &run_env(&[], &["stats"]),
        "set KCACHE_DIR, XDG_CACHE_HOME or HOME",
    );
}

#[test]
fn a_reader_that_went_away_ends_the_command_quietly() {
    let (dir, _cache) = filled(3, 16);
    // Its read end closed before the command starts: the first line written meets EPIPE.
    let (reader, writer) = rustix::pipe::pipe().unwrap();
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_kcache"))
        .env_clear()
        .args(["--dir", dir.path().to_str().unwrap(), "ls"])
        .stdout(std::process::Stdio::from(writer))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    assert_eq!(stderr(&output), "");
}

#[test]
fn metrics_and_its_textfile_give_the_directory_figures() {
    let Some(parser) = Parser::for_test() else {
        return;
    };
    let source = "// kcache metrics\n__kernel void halve(__global float *y) {\n\
                  size_t i = get_global_id(0);\n y[i] = 0.5f * y[i];\n}\n";
    let Some((dir, _context, disk, _program, program_size)) = stored(source) else {
        return;
    };
    disk.put(&key(1), &[1; 100], Duration::ZERO).unwrap();
    open_keyed(dir.path(), 9)
        .put(&key(2), &[2; 10], Duration::ZERO)
        .unwrap();
    set_age(&disk.entry_path(&key(1)), Duration::from_secs(3600));

    let output = run(dir.path(), &["metrics"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    let p = parser.parse(&text);
    assert_eq!(p.value("kcache_build_info{version=\"0.1.0\"}"), 1.0);
    assert_eq!(p.value("kcache_entries{tier=\"disk\"}"), 3.0);
    let current_bytes = program_size + 100 + OVERHEAD;
    let other_bytes = 10 + OVERHEAD;
    assert_eq!(
        p.value("kcache_disk_bytes{}"),
        (current_bytes + other_bytes) as f64
    );
    assert_eq!(
        p.value("kcache_disk_max_bytes{}"),
        kcache::disk::DEFAULT_MAX_SIZE as f64
    );
    let generation =
        |name: &str, which: &str| p.value(&format!("{name}{{generation=\"{which}\"}}"));
    assert_eq!(generation("kcache_disk_generation_entries", "current"), 2.0);
    assert_eq!(generation("kcache_disk_generation_entries", "other"), 1.0);
    assert_eq!(
        generation("kcache_disk_generation_bytes", "current"),
        current_bytes as f64
    );
    assert_eq!(
        generation("kcache_disk_generation_bytes", "other"),
        other_bytes as f64
    );
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let oldest = p.value("kcache_disk_oldest_use_timestamp_seconds{}");
    let newest = p.value("kcache_disk_newest_use_timestamp_seconds{}");
    assert!((now - 3600.0 - oldest).abs() < 600.0, "{oldest} vs {now}");
    assert!((now - newest).abs() < 600.0, "{newest} vs {now}");
    assert_eq!(
        p.types.get("kcache_entries").map(String::as_str),
        Some("gauge")
    );

    // --textfile replaces the file whole, leaves no temporary behind and prints nothing.
    let textdir = tempfile::tempdir().unwrap();
    let prom = textdir.path().join("kcache.prom");
    fs::write(&prom, "stale\n").unwrap();
    let written = run(
        dir.path(),
        &["metrics", "--textfile", prom.to_str().unwrap()],
    );
    assert_eq!(written.status.code(), Some(0), "{}", stderr(&written));
    assert_eq!(stdout(&written), "");
    let from_file = parser.parse(&fs::read_to_string(&prom).unwrap());
    assert_eq!(from_file.samples, p.samples);
    let names: Vec<_> = fs::read_dir(textdir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["kcache.prom"]);

    let nowhere = textdir.path().join("missing").join("kcache.prom");
    let refused_write = run(
        dir.path(),
        &["metrics", "--textfile", nowhere.to_str().unwrap()],
    );
    refused(&refused_write, "cannot write the textfile");
}
