//! The remote tier is a cargo feature (`remote`, on by default). With it, a configured remote
//! is opened; without it, the same configuration is warned about, never ignored silently.
//! `cargo test --test remote_feature` and `cargo test --no-default-features --test
//! remote_feature` check both builds.

use std::sync::{Arc, Mutex};

use kcache::disk::OperatorKey;
use kcache::log::{self, Level};
use kcache::remote::RemoteConfig;
use kcache::{Persistence, PersistenceConfig};

#[test]
fn a_configured_remote_is_opened_or_warned_about() {
    let warnings = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&warnings);
    log::set_hook(move |level, message| {
        if level == Level::Warn {
            seen.lock().unwrap().push(message.to_owned());
        }
    });
    let dir = tempfile::tempdir().unwrap();
    // Opening connects to nothing (connections are made on first use): no server is needed.
    let disk = Persistence::open(PersistenceConfig {
        key: Some(OperatorKey::new(vec![7; 32]).unwrap()),
        remote: Some(RemoteConfig::at("redis://:hunter2@127.0.0.1:1/")),
        ..PersistenceConfig::in_dir(dir.path())
    })
    .unwrap();
    log::reset_hook();
    let warnings = warnings.lock().unwrap().clone();
    let not_built: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("built without it (cargo feature `remote`)"))
        .collect();
    if cfg!(feature = "remote") {
        assert!(disk.remote_stats().is_some(), "the remote tier is off");
        assert!(not_built.is_empty(), "{warnings:?}");
    } else {
        assert!(disk.remote_stats().is_none());
        assert_eq!(not_built.len(), 1, "{warnings:?}");
        assert!(
            not_built[0].contains("redis://:***@127.0.0.1:1/"),
            "{warnings:?}"
        );
        assert!(!not_built[0].contains("hunter2"), "{warnings:?}");
    }
}
