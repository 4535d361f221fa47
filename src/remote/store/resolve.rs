//! The remote tier's settings resolved: explicit values first, then the environment, then
//! defaults, into the server to reach (`crate::remote::config` says what may be set).

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::{ClientTlsConfig, TlsCertificates};

use super::client::Target;
use crate::disk::config::saturate;
use crate::error::Error;
use crate::log::Warning;
use crate::operator_file::{self, Content};
use crate::remote::config::{
    DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_THRESHOLD, DEFAULT_LEASE_WAIT,
    DEFAULT_MAX_ENTRY_SIZE, DEFAULT_PREFIX, DEFAULT_TIMEOUT, DEFAULT_TTL, RemoteConfig,
};
use crate::store::settings::Settings;

impl RemoteConfig {
    /// The settings, or `None` (no remote, or a value that cannot be used, warned about).
    pub(crate) fn resolve(self) -> Option<Resolved> {
        let read_env = self.read_env;
        let env = |name: &str| {
            read_env
                .then(|| crate::env::var_os(name))
                .flatten()
                .filter(|v| !v.is_empty())
        };
        let url = match self.url {
            Some(url) => url,
            None => match env("KCACHE_REMOTE_URL")?.into_string() {
                Ok(url) => url,
                Err(_) => return SETTINGS.refuse("KCACHE_REMOTE_URL is not valid UTF-8"),
            },
        };
        let cluster = match self.cluster {
            Some(c) => c,
            None => SETTINGS.flag(env("KCACHE_REMOTE_CLUSTER"), "KCACHE_REMOTE_CLUSTER")?,
        };
        let ms = Duration::from_millis(1);
        let timeout = SETTINGS.wait(
            self.timeout,
            env,
            "KCACHE_REMOTE_TIMEOUT_MS",
            ms,
            DEFAULT_TIMEOUT,
        );
        if timeout.is_zero() {
            return SETTINGS.refuse("the remote timeout must be positive");
        }
        let path = |set: Option<PathBuf>, name: &str| set.or_else(|| env(name).map(PathBuf::from));
        let tls = match tls_files(
            path(self.ca_file, "KCACHE_REMOTE_CA_FILE"),
            path(self.cert_file, "KCACHE_REMOTE_CERT_FILE"),
            path(self.key_file, "KCACHE_REMOTE_KEY_FILE"),
        ) {
            Ok(tls) => tls,
            Err(why) => return SETTINGS.refuse(&why),
        };
        let target = match target(&url, cluster, tls) {
            Ok(target) => target,
            Err(e) => return SETTINGS.refuse(&format!("the remote URL cannot be used: {e}")),
        };
        let read_only = match self.read_only {
            Some(r) => r,
            None => SETTINGS.flag(env("KCACHE_REMOTE_READ_ONLY"), "KCACHE_REMOTE_READ_ONLY")?,
        };
        let allow_unkeyed = self.allow_unkeyed
            || SETTINGS.flag(
                env("KCACHE_REMOTE_ALLOW_UNKEYED"),
                "KCACHE_REMOTE_ALLOW_UNKEYED",
            )?;
        let s = Duration::from_secs(1);
        let ttl = SETTINGS.wait(self.ttl, env, "KCACHE_REMOTE_TTL", s, DEFAULT_TTL);
        let prefix = match (self.prefix, env("KCACHE_REMOTE_PREFIX")) {
            (Some(p), _) => p,
            (None, Some(text)) => match text.into_string() {
                Ok(p) => p,
                Err(_) => return SETTINGS.refuse("KCACHE_REMOTE_PREFIX is not valid UTF-8"),
            },
            (None, None) => DEFAULT_PREFIX.to_owned(),
        };
        let max_entry_size = match (self.max_entry_size, env("KCACHE_REMOTE_MAX_ENTRY_SIZE")) {
            (Some(s), _) => s,
            (None, Some(text)) => match crate::disk::parse_size(&text.to_string_lossy()) {
                Ok(s) => s,
                Err(_) => {
                    return SETTINGS.refuse(&format!(
                        "KCACHE_REMOTE_MAX_ENTRY_SIZE={text:?} is not a size"
                    ));
                }
            },
            (None, None) => DEFAULT_MAX_ENTRY_SIZE,
        };
        let lease_wait = SETTINGS.wait(
            self.lease_wait,
            env,
            "KCACHE_REMOTE_LEASE_WAIT",
            s,
            DEFAULT_LEASE_WAIT,
        );
        if max_entry_size == 0 {
            return SETTINGS.refuse("the remote entry size limit must be positive");
        }
        Some(Resolved {
            target,
            read_only,
            allow_unkeyed,
            timeout,
            ttl,
            prefix,
            max_entry_size,
            lease_wait,
            breaker_threshold: self.breaker_threshold.unwrap_or(DEFAULT_BREAKER_THRESHOLD),
            breaker_cooldown: saturate(self.breaker_cooldown.unwrap_or(DEFAULT_BREAKER_COOLDOWN)),
        })
    }
}

pub(crate) struct Resolved {
    pub target: Target,
    pub read_only: bool,
    pub allow_unkeyed: bool,
    pub timeout: Duration,
    pub ttl: Duration,
    pub prefix: String,
    pub max_entry_size: u64,
    pub lease_wait: Duration,
    pub breaker_threshold: u32,
    pub breaker_cooldown: Duration,
}

/// A single server, or a Redis Cluster when `cluster` is set or `url` lists several seed nodes
/// (comma-separated). With `tls`, `rediss://` servers are verified against its certificate
/// authority alone (else the system's roots) and shown its client certificate.
fn target(url: &str, cluster: bool, tls: Option<TlsCertificates>) -> redis::RedisResult<Target> {
    let seeds: Vec<&str> = url.split(',').map(str::trim).collect();
    // TLS files with a plain URL are a mistake to report, not settings to drop silently.
    if tls.is_some() && seeds.iter().any(|s| !s.starts_with("rediss://")) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS files are set for a URL that is not rediss://",
        )));
    }
    Target::new(&seeds, cluster, tls)
}

/// The TLS files' contents as redis-rs takes them; `None` when none is named. A certificate
/// without its key, or a key without its certificate, is refused.
fn tls_files(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<TlsCertificates>, String> {
    let client_tls = match (cert, key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read_pem(&cert, "client certificate", Content::Public)?,
            // redis-rs takes the key's PEM by value and drops it once parsed; the parsed key
            // stays in its TLS settings for the client's life.
            client_key: read_pem(&key, "client key", Content::Secret)?,
        }),
        (Some(_), None) => {
            return Err("a client certificate is set without its key \
                        (KCACHE_REMOTE_KEY_FILE)"
                .into());
        }
        (None, Some(_)) => {
            return Err("a client key is set without its certificate \
                        (KCACHE_REMOTE_CERT_FILE)"
                .into());
        }
    };
    let root_cert = ca
        .map(|ca| read_pem(&ca, "CA file", Content::Public))
        .transpose()?;
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
}

/// The largest PEM file read: a bundle of a few hundred certificates.
const MAX_PEM_FILE: usize = 1 << 20;

/// The bytes of a PEM file (`what`, an absolute path), with the checks of every file an
/// operator names (see [`crate::operator_file`]); a private key must be private.
fn read_pem(path: &Path, what: &str, content: Content) -> Result<Vec<u8>, String> {
    operator_file::read(path, what, content, MAX_PEM_FILE)
        .map(|mut bytes| std::mem::take(&mut *bytes))
        .map_err(|e| match e {
            Error::InvalidArgument(m) | Error::Io(m) | Error::Untrusted(m) => m,
            other => other.to_string(),
        })
}

/// The remote tier's settings: its name in messages and its warnings.
const SETTINGS: Settings = Settings {
    tier: "remote tier",
    off: Warning::RemoteConfig,
    wait: Warning::RemoteWait,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::config::LONGEST_WAIT;

    #[test]
    fn explicit_values_and_refusals() {
        let ok = RemoteConfig {
            timeout: Some(Duration::from_millis(10)),
            ..RemoteConfig::at("redis://127.0.0.1:1/")
        }
        .resolve()
        .expect("a valid configuration");
        assert_eq!(ok.timeout, Duration::from_millis(10));
        assert_eq!(ok.prefix, DEFAULT_PREFIX);
        assert_eq!(ok.ttl, DEFAULT_TTL);
        assert!(!ok.read_only && !ok.allow_unkeyed);
        assert!(
            RemoteConfig::at("http://example.invalid/")
                .resolve()
                .is_none()
        );
        let zero = RemoteConfig {
            timeout: Some(Duration::ZERO),
            ..RemoteConfig::at("redis://127.0.0.1:1/")
        };
        assert!(zero.resolve().is_none());
        assert!(RemoteConfig::default().resolve().is_none());
        let half = |cert: bool| RemoteConfig {
            cert_file: cert.then(|| "/nonexistent/cert.pem".into()),
            key_file: (!cert).then(|| "/nonexistent/key.pem".into()),
            ..RemoteConfig::at("rediss://127.0.0.1:1/")
        };
        let refused = |c: RemoteConfig| {
            let cert = c.cert_file.clone();
            let key = c.key_file.clone();
            tls_files(None, cert, key).err().unwrap()
        };
        assert!(refused(half(true)).contains("without its key"));
        assert!(refused(half(false)).contains("without its certificate"));
        assert!(half(true).resolve().is_none() && half(false).resolve().is_none());
        assert!(tls_files(None, None, None).unwrap().is_none());
        let relative = tls_files(Some("ca.pem".into()), None, None).err().unwrap();
        assert!(relative.contains("relative path"), "{relative}");
    }

    /// Writes `text` at `dir/name` with `mode`.
    fn file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn tls_files_get_the_operator_file_checks() {
        let tmp = tempfile::tempdir().unwrap();
        let cert = file(tmp.path(), "cert.pem", "certificate", 0o644);
        let private = file(tmp.path(), "private.pem", "key", 0o600);
        let shared = file(tmp.path(), "shared.pem", "key", 0o640);
        let both = |key: &Path| tls_files(None, Some(cert.clone()), Some(key.to_path_buf()));
        let ok = both(&private).unwrap().unwrap().client_tls.unwrap();
        assert_eq!(
            (&ok.client_cert[..], &ok.client_key[..]),
            (&b"certificate"[..], &b"key"[..])
        );
        let refused = both(&shared).err().unwrap();
        assert!(
            refused.contains("gives group or others access"),
            "{refused}"
        );
        // A FIFO, which no process ever opens for writing, is refused at once, for each of the
        // three files; a blocking open would wait forever. The watchdog only turns a hang
        // into a failure.
        let fifo = tmp.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let (done, results) = std::sync::mpsc::channel();
        let (f, c, k) = (fifo.clone(), cert.clone(), private.clone());
        std::thread::spawn(move || {
            let runs = [
                tls_files(Some(f.clone()), None, None),
                tls_files(None, Some(f.clone()), Some(k)),
                tls_files(None, Some(c), Some(f)),
            ];
            done.send(runs.map(|r| r.err().unwrap_or_default()))
                .unwrap();
        });
        let errors = results
            .recv_timeout(Duration::from_secs(30))
            .expect("reading a FIFO hung");
        for e in errors {
            assert!(e.ends_with("fifo: not a regular file"), "{e}");
        }
        let dir = tls_files(Some(tmp.path().to_path_buf()), None, None);
        assert!(dir.err().unwrap().contains("not a regular file"));
    }

    #[test]
    fn durations_set_in_code_saturate() {
        // How durations from the environment are read: `store::settings`.
        let resolved = RemoteConfig {
            timeout: Some(Duration::MAX),
            lease_wait: Some(Duration::MAX),
            ttl: Some(Duration::MAX),
            breaker_cooldown: Some(Duration::MAX),
            ..RemoteConfig::at("redis://127.0.0.1:1/")
        }
        .resolve()
        .expect("a valid configuration");
        assert_eq!(
            [
                resolved.timeout,
                resolved.lease_wait,
                resolved.ttl,
                resolved.breaker_cooldown
            ],
            [LONGEST_WAIT; 4]
        );
    }
}
