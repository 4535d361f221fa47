//! Remote tier configuration: explicit values first, then the environment, then defaults
//! (resolved with the tier, in `store::resolve`). A value kcache cannot use is warned about once per process and leaves the remote tier off:
//! a remote the operator configured wrongly is never guessed at. Durations are the exception:
//! one that is not a number is warned about and replaced by its default, as every kcache wait
//! is, since a wait changes how long a lookup may take and never which server it trusts.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

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
#[derive(Clone, Default)]
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
}

/// `url` as it may be shown (in `kcache config`, a log, a `Debug` of the configuration): the
/// user and password of `scheme://user:password@host` become `***`, as do the values of the
/// `user`, `username`, `pass` and `password` query parameters (`redis+unix:///socket?pass=…`);
/// in a comma-separated list of URLs, in each. Whatever it cannot parse errs on the side of
/// hiding: everything between `://` and the last `@` is taken as credentials.
pub fn masked_url(url: &str) -> String {
    url.split(',').map(mask_one).collect::<Vec<_>>().join(",")
}

fn mask_one(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => rest.split_at(at),
        None => ("", rest),
    };
    let userinfo = match userinfo.split_once(':') {
        _ if userinfo.is_empty() => "",
        Some(("", _)) => ":***",
        Some(_) => "***:***",
        None => "***",
    };
    let rest = match rest.split_once('?') {
        None => rest.to_owned(),
        Some((before, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _))
                        if ["user", "username", "pass", "password"]
                            .iter()
                            .any(|secret| name.eq_ignore_ascii_case(secret)) =>
                    {
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{before}?{}", query.join("&"))
        }
    };
    format!("{scheme}{userinfo}{rest}")
}

impl fmt::Debug for RemoteConfig {
    /// As derived, with the URL's credentials masked ([`masked_url`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("url", &self.url.as_deref().map(masked_url))
            .field("read_only", &self.read_only)
            .field("timeout", &self.timeout)
            .field("ttl", &self.ttl)
            .field("prefix", &self.prefix)
            .field("max_entry_size", &self.max_entry_size)
            .field("cluster", &self.cluster)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("lease_wait", &self.lease_wait)
            .field("allow_unkeyed", &self.allow_unkeyed)
            .field("breaker_threshold", &self.breaker_threshold)
            .field("breaker_cooldown", &self.breaker_cooldown)
            .field("read_env", &self.read_env)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_masked() {
        for (url, shown) in [
            (
                "redis://:hunter2@10.0.0.1:6379/0",
                "redis://:***@10.0.0.1:6379/0",
            ),
            (
                "rediss://kcache:hunter2@cache.example/",
                "rediss://***:***@cache.example/",
            ),
            ("redis://kcache@host", "redis://***@host"),
            ("redis://host:6379", "redis://host:6379"),
            ("redis://a:p@ss/w?rd@host/1", "redis://***:***@host/1"),
            (
                "redis+unix:///run/redis.sock?db=2&user=kc&pass=hunter2",
                "redis+unix:///run/redis.sock?db=2&user=***&pass=***",
            ),
            (
                "redis://:a@n1:7000, redis://:b@n2:7001",
                "redis://:***@n1:7000, redis://:***@n2:7001",
            ),
            (":hunter2@host", ":***@host"),
        ] {
            assert_eq!(masked_url(url), shown, "{url}");
        }
        let config = RemoteConfig::at("redis://kcache:hunter2@host/");
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("hunter2") && debug.contains("***:***@host"),
            "{debug}"
        );
        let disk = crate::PersistenceConfig {
            remote: Some(config),
            ..crate::PersistenceConfig::in_dir("/x")
        };
        assert!(!format!("{disk:?}").contains("hunter2"));
    }
}
