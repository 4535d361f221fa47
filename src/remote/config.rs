//! Remote tier configuration: explicit values first, then the environment, then defaults.
//! A value kcache cannot use is warned about once per process and leaves the remote tier off:
//! a remote the operator configured wrongly is never guessed at.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::{ClientTlsConfig, TlsCertificates};

use super::client::Target;
use crate::log::Warning;

/// Default per-operation budget (connecting included).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// Default lifetime of a remote entry: 7 days, renewed by each write.
pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default namespace of the remote's keys.
pub const DEFAULT_PREFIX: &str = "kcache:";
/// Default largest remote entry read or written: 64 MiB.
pub const DEFAULT_MAX_ENTRY_SIZE: u64 = 64 << 20;
/// Consecutive failures that open the breaker.
pub const DEFAULT_BREAKER_THRESHOLD: u32 = 3;
/// How long a miss waits for another node building the same entry (its lease) before it
/// builds too: as the disk tier's lock timeout, longer than nearly every kernel build.
pub const DEFAULT_LEASE_WAIT: Duration = Duration::from_secs(120);
/// How long an open breaker skips the remote before probing it.
pub const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

/// How to reach the shared tier. Fields left `None` are taken from the environment when
/// `read_env` is set (the default), else from the defaults.
///
/// | field            | environment                        | default              |
/// |------------------|------------------------------------|----------------------|
/// | `url`            | `KCACHE_REMOTE_URL`                | none: no remote tier |
/// | `read_only`      | `KCACHE_REMOTE_READ_ONLY=1`        | reads and writes     |
/// | `timeout`        | `KCACHE_REMOTE_TIMEOUT_MS`         | 250 ms               |
/// | `ttl`            | `KCACHE_REMOTE_TTL` (seconds, 0: none) | 7 days           |
/// | `prefix`         | `KCACHE_REMOTE_PREFIX`             | `kcache:`            |
/// | `max_entry_size` | `KCACHE_REMOTE_MAX_ENTRY_SIZE` (bytes, or K/M/G suffix) | 64 MiB |
/// | `lease_wait`     | `KCACHE_REMOTE_LEASE_WAIT` (seconds, 0: no leases) | 120 s |
/// | `cluster`        | `KCACHE_REMOTE_CLUSTER=1`          | a single server      |
/// | `ca_file`        | `KCACHE_REMOTE_CA_FILE`            | the system's roots   |
/// | `cert_file`      | `KCACHE_REMOTE_CERT_FILE`          | no client certificate |
/// | `key_file`       | `KCACHE_REMOTE_KEY_FILE`           | no client certificate |
/// | `allow_unkeyed`  | `KCACHE_REMOTE_ALLOW_UNKEYED=1`    | a key is required    |
///
/// `url` is `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS) or
/// `redis+unix:///path/to/socket`; for a Redis Cluster, one or more seed nodes' URLs,
/// comma-separated.
#[derive(Clone, Debug, Default)]
pub struct RemoteConfig {
    pub url: Option<String>,
    pub read_only: Option<bool>,
    /// Budget of one operation, connecting included; positive.
    pub timeout: Option<Duration>,
    /// `Some(Duration::ZERO)`: entries never expire.
    pub ttl: Option<Duration>,
    pub prefix: Option<String>,
    pub max_entry_size: Option<u64>,
    /// `url` names a Redis Cluster (one seed node is enough); a comma-separated list of URLs
    /// names one whatever this says.
    pub cluster: Option<bool>,
    /// The certificate authority (PEM) a `rediss://` server's certificate must chain to,
    /// instead of the system's; an absolute path.
    pub ca_file: Option<PathBuf>,
    /// The client certificate (PEM, an absolute path; a chain, leaf first) that a `rediss://`
    /// server requiring clients to authenticate (mutual TLS) checks; `key_file` is its key. One
    /// without the other refuses the configuration.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1; an absolute path).
    pub key_file: Option<PathBuf>,
    /// How long a miss waits for another node that holds the entry's lease (builds it);
    /// `Some(Duration::ZERO)` takes no leases and never waits.
    pub lease_wait: Option<Duration>,
    /// **Unsafe.** Use the remote without an operator key: entries then carry only a
    /// checksum, so anyone who can write the store can make every reader load code of their
    /// choosing onto its GPUs. Only for a store nobody untrusted can write.
    pub allow_unkeyed: bool,
    /// `None`: [`DEFAULT_BREAKER_THRESHOLD`].
    pub breaker_threshold: Option<u32>,
    /// `None`: [`DEFAULT_BREAKER_COOLDOWN`].
    pub breaker_cooldown: Option<Duration>,
    pub read_env: bool,
}

impl RemoteConfig {
    /// Everything from the environment.
    pub fn from_env() -> Self {
        RemoteConfig {
            read_env: true,
            ..Self::default()
        }
    }

    /// A remote at `url`, ignoring the environment.
    pub fn at(url: impl Into<String>) -> Self {
        RemoteConfig {
            url: Some(url.into()),
            ..Self::default()
        }
    }

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
                Err(_) => return refuse("KCACHE_REMOTE_URL is not valid UTF-8"),
            },
        };
        let cluster = match self.cluster {
            Some(c) => c,
            None => flag(env("KCACHE_REMOTE_CLUSTER"), "KCACHE_REMOTE_CLUSTER")?,
        };
        let timeout = match (self.timeout, env("KCACHE_REMOTE_TIMEOUT_MS")) {
            (Some(t), _) => t,
            (None, Some(text)) => Duration::from_millis(number(&text, "KCACHE_REMOTE_TIMEOUT_MS")?),
            (None, None) => DEFAULT_TIMEOUT,
        };
        if timeout.is_zero() {
            return refuse("the remote timeout must be positive");
        }
        let path = |set: Option<PathBuf>, name: &str| set.or_else(|| env(name).map(PathBuf::from));
        let tls = match tls_files(
            path(self.ca_file, "KCACHE_REMOTE_CA_FILE"),
            path(self.cert_file, "KCACHE_REMOTE_CERT_FILE"),
            path(self.key_file, "KCACHE_REMOTE_KEY_FILE"),
        ) {
            Ok(tls) => tls,
            Err(why) => return refuse(&why),
        };
        let target = match target(&url, cluster, tls) {
            Ok(target) => target,
            Err(e) => return refuse(&format!("the remote URL cannot be used: {e}")),
        };
        let read_only = match self.read_only {
            Some(r) => r,
            None => flag(env("KCACHE_REMOTE_READ_ONLY"), "KCACHE_REMOTE_READ_ONLY")?,
        };
        let allow_unkeyed = self.allow_unkeyed
            || flag(
                env("KCACHE_REMOTE_ALLOW_UNKEYED"),
                "KCACHE_REMOTE_ALLOW_UNKEYED",
            )?;
        let ttl = match (self.ttl, env("KCACHE_REMOTE_TTL")) {
            (Some(t), _) => t,
            (None, Some(text)) => Duration::from_secs(number(&text, "KCACHE_REMOTE_TTL")?),
            (None, None) => DEFAULT_TTL,
        };
        let prefix = match (self.prefix, env("KCACHE_REMOTE_PREFIX")) {
            (Some(p), _) => p,
            (None, Some(text)) => match text.into_string() {
                Ok(p) => p,
                Err(_) => return refuse("KCACHE_REMOTE_PREFIX is not valid UTF-8"),
            },
            (None, None) => DEFAULT_PREFIX.to_owned(),
        };
        let max_entry_size = match (self.max_entry_size, env("KCACHE_REMOTE_MAX_ENTRY_SIZE")) {
            (Some(s), _) => s,
            (None, Some(text)) => match crate::disk::parse_size(&text.to_string_lossy()) {
                Ok(s) => s,
                Err(_) => {
                    return refuse(&format!(
                        "KCACHE_REMOTE_MAX_ENTRY_SIZE={text:?} is not a size"
                    ));
                }
            },
            (None, None) => DEFAULT_MAX_ENTRY_SIZE,
        };
        let lease_wait = match (self.lease_wait, env("KCACHE_REMOTE_LEASE_WAIT")) {
            (Some(w), _) => w,
            (None, Some(text)) => Duration::from_secs(number(&text, "KCACHE_REMOTE_LEASE_WAIT")?),
            (None, None) => DEFAULT_LEASE_WAIT,
        };
        if max_entry_size == 0 {
            return refuse("the remote entry size limit must be positive");
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
            breaker_cooldown: self.breaker_cooldown.unwrap_or(DEFAULT_BREAKER_COOLDOWN),
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
            client_cert: read_pem(&cert, "client certificate")?,
            // redis-rs takes the key's PEM by value and drops it once parsed; the parsed key
            // stays in its TLS settings for the client's life.
            client_key: read_pem(&key, "client key")?,
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
    let root_cert = ca.map(|ca| read_pem(&ca, "CA file")).transpose()?;
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
}

/// The largest PEM file read: a bundle of a few hundred certificates.
const MAX_PEM_FILE: u64 = 1 << 20;

/// The bytes of a PEM file (`what`, an absolute path).
fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    if !path.is_absolute() {
        return Err(format!("the {what} {} is a relative path", path.display()));
    }
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|f| f.take(MAX_PEM_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(format!("the {what} {} is over 1 MiB", path.display()));
    }
    Ok(bytes)
}

fn refuse<T>(why: &str) -> Option<T> {
    crate::log::warn_once(Warning::RemoteConfig, || format!("remote tier off: {why}"));
    None
}

/// `0` or `1`; anything else refuses the configuration.
fn flag(value: Option<OsString>, name: &str) -> Option<bool> {
    match value {
        None => Some(false),
        Some(v) if v == "0" => Some(false),
        Some(v) if v == "1" => Some(true),
        Some(v) => refuse(&format!("{name}={v:?} is neither 0 nor 1")),
    }
}

fn number(text: &OsString, name: &str) -> Option<u64> {
    match text.to_string_lossy().trim().parse::<u64>() {
        Ok(n) => Some(n),
        Err(_) => refuse(&format!("{name}={text:?} is not a whole number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn flags_and_numbers() {
        assert_eq!(flag(None, "X"), Some(false));
        assert_eq!(flag(Some("1".into()), "X"), Some(true));
        assert_eq!(flag(Some("yes".into()), "X"), None);
        assert_eq!(number(&" 42 ".into(), "X"), Some(42));
        assert_eq!(number(&"-1".into(), "X"), None);
    }
}
