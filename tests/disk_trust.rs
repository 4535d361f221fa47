//! Directory trust and configuration from the environment. Environment cases run in child
//! processes (this test binary re-executed with `KCACHE_TEST_ROLE` set), so the tests never
//! change their own environment and never see the user's real cache directory.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use kcache::Error;
use kcache::disk::OperatorKey;
use kcache::key::KeyBuilder;
use kcache::{Persistence, PersistenceConfig};

fn open(dir: &Path) -> kcache::Result<Persistence> {
    Persistence::open(PersistenceConfig::in_dir(dir))
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn created_private_and_trusted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/b/cache");
    let disk = open(&dir).unwrap();
    assert_eq!(disk.path(), dir);
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    // A pre-existing directory that only its owner can write is fine.
    chmod(&dir, 0o755);
    assert!(open(&dir).is_ok());
}

#[test]
fn group_or_world_writable_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for mode in [0o777, 0o770, 0o702, 0o720] {
        let dir = tmp.path().join(format!("m{mode:o}"));
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, mode);
        assert!(
            matches!(open(&dir), Err(Error::Untrusted(_))),
            "mode {mode:o}"
        );
    }
}

#[test]
fn directory_of_another_user_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    if rustix::process::geteuid().is_root() {
        let dir = tmp.path().join("theirs");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o700);
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        assert!(matches!(open(&dir), Err(Error::Untrusted(_))));
    } else {
        // Without root no directory can be handed to another user; the root directory is one.
        assert!(matches!(open(Path::new("/")), Err(Error::Untrusted(_))));
    }
}

#[test]
fn symlinked_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    open(&real).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert!(matches!(open(&link), Err(Error::Untrusted(_))));
}

#[test]
fn regular_file_in_place_of_the_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, b"").unwrap();
    assert!(open(&file).is_err());
}

fn child(role: &str, envs: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env("KCACHE_TEST_ROLE", role);
    for var in [
        "KCACHE_DIR",
        "KCACHE_DISABLE",
        "KCACHE_MAX_SIZE",
        "KCACHE_KEY_FILE",
        "KCACHE_REQUIRE_KEY",
        "XDG_CACHE_HOME",
        "HOME",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "child {role} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs inside a child process only; a no-op in the normal test run.
#[test]
fn child_role() {
    let Ok(role) = std::env::var("KCACHE_TEST_ROLE") else {
        return;
    };
    let dir = |name: &str| {
        std::env::var_os(name)
            .map(std::path::PathBuf::from)
            .unwrap()
    };
    match role.as_str() {
        "untrusted-three-times" => {
            let base = dir("TEST_BASE");
            for name in ["w1", "w2", "w3"] {
                let d = base.join(name);
                std::fs::create_dir(&d).unwrap();
                chmod(&d, 0o777);
                assert!(matches!(open(&d), Err(Error::Untrusted(_))));
            }
        }
        "disabled" => {
            let r = Persistence::open(PersistenceConfig::from_env());
            assert!(matches!(r, Err(Error::Unavailable(_))), "{:?}", r.err());
        }
        "print-dir" => {
            let disk = Persistence::open(PersistenceConfig::from_env()).unwrap();
            println!("DIR={}", disk.path().display());
            println!("MAX={}", disk.max_size());
            println!("FP={:?}", disk.fingerprint());
        }
        "no-dir" => {
            let r = Persistence::open(PersistenceConfig::from_env());
            assert!(matches!(r, Err(Error::Unavailable(_))), "{:?}", r.err());
        }
        "bad-key-file" => {
            let r = Persistence::open(PersistenceConfig::from_env());
            assert!(matches!(r, Err(Error::Untrusted(_))), "{:?}", r.err());
        }
        "open-three-times" => {
            for _ in 0..3 {
                match Persistence::open(PersistenceConfig::from_env()) {
                    Ok(disk) => println!("OPEN=ok {}", disk.path().display()),
                    Err(e) => println!("OPEN={e:?}"),
                }
            }
        }
        "umask" => {
            let mask = u32::from_str_radix(&std::env::var("TEST_UMASK").unwrap(), 8).unwrap();
            rustix::process::umask(rustix::fs::Mode::from_raw_mode(mask));
            open(&dir("TEST_BASE").join("a/b/cache")).unwrap();
        }
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

#[test]
fn untrusted_directory_warns_once_per_process() {
    let tmp = tempfile::tempdir().unwrap();
    let out = child("untrusted-three-times", &[("TEST_BASE", tmp.path())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings = stderr
        .lines()
        .filter(|l| l.starts_with("kcache: disk tier disabled"))
        .count();
    assert_eq!(warnings, 1, "{stderr}");
}

#[test]
fn kcache_disable_turns_the_tier_off() {
    let tmp = tempfile::tempdir().unwrap();
    child(
        "disabled",
        &[
            ("KCACHE_DISABLE", Path::new("1")),
            ("KCACHE_DIR", tmp.path()),
        ],
    );
}

fn lines(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn directory_resolution_order() {
    let tmp = tempfile::tempdir().unwrap();
    let (explicit, xdg, home) = (
        tmp.path().join("explicit"),
        tmp.path().join("xdg"),
        tmp.path().join("home"),
    );
    let out = child(
        "print-dir",
        &[
            ("KCACHE_DIR", &explicit),
            ("XDG_CACHE_HOME", &xdg),
            ("HOME", &home),
        ],
    );
    assert!(lines(&out).contains(&format!("DIR={}\n", explicit.display())));
    let out = child("print-dir", &[("XDG_CACHE_HOME", &xdg), ("HOME", &home)]);
    assert!(lines(&out).contains(&format!("DIR={}\n", xdg.join("kcache").display())));
    let out = child("print-dir", &[("HOME", &home)]);
    let expected = home.join(".cache/kcache");
    assert!(lines(&out).contains(&format!("DIR={}\n", expected.display())));
    assert_eq!(std::fs::metadata(&expected).unwrap().mode() & 0o777, 0o700);
    // Nothing configured: no directory, and certainly no fallback to /tmp.
    child("no-dir", &[]);
}

#[test]
fn max_size_and_key_file_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let out = child(
        "print-dir",
        &[
            ("KCACHE_DIR", tmp.path()),
            ("KCACHE_MAX_SIZE", Path::new("64Ki")),
        ],
    );
    assert!(lines(&out).contains("MAX=65536\n"), "{}", lines(&out));
    assert!(lines(&out).contains("FP=[0, 0, 0, 0, 0, 0, 0, 0]\n"));

    let key_file = tmp.path().join("key");
    std::fs::write(&key_file, b"an operator key of 32 bytes!!!!!").unwrap();
    chmod(&key_file, 0o600);
    let out = child(
        "print-dir",
        &[("KCACHE_DIR", tmp.path()), ("KCACHE_KEY_FILE", &key_file)],
    );
    assert!(!lines(&out).contains("FP=[0, 0, 0, 0, 0, 0, 0, 0]\n"));

    // Whoever can replace the key can forge entries: a writable key file disables the tier.
    chmod(&key_file, 0o666);
    child(
        "bad-key-file",
        &[("KCACHE_DIR", tmp.path()), ("KCACHE_KEY_FILE", &key_file)],
    );
}

#[test]
fn trusted_directory_survives_its_path_being_swapped() {
    // Operations go through the descriptor opened at `open`: replacing the path by a
    // symlink afterwards does not redirect writes.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let disk = open(&dir).unwrap();
    let moved = tmp.path().join("moved");
    std::fs::rename(&dir, &moved).unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
    let k = KeyBuilder::new().entry("x").finish().unwrap();
    disk.put(&k, b"v", Duration::ZERO).unwrap();
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    assert_eq!(disk.get(&k).unwrap().unwrap().payload(), b"v");
}

#[test]
fn every_created_directory_is_private_whatever_the_umask() {
    // A umask of 000 must not leave world-writable parents, nor one of 277 an unwritable cache.
    for mask in ["000", "277"] {
        let tmp = tempfile::tempdir().unwrap();
        child(
            "umask",
            &[("TEST_BASE", tmp.path()), ("TEST_UMASK", Path::new(mask))],
        );
        for sub in ["a", "a/b", "a/b/cache"] {
            let mode = std::fs::metadata(tmp.path().join(sub)).unwrap().mode() & 0o7777;
            assert_eq!(mode, 0o700, "{sub} under umask {mask}");
        }
    }
}

#[test]
fn existing_parents_keep_their_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("shared");
    std::fs::create_dir(&parent).unwrap();
    chmod(&parent, 0o755);
    open(&parent.join("cache")).unwrap();
    assert_eq!(std::fs::metadata(&parent).unwrap().mode() & 0o7777, 0o755);
}

#[test]
fn relative_or_empty_directories_are_refused() {
    // Resolved against the working directory, the cache would land wherever the process runs.
    let name = format!("kcache-relative-{}", std::process::id());
    let r = open(Path::new(&name).join("cache").as_path());
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{:?}", r.err());
    assert!(!Path::new(&name).exists());
    let r = open(Path::new(""));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{:?}", r.err());
}

/// Runs `open-three-times` with `envs` and returns the outcome of each open (what follows
/// `OPEN=`) and the child's stderr.
fn open_three_times(envs: &[(&str, &Path)]) -> (Vec<String>, String) {
    let out = child("open-three-times", envs);
    let opens = lines(&out)
        .lines()
        .filter_map(|l| l.split_once("OPEN=").map(|(_, outcome)| outcome.to_owned()))
        .collect();
    (opens, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// How many of `opens` start with `prefix`.
fn opened(opens: &[String], prefix: &str) -> usize {
    opens.iter().filter(|o| o.starts_with(prefix)).count()
}

fn count(haystack: &str, line: &str) -> usize {
    haystack.lines().filter(|l| *l == line).count()
}

#[test]
fn relative_kcache_dir_is_ignored_with_one_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let (stdout, stderr) =
        open_three_times(&[("KCACHE_DIR", Path::new("relative/cache")), ("HOME", &home)]);
    let expected = format!("ok {}", home.join(".cache/kcache").display());
    assert_eq!(opened(&stdout, &expected), 3, "{stdout:?}");
    let warning = r#"kcache: KCACHE_DIR="relative/cache" is a relative path: ignored"#;
    assert_eq!(count(&stderr, warning), 1, "{stderr}");
}

#[test]
fn bad_max_size_turns_the_tier_off_with_one_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let (stdout, stderr) = open_three_times(&[
        ("KCACHE_DIR", tmp.path()),
        ("KCACHE_MAX_SIZE", Path::new("lots")),
    ]);
    assert_eq!(opened(&stdout, "Unavailable("), 3, "{stdout:?}");
    let warning = r#"kcache: KCACHE_MAX_SIZE="lots" is not a positive size (bytes, or with a unit: k, M, G, T, Ki, Mi, Gi, Ti): the disk tier is off"#;
    assert_eq!(count(&stderr, warning), 1, "{stderr}");
}

/// With `key_file` as `KCACHE_KEY_FILE` the tier is refused three times as untrusted, with
/// exactly one warning, which names the variable and `reason`.
fn assert_key_file_refused(key_file: &Path, reason: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (stdout, stderr) =
        open_three_times(&[("KCACHE_DIR", tmp.path()), ("KCACHE_KEY_FILE", key_file)]);
    assert_eq!(opened(&stdout, "Untrusted("), 3, "{stdout:?}");
    let prefix = format!("kcache: KCACHE_KEY_FILE={:?}: ", key_file.as_os_str());
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains(reason), "{stderr}");
    assert!(warnings[0].ends_with(": the disk tier is off"), "{stderr}");
}

#[test]
fn unusable_key_files_turn_the_tier_off_with_one_warning() {
    let tmp = tempfile::tempdir().unwrap();
    // Empty is not "unset": a variable that failed to expand must not drop the key silently.
    assert_key_file_refused(Path::new(""), "set but empty");
    assert_key_file_refused(Path::new("relative/key"), "relative path");
    assert_key_file_refused(&tmp.path().join("missing"), "cannot open");
    let readable = tmp.path().join("readable");
    std::fs::write(&readable, [7u8; 32]).unwrap();
    chmod(&readable, 0o640);
    assert_key_file_refused(&readable, "gives group or others access");
}

#[test]
fn required_key_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    for value in ["1", "yes"] {
        let dir = tmp.path().join(format!("required-{value}"));
        let (stdout, stderr) = open_three_times(&[
            ("KCACHE_DIR", &dir),
            ("KCACHE_REQUIRE_KEY", Path::new(value)),
        ]);
        assert_eq!(opened(&stdout, "Untrusted("), 3, "{stdout:?}");
        let warning = "kcache: disk tier disabled: an operator key is required (require_key or \
                       KCACHE_REQUIRE_KEY=1) and none is configured";
        assert_eq!(count(&stderr, warning), 1, "{stderr}");
        // Refused before anything is created.
        assert!(!dir.exists());
    }
    let stderr = open_three_times(&[
        ("KCACHE_DIR", tmp.path()),
        ("KCACHE_REQUIRE_KEY", Path::new("yes")),
    ])
    .1;
    assert_eq!(
        count(
            &stderr,
            r#"kcache: KCACHE_REQUIRE_KEY="yes" is neither 0 nor 1: taken as 1"#
        ),
        1,
        "{stderr}"
    );
    let key_file = tmp.path().join("key");
    std::fs::write(&key_file, [7u8; 32]).unwrap();
    chmod(&key_file, 0o600);
    let (stdout, _) = open_three_times(&[
        ("KCACHE_DIR", tmp.path()),
        ("KCACHE_REQUIRE_KEY", Path::new("1")),
        ("KCACHE_KEY_FILE", &key_file),
    ]);
    assert_eq!(
        opened(&stdout, &format!("ok {}", tmp.path().display())),
        3,
        "{stdout:?}"
    );
}

#[test]
fn required_key_in_the_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let config = PersistenceConfig {
        require_key: true,
        ..PersistenceConfig::in_dir(&dir)
    };
    match Persistence::open(config) {
        Err(Error::Untrusted(m)) => assert!(m.contains("operator key is required"), "{m}"),
        other => panic!("{:?}", other.err()),
    }
    assert!(!dir.exists());
    let config = PersistenceConfig {
        require_key: true,
        key: Some(OperatorKey::new([7u8; 16]).unwrap()),
        ..PersistenceConfig::in_dir(&dir)
    };
    assert_ne!(Persistence::open(config).unwrap().fingerprint(), [0; 8]);
}
