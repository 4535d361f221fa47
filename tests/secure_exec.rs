//! The disk tier in a secure-execution process. The test binary re-runs itself with its real
//! user id set to `nobody` and its effective id left as root (`setpriv --ruid`), which is how a
//! setuid-root program started by `nobody` runs: kcache must then read nothing from the
//! environment but `KCACHE_DISABLE` (no `KCACHE_REMOTE_*` either), and use the disk only in a
//! directory the program names.
//! Processes that drop their privileges themselves (setuid() from root, PR_SET_DUMPABLE 0) are
//! not in that mode: they read their environment, key file and log level as usual.
//! Needs root and `setpriv`; `c-tests/secure/` checks a real setuid binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use kcache::Error;
use kcache::disk::{DEFAULT_MAX_SIZE, OperatorKey};
use kcache::remote::RemoteConfig;
use kcache::{Persistence, PersistenceConfig};

const NOBODY: &str = "65534";

/// Runs `role` as a secure-execution process with `envs`; `None` where this machine cannot.
fn secure_child(role: &str, envs: &[(&str, &Path)]) -> Option<String> {
    if !rustix::process::geteuid().is_root()
        || Command::new("setpriv").arg("--version").output().is_err()
    {
        eprintln!("skipped: needs root and setpriv to make a secure-execution process");
        return None;
    }
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--ruid={NOBODY}"))
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env("KCACHE_TEST_ROLE", role);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child {role} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout)
}

/// Runs inside a child process only; a no-op in the normal test run.
#[test]
fn child_role() {
    let Ok(role) = std::env::var("KCACHE_TEST_ROLE") else {
        return;
    };
    assert!(kcache::env::secure_execution());
    assert_eq!(kcache::env::var_os("KCACHE_DIR"), None);
    let explicit = PathBuf::from(std::env::var_os("TEST_EXPLICIT").unwrap());
    match role.as_str() {
        "configured-by-the-environment" => {
            match Persistence::open(PersistenceConfig::from_env()) {
                Err(Error::Unavailable(m)) => assert_eq!(
                    m,
                    "secure-execution process: the disk tier needs an explicit directory"
                ),
                other => panic!("{:?}", other.err()),
            }
            // The program's own directory is used, with none of the environment's settings
            // but KCACHE_REQUIRE_KEY=1, which can only take the tier away: no key file, so
            // without a key of the program's the tier is refused...
            let unkeyed = Persistence::open(PersistenceConfig {
                dir: Some(explicit.clone()),
                ..PersistenceConfig::from_env()
            });
            match unkeyed {
                Err(Error::Untrusted(m)) => assert!(m.contains("key is required"), "{m}"),
                other => panic!("{:?}", other.err()),
            }
            // ...and with one it is used, keyed by the program's key and with the default cap.
            let own_key = || Some(OperatorKey::new(vec![5; 32]).unwrap());
            let disk = Persistence::open(PersistenceConfig {
                dir: Some(explicit.clone()),
                key: own_key(),
                ..PersistenceConfig::from_env()
            })
            .unwrap();
            let reference = tempfile::tempdir().unwrap();
            let expected = Persistence::open(PersistenceConfig {
                key: own_key(),
                ..PersistenceConfig::in_dir(reference.path())
            })
            .unwrap()
            .fingerprint();
            assert_eq!(disk.fingerprint(), expected);
            assert_ne!(expected, [0; 8]);
            assert_eq!(disk.max_size(), DEFAULT_MAX_SIZE);
            // No remote from KCACHE_REMOTE_URL; and the client certificate of
            // KCACHE_REMOTE_CERT_FILE, without its key, would refuse the program's own remote if
            // it were read.
            let keyed = |remote: RemoteConfig| {
                let dir = tempfile::tempdir().unwrap();
                Persistence::open(PersistenceConfig {
                    dir: Some(dir.path().to_path_buf()),
                    key: Some(OperatorKey::new(vec![9; 32]).unwrap()),
                    remote: Some(remote),
                    ..PersistenceConfig::from_env()
                })
                .unwrap()
                .remote_stats()
            };
            assert_eq!(kcache::env::var_os("KCACHE_REMOTE_CERT_FILE"), None);
            assert!(keyed(RemoteConfig::from_env()).is_none());
            let own = RemoteConfig {
                read_env: true,
                ..RemoteConfig::at("rediss://127.0.0.1:1/")
            };
            assert!(keyed(own).is_some());
        }
        "disabled" => {
            let r = Persistence::open(PersistenceConfig {
                dir: Some(explicit),
                ..PersistenceConfig::from_env()
            });
            assert!(matches!(r, Err(Error::Unavailable(_))), "{:?}", r.err());
        }
        other => panic!("unknown role {other}"),
    }
    println!("CHILD=done");
    std::process::exit(0);
}

#[test]
fn the_environment_configures_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (env_dir, home, xdg, explicit) = (
        tmp.path().join("env-dir"),
        tmp.path().join("home"),
        tmp.path().join("xdg"),
        tmp.path().join("explicit"),
    );
    let key_file = tmp.path().join("key");
    std::fs::write(&key_file, [7u8; 32]).unwrap();
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let Some(stdout) = secure_child(
        "configured-by-the-environment",
        &[
            ("KCACHE_DIR", &env_dir),
            ("HOME", &home),
            ("XDG_CACHE_HOME", &xdg),
            ("KCACHE_KEY_FILE", &key_file),
            ("KCACHE_MAX_SIZE", Path::new("64K")),
            ("KCACHE_REQUIRE_KEY", Path::new("1")),
            ("KCACHE_REMOTE_URL", Path::new("redis://127.0.0.1:1/")),
            ("KCACHE_REMOTE_CERT_FILE", &key_file),
            ("TEST_EXPLICIT", &explicit),
        ],
    ) else {
        return;
    };
    assert!(stdout.contains("CHILD=done"), "{stdout}");
    for unused in [&env_dir, &home, &xdg] {
        assert!(!unused.exists(), "{} was created", unused.display());
    }
    assert!(explicit.is_dir());
}

#[test]
fn kcache_disable_still_turns_the_tier_off() {
    // It can only take the tier away, so the user who starts the program may set it.
    let tmp = tempfile::tempdir().unwrap();
    let explicit = tmp.path().join("explicit");
    let Some(stdout) = secure_child(
        "disabled",
        &[
            ("KCACHE_DISABLE", Path::new("1")),
            ("TEST_EXPLICIT", &explicit),
        ],
    ) else {
        return;
    };
    assert!(stdout.contains("CHILD=done"), "{stdout}");
    assert!(!explicit.exists());
}

// --- processes that drop privileges themselves ------------------------------------------------
//
// A root daemon that switches to a service user with setuid(), or a process that makes itself
// non-dumpable, can no longer read its own /proc/self/auxv, but it is no setuid program: its
// environment came from whoever started it, as it was then, and is read as usual. The key file
// is read with the credentials of the moment the cache is opened, so it must be the service
// user's own (or the cache opened before the drop).

/// How a [`dropped_role`] child loses its privileges.
#[derive(Clone, Copy)]
enum Drop {
    /// Started as root, it calls setgid() and setuid() to nobody.
    Setuid,
    /// Started as nobody (by `setpriv`, no privilege gained at exec), it calls
    /// prctl(PR_SET_DUMPABLE, 0).
    Undumpable,
}

/// Runs inside a child process only; a no-op in the normal test run.
#[test]
fn dropped_role() {
    let Ok(how) = std::env::var("KCACHE_TEST_DROP") else {
        return;
    };
    let nobody = 65534;
    // SAFETY: plain libc calls on ids and the process's own flag; glibc applies set*id to
    // every thread of the process.
    unsafe {
        match how.as_str() {
            "setuid" => {
                assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
                assert_eq!(libc::setgid(nobody), 0);
                assert_eq!(libc::setuid(nobody), 0);
            }
            "undumpable" => {
                assert_eq!(libc::getuid(), nobody);
                assert_eq!(libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0), 0);
            }
            other => panic!("unknown drop {other}"),
        }
    }
    assert!(
        std::fs::read("/proc/self/auxv").is_err(),
        "the process can still read its auxiliary vector: the test shows nothing"
    );
    assert!(!kcache::env::secure_execution());
    // KCACHE_LOG is read.
    assert_eq!(kcache::log::level(), kcache::log::Level::Debug);
    let mut config = PersistenceConfig::from_env();
    config.remote = Some(RemoteConfig::default());
    let opened = Persistence::open(config);
    match std::env::var("TEST_EXPECT").unwrap().as_str() {
        "keyed" => {
            let disk = opened.unwrap();
            assert_eq!(
                disk.path(),
                Path::new(&std::env::var_os("KCACHE_DIR").unwrap())
            );
            let fingerprint: String = disk
                .fingerprint()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            println!("FINGERPRINT={fingerprint}");
        }
        refused => match opened {
            Err(Error::Untrusted(m)) => println!("REFUSED={} ({m})", m.contains(refused)),
            other => panic!("{:?}", other.err()),
        },
    }
    std::process::exit(0);
}

/// Runs [`dropped_role`] dropping privileges `how`, with `envs` and `KCACHE_LOG=debug`; `None`
/// where this machine cannot.
fn dropped_child(how: Drop, expect: &str, envs: &[(&str, &Path)]) -> Option<String> {
    if !rustix::process::geteuid().is_root()
        || Command::new("setpriv").arg("--version").output().is_err()
    {
        eprintln!("skipped: needs root and setpriv to drop privileges");
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match how {
        Drop::Setuid => Command::new(&exe),
        Drop::Undumpable => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
                .arg(&exe);
            c
        }
    };
    cmd.args(["--exact", "dropped_role", "--nocapture", "--test-threads=1"])
        .env(
            "KCACHE_TEST_DROP",
            match how {
                Drop::Setuid => "setuid",
                Drop::Undumpable => "undumpable",
            },
        )
        .env("TEST_EXPECT", expect)
        .env("KCACHE_LOG", "debug")
        .env_remove("KCACHE_KEY_FILE")
        .env_remove("KCACHE_REQUIRE_KEY")
        .env_remove("KCACHE_DISABLE");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed: {stdout}\n{stderr}");
    Some(format!("{stdout}\n{stderr}"))
}

/// A directory nobody can reach, with nobody's cache directory and key file in it, a key file
/// only root can read, and the fingerprint of nobody's key.
struct ServiceFiles {
    _tmp: tempfile::TempDir,
    cache: PathBuf,
    key: PathBuf,
    root_key: PathBuf,
    fingerprint: String,
}

fn service_files() -> ServiceFiles {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cache = tmp.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    let key = tmp.path().join("service.key");
    let root_key = tmp.path().join("root.key");
    for path in [&key, &root_key] {
        std::fs::write(path, [3u8; 32]).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let nobody = Some(NOBODY.parse().unwrap());
    std::os::unix::fs::chown(&cache, nobody, nobody).unwrap();
    std::os::unix::fs::chown(&key, nobody, nobody).unwrap();
    let reference = tempfile::tempdir().unwrap();
    let fingerprint = Persistence::open(PersistenceConfig {
        key: Some(OperatorKey::new(vec![3; 32]).unwrap()),
        ..PersistenceConfig::in_dir(reference.path())
    })
    .unwrap()
    .fingerprint()
    .iter()
    .map(|b| format!("{b:02x}"))
    .collect();
    ServiceFiles {
        _tmp: tmp,
        cache,
        key,
        root_key,
        fingerprint,
    }
}

/// [`dropped_child`] on the service's cache directory with `KCACHE_REQUIRE_KEY=1`, and
/// `key_file` as `KCACHE_KEY_FILE` where given.
fn key_required_child(
    how: Drop,
    files: &ServiceFiles,
    expect: &str,
    key_file: Option<&Path>,
) -> Option<String> {
    let mut envs = vec![
        ("KCACHE_DIR", files.cache.as_path()),
        ("KCACHE_REQUIRE_KEY", Path::new("1")),
    ];
    envs.extend(key_file.map(|key| ("KCACHE_KEY_FILE", key)));
    dropped_child(how, expect, &envs)
}

#[test]
fn a_process_that_drops_privileges_uses_its_key_file_and_log() {
    let files = service_files();
    for how in [Drop::Setuid, Drop::Undumpable] {
        let Some(out) = key_required_child(how, &files, "keyed", Some(&files.key)) else {
            return;
        };
        assert!(
            out.contains(&format!("FINGERPRINT={}", files.fingerprint)),
            "{out}"
        );
    }
}

#[test]
fn a_process_that_drops_privileges_never_goes_silently_unkeyed() {
    let files = service_files();
    for how in [Drop::Setuid, Drop::Undumpable] {
        // The key is required and none is configured: the tier refuses, and says so.
        let Some(out) = key_required_child(how, &files, "key is required", None) else {
            return;
        };
        assert!(out.contains("REFUSED=true"), "{out}");
        assert!(
            out.contains("kcache: disk tier disabled: an operator key is required"),
            "{out}"
        );
        // A key file the service user cannot read (root's, 0600): refused, not skipped.
        let out = dropped_child(
            how,
            "cannot open key file",
            &[
                ("KCACHE_DIR", &files.cache),
                ("KCACHE_KEY_FILE", &files.root_key),
            ],
        )
        .unwrap();
        assert!(out.contains("REFUSED=true"), "{out}");
        assert!(out.contains("Permission denied"), "{out}");
    }
}
