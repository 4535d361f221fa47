//! `OperatorKey::from_file`: which files may hold the operator key. Whoever can read the key
//! can forge entries and whoever can replace it can make kcache trust their entries, so only a
//! regular file private to the effective user (or root) is accepted. The remote tier's TLS
//! files get the same checks (a private key the same privacy) when a disk tier opens.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use kcache::Error;
use kcache::disk::OperatorKey;
use kcache::disk::config::{MAX_OPERATOR_KEY_LEN, MIN_OPERATOR_KEY_LEN};
use kcache_testkit::{assert_err, fifo, file_with_mode};

#[test]
fn a_private_regular_file_is_accepted_through_a_symlink() {
    let tmp = tempfile::tempdir().unwrap();
    let file = file_with_mode(tmp.path(), "key", &[7; 32], 0o600);
    assert!(OperatorKey::from_file(&file).is_ok());
    assert!(
        OperatorKey::from_file(&file_with_mode(tmp.path(), "read-only", &[7; 32], 0o400)).is_ok()
    );
    // Mounted secrets are usually symlinks into a private directory.
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert!(OperatorKey::from_file(&link).is_ok());
}

#[test]
fn any_group_or_other_permission_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for mode in [0o640, 0o604, 0o610, 0o601, 0o620, 0o602, 0o644] {
        let file = file_with_mode(tmp.path(), &format!("m{mode:o}"), &[7; 32], mode);
        match OperatorKey::from_file(&file) {
            Err(Error::Untrusted(m)) => assert!(m.contains("group or others"), "{m}"),
            other => panic!("mode {mode:o}: {other:?}"),
        }
    }
}

/// Asserts that the key file at `path` is refused as untrusted, with a message containing `says`.
fn assert_untrusted(path: &Path, says: &str) {
    match OperatorKey::from_file(path) {
        Err(Error::Untrusted(m)) => assert!(m.contains(says), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_of_another_user_is_refused() {
    if !rustix::process::geteuid().is_root() {
        // Only root can give a file away; root-owned files are accepted by design.
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = file_with_mode(tmp.path(), "theirs", &[7; 32], 0o600);
    std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
    assert_untrusted(&file, "owned by uid 65534");
}

#[test]
fn a_fifo_is_refused_without_waiting_for_a_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = fifo(tmp.path(), "fifo");
    // A blocking open would wait here forever: no process ever opens the FIFO for writing.
    assert_untrusted(&fifo, "not a regular file");
}

#[test]
fn directories_and_relative_paths_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dir");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_err!(OperatorKey::from_file(&dir), Error::Untrusted(_));
    // Relative to whatever the working directory is: refused before anything is opened.
    assert_err!(
        OperatorKey::from_file(Path::new("Cargo.toml")),
        Error::InvalidArgument(_)
    );
}

#[test]
fn lengths() {
    let tmp = tempfile::tempdir().unwrap();
    for (len, ok) in [
        (0, false),
        (MIN_OPERATOR_KEY_LEN - 1, false),
        (MIN_OPERATOR_KEY_LEN, true),
        (MAX_OPERATOR_KEY_LEN, true),
        (MAX_OPERATOR_KEY_LEN + 1, false),
        (1 << 20, false),
    ] {
        let file = file_with_mode(tmp.path(), &format!("len{len}"), &vec![7u8; len], 0o600);
        let r = OperatorKey::from_file(&file);
        assert_eq!(r.is_ok(), ok, "{len} bytes: {r:?}");
        if !ok {
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "{len}: {r:?}");
        }
    }
}

#[test]
fn the_key_is_wiped_on_drop() {
    fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>() {}
    wiped_on_drop::<OperatorKey>();
}

/// The remote tier's TLS files, opened with a disk tier: only with the remote tier built in.
#[cfg(feature = "remote")]
mod tls {
    use std::time::Duration;

    use kcache::remote::RemoteConfig;
    use kcache::{Persistence, PersistenceConfig};
    use kcache_testkit::needs;

    use super::*;

    /// Opens a keyed disk tier in a new directory with a `rediss://` remote of `tls`'s files, on a
    /// thread (a watchdog turns a hang into a failure); whether the remote tier is on.
    fn remote_is_on(tls: RemoteConfig) -> bool {
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let dir = tempfile::tempdir().unwrap();
            let disk = Persistence::open(PersistenceConfig {
                key: Some(OperatorKey::new(vec![7; 32]).unwrap()),
                remote: Some(RemoteConfig {
                    url: Some("rediss://127.0.0.1:1/".into()),
                    ..tls
                }),
                ..PersistenceConfig::in_dir(dir.path())
            })
            .unwrap();
            done.send(disk.remote_stats().is_some()).unwrap();
        });
        result
            .recv_timeout(Duration::from_secs(30))
            .expect("opening the disk tier hung")
    }

    #[test]
    fn tls_files_get_the_same_checks() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = fifo(tmp.path(), "ca-fifo");
        // A FIFO as the CA file: refused at once (it hung the open), the remote off, the disk on.
        assert!(!remote_is_on(RemoteConfig {
            ca_file: Some(fifo),
            ..RemoteConfig::default()
        }));
        // A client key anyone may read is refused; the same key private is accepted (the files
        // are parsed when the client is built: a real certificate and key, made by openssl).
        let pem = |name: &str| tmp.path().join(name);
        let openssl = needs::program("openssl", "apt install openssl");
        let Some(openssl) = needs::met(openssl) else {
            return;
        };
        let made = std::process::Command::new(openssl)
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args([
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=kcache-client",
                "-keyout",
            ])
            .arg(pem("key.pem"))
            .arg("-out")
            .arg(pem("cert.pem"))
            .output()
            .unwrap();
        assert!(made.status.success(), "openssl req failed");
        let client = |mode: u32| {
            std::fs::set_permissions(pem("key.pem"), std::fs::Permissions::from_mode(mode))
                .unwrap();
            remote_is_on(RemoteConfig {
                cert_file: Some(pem("cert.pem")),
                key_file: Some(pem("key.pem")),
                ..RemoteConfig::default()
            })
        };
        assert!(client(0o600));
        assert!(!client(0o644));
        assert!(!client(0o640));
        assert!(client(0o400));
    }
}
