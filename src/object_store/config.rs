//! Object-store tier configuration: explicit values first, then the environment, then defaults
//! (resolved with the tier, in `tier::resolve`). As for the Redis tier, a value kcache cannot
//! use is warned about once per process and leaves the tier off; a duration that is not a
//! number is warned about and replaced by its default.
//!
//! The credentials are secrets: they are held in wiping types and never shown, whether by
//! `Debug` or in a message.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use zeroize::Zeroizing;

/// Default per-operation budget (connecting included), as the Redis tier's.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// Default region, which signatures name (most servers other than AWS accept any).
pub const DEFAULT_REGION: &str = "us-east-1";
/// Default prefix of the objects when the URL names a bucket alone.
pub const DEFAULT_PREFIX: &str = "kcache/";
/// Default largest entry read or written: 64 MiB.
pub const DEFAULT_MAX_ENTRY_SIZE: u64 = 64 << 20;
/// Consecutive failures that open the breaker.
pub const DEFAULT_BREAKER_THRESHOLD: u32 = 3;
/// How long an open breaker skips the store before probing it.
pub const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(30);
/// How long a miss waits for another node building the same entry (its lease object).
pub const DEFAULT_LEASE_WAIT: Duration = Duration::from_secs(120);

/// How to reach an object store speaking the S3 API. Fields left `None` are taken from the
/// environment when `read_env` is set, else from the defaults.
///
/// | field            | environment                               | default                  |
/// |------------------|-------------------------------------------|--------------------------|
/// | `url`            | `KCACHE_S3_URL`                           | none: no object store    |
/// | `endpoint`       | `KCACHE_S3_ENDPOINT`                      | AWS, in `region`         |
/// | `region`         | `KCACHE_S3_REGION`                        | `us-east-1`              |
/// | `access_key_id`, `secret_access_key`, `session_token` | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` | the shared credentials file |
/// | `credentials_file` | `AWS_SHARED_CREDENTIALS_FILE`           | `~/.aws/credentials`     |
/// | `profile`        | `AWS_PROFILE`                             | `default`                |
/// | `read_only`      | `KCACHE_S3_READ_ONLY=1`                   | reads and writes         |
/// | `timeout`        | `KCACHE_S3_TIMEOUT_MS`                    | 250 ms                   |
/// | `max_entry_size` | `KCACHE_S3_MAX_ENTRY_SIZE` (bytes, or K/M/G suffix) | 64 MiB         |
/// | `lease_wait`     | `KCACHE_S3_LEASE_WAIT` (seconds, 0: no leases) | 120 s               |
/// | `allow_unkeyed`  | `KCACHE_S3_ALLOW_UNKEYED=1`               | a key is required        |
///
/// `url` is `s3://bucket[/prefix]` (at `endpoint`, path-style, or AWS's virtual-hosted
/// buckets when no endpoint is set) or `http[s]://host[:port]/bucket[/prefix]` (path-style).
/// Entries are the objects `<prefix><entry name>`; without a prefix, `kcache/`.
///
/// Credentials set here win over the environment; without any (none set, none in the
/// environment, no shared credentials file) requests are not signed, which only a store that
/// allows anonymous access answers.
#[derive(Clone, Default)]
pub struct ObjectStoreConfig {
    pub url: Option<String>,
    /// The server of an `s3://` URL, `http[s]://host[:port]`.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    /// Never shown: `Debug` prints `***`.
    pub secret_access_key: Option<Zeroizing<String>>,
    /// Never shown: `Debug` prints `***`.
    pub session_token: Option<Zeroizing<String>>,
    /// The shared credentials file (INI, `[profile]` then `key = value`), an absolute path; it
    /// must be private to its user, as every secret file kcache reads.
    pub credentials_file: Option<PathBuf>,
    /// The profile of the credentials file.
    pub profile: Option<String>,
    pub read_only: Option<bool>,
    /// Budget of one operation, connecting and the whole body included; positive.
    pub timeout: Option<Duration>,
    pub max_entry_size: Option<u64>,
    /// How long a miss waits for another node that holds the entry's lease (builds it);
    /// `Some(Duration::ZERO)` takes no leases and never waits.
    pub lease_wait: Option<Duration>,
    /// **Unsafe.** Use the store without an operator key: entries then carry only a checksum,
    /// so anyone who can write the bucket can make every reader load code of their choosing
    /// onto its GPUs. Only for a bucket nobody untrusted can write.
    pub allow_unkeyed: bool,
    /// `None`: [`DEFAULT_BREAKER_THRESHOLD`].
    pub breaker_threshold: Option<u32>,
    /// `None`: [`DEFAULT_BREAKER_COOLDOWN`].
    pub breaker_cooldown: Option<Duration>,
    pub read_env: bool,
}

impl ObjectStoreConfig {
    /// Everything from the environment.
    pub fn from_env() -> Self {
        ObjectStoreConfig {
            read_env: true,
            ..Self::default()
        }
    }

    /// An object store at `url`, ignoring the environment.
    pub fn at(url: impl Into<String>) -> Self {
        ObjectStoreConfig {
            url: Some(url.into()),
            ..Self::default()
        }
    }
}

/// `***` for a secret that is set: whether it is set is worth showing, never what it is.
fn masked<T>(secret: &Option<T>) -> Option<&'static str> {
    secret.as_ref().map(|_| "***")
}

impl fmt::Debug for ObjectStoreConfig {
    /// As derived, with the secret key and the session token masked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStoreConfig")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &masked(&self.secret_access_key))
            .field("session_token", &masked(&self.session_token))
            .field("credentials_file", &self.credentials_file)
            .field("profile", &self.profile)
            .field("read_only", &self.read_only)
            .field("timeout", &self.timeout)
            .field("max_entry_size", &self.max_entry_size)
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
    fn secrets_are_masked() {
        let config = ObjectStoreConfig {
            access_key_id: Some("AKIDEXAMPLE".into()),
            secret_access_key: Some(Zeroizing::new("wJalrXUtnFEMI-hunter2".into())),
            session_token: Some(Zeroizing::new("FwoGZXIvYXdzE-token".into())),
            ..ObjectStoreConfig::at("s3://bucket/prefix")
        };
        let debug = format!("{config:?}");
        assert!(!debug.contains("hunter2") && !debug.contains("FwoGZXIvYXdzE"));
        assert_eq!(debug.matches("Some(\"***\")").count(), 2, "{debug}");
        assert!(debug.contains("AKIDEXAMPLE"));
        let unset = format!("{:?}", ObjectStoreConfig::from_env());
        assert!(unset.contains("secret_access_key: None"), "{unset}");
    }
}
