//! The disk tier in a secure-execution process. The test binary re-runs itself with its real
//! user id set to `nobody` and its effective id left as root (`setpriv --ruid`), which is how a
//! setuid-root program started by `nobody` runs: kcache must then read nothing from the
//! environment but `KCACHE_DISABLE` (no `KCACHE_REMOTE_*` either), and use the disk only in a
//! directory the program names.
//! Needs root and `setpriv`; `c-tests/secure/` checks a real setuid binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use kcache::Error;
use kcache::disk::{DEFAULT_MAX_SIZE, DiskCache, DiskConfig, OperatorKey};
use kcache::remote::RemoteConfig;

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
            match DiskCache::open(DiskConfig::from_env()) {
                Err(Error::Unavailable(m)) => assert_eq!(
                    m,
                    "secure-execution process: the disk tier needs an explicit directory"
                ),
                other => panic!("{:?}", other.err()),
            }
            // The program's own directory is used, with none of the environment's settings:
            // no key file (nor the requirement of one) and the default cap.
            let disk = DiskCache::open(DiskConfig {
                dir: Some(explicit.clone()),
                ..DiskConfig::from_env()
            })
            .unwrap();
            assert_eq!(disk.fingerprint(), [0; 8]);
            assert_eq!(disk.max_size(), DEFAULT_MAX_SIZE);
            // What the program requires still counts.
            let required = DiskCache::open(DiskConfig {
                dir: Some(explicit),
                require_key: true,
                ..DiskConfig::from_env()
            });
            assert!(
                matches!(required, Err(Error::Untrusted(_))),
                "{:?}",
                required.err()
            );
            // No remote from KCACHE_REMOTE_URL; and the client certificate of
            // KCACHE_REMOTE_CERT_FILE, without its key, would refuse the program's own remote if
            // it were read.
            let keyed = |remote: RemoteConfig| {
                let dir = tempfile::tempdir().unwrap();
                DiskCache::open(DiskConfig {
                    dir: Some(dir.path().to_path_buf()),
                    key: Some(OperatorKey::new(vec![9; 32]).unwrap()),
                    remote: Some(remote),
                    ..DiskConfig::from_env()
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
            let r = DiskCache::open(DiskConfig {
                dir: Some(explicit),
                ..DiskConfig::from_env()
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
