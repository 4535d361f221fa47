//! The object-store tier's settings resolved: explicit values first, then the environment,
//! then defaults (`crate::object_store::config` says what may be set), into a bucket to reach
//! and the credentials to sign with.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusty_s3::{Bucket, Credentials, UrlStyle};
use zeroize::Zeroizing;

use crate::disk::config::saturate;
use crate::error::Error;
use crate::log::Warning;
use crate::object_store::config::{
    DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_THRESHOLD, DEFAULT_LEASE_WAIT,
    DEFAULT_MAX_ENTRY_SIZE, DEFAULT_PREFIX, DEFAULT_REGION, DEFAULT_TIMEOUT, ObjectStoreConfig,
};
use crate::operator_file::{self, Content};
use crate::store::settings::Settings;

pub(crate) struct Resolved {
    pub bucket: Bucket,
    pub prefix: String,
    pub credentials: Option<Credentials>,
    pub read_only: bool,
    pub allow_unkeyed: bool,
    pub timeout: Duration,
    pub max_entry_size: u64,
    pub lease_wait: Duration,
    pub breaker_threshold: u32,
    pub breaker_cooldown: Duration,
}

impl ObjectStoreConfig {
    /// The settings, or `None` (no store, or a value that cannot be used, warned about).
    pub(crate) fn resolve(self) -> Option<Resolved> {
        let read_env = self.read_env;
        let env = |name: &str| {
            read_env
                .then(|| crate::env::var_os(name))
                .flatten()
                .filter(|v| !v.is_empty())
        };
        let text = |set: Option<String>, name: &str| -> Option<Option<String>> {
            match set {
                Some(set) => Some(Some(set)),
                None => match env(name).map(OsString::into_string) {
                    None => Some(None),
                    Some(Ok(text)) => Some(Some(text)),
                    Some(Err(_)) => SETTINGS.refuse(&format!("{name} is not valid UTF-8")),
                },
            }
        };
        let url = text(self.url, "KCACHE_S3_URL")??;
        let endpoint = text(self.endpoint, "KCACHE_S3_ENDPOINT")?;
        let region = text(self.region, "KCACHE_S3_REGION")?.unwrap_or(DEFAULT_REGION.into());
        let (bucket, prefix) = match locate(&url, endpoint.as_deref(), &region) {
            Ok(located) => located,
            Err(why) => {
                return SETTINGS.refuse(&format!("the object store URL cannot be used: {why}"));
            }
        };
        let ms = Duration::from_millis(1);
        let timeout = SETTINGS.wait(
            self.timeout,
            env,
            "KCACHE_S3_TIMEOUT_MS",
            ms,
            DEFAULT_TIMEOUT,
        );
        if timeout.is_zero() {
            return SETTINGS.refuse("the object store timeout must be positive");
        }
        let read_only = match self.read_only {
            Some(r) => r,
            None => SETTINGS.flag(env("KCACHE_S3_READ_ONLY"), "KCACHE_S3_READ_ONLY")?,
        };
        let allow_unkeyed = self.allow_unkeyed
            || SETTINGS.flag(env("KCACHE_S3_ALLOW_UNKEYED"), "KCACHE_S3_ALLOW_UNKEYED")?;
        let max_entry_size = match (self.max_entry_size, env("KCACHE_S3_MAX_ENTRY_SIZE")) {
            (Some(s), _) => s,
            (None, Some(text)) => match crate::disk::parse_size(&text.to_string_lossy()) {
                Ok(s) => s,
                Err(_) => {
                    return SETTINGS
                        .refuse(&format!("KCACHE_S3_MAX_ENTRY_SIZE={text:?} is not a size"));
                }
            },
            (None, None) => DEFAULT_MAX_ENTRY_SIZE,
        };
        if max_entry_size == 0 {
            return SETTINGS.refuse("the object store entry size limit must be positive");
        }
        let s = Duration::from_secs(1);
        let lease_wait = SETTINGS.wait(
            self.lease_wait,
            env,
            "KCACHE_S3_LEASE_WAIT",
            s,
            DEFAULT_LEASE_WAIT,
        );
        let explicit = Explicit {
            key: self.access_key_id,
            secret: self.secret_access_key,
            token: self.session_token,
            file: self.credentials_file,
            profile: self.profile,
        };
        let credentials = match credentials(explicit, env) {
            Ok(credentials) => credentials,
            Err(why) => return SETTINGS.refuse(&why),
        };
        Some(Resolved {
            bucket,
            prefix,
            credentials,
            read_only,
            allow_unkeyed,
            timeout,
            max_entry_size,
            lease_wait,
            breaker_threshold: self.breaker_threshold.unwrap_or(DEFAULT_BREAKER_THRESHOLD),
            breaker_cooldown: saturate(self.breaker_cooldown.unwrap_or(DEFAULT_BREAKER_COOLDOWN)),
        })
    }
}

/// The bucket and the objects' prefix `url` names: `s3://bucket[/prefix]` at `endpoint`
/// (path-style: the servers one names are rarely set up for virtual-hosted buckets), or on
/// AWS in `region` (virtual-hosted); or `http[s]://host[:port]/bucket[/prefix]`, path-style.
fn locate(url: &str, endpoint: Option<&str>, region: &str) -> Result<(Bucket, String), String> {
    let (endpoint, path, style) = if let Some(rest) = url.strip_prefix("s3://") {
        match endpoint {
            Some(endpoint) => (endpoint.to_owned(), rest, UrlStyle::Path),
            None => (
                format!("https://s3.{region}.amazonaws.com"),
                rest,
                UrlStyle::VirtualHost,
            ),
        }
    } else if url.starts_with("http://") || url.starts_with("https://") {
        if endpoint.is_some() {
            return Err("an endpoint is set for a URL that names its server (http[s]://)".into());
        }
        let scheme_end = url.find("://").map_or(0, |i| i + 3);
        let (server, path) = match url[scheme_end..].find('/') {
            Some(slash) => url.split_at(scheme_end + slash),
            None => (url, ""),
        };
        (
            server.to_owned(),
            &path[path.len().min(1)..],
            UrlStyle::Path,
        )
    } else {
        return Err(
            "it is neither s3://bucket/prefix nor http[s]://host:port/bucket/prefix".into(),
        );
    };
    // Credentials in the endpoint would be dropped by the signer; say so rather than ignore.
    if endpoint.contains('@') {
        return Err(
            "credentials in a URL are not used: set AWS_ACCESS_KEY_ID and \
                    AWS_SECRET_ACCESS_KEY, or a shared credentials file"
                .into(),
        );
    }
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err("the endpoint is not http[s]://host[:port]".into());
    }
    let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
    let valid = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.';
    if bucket.len() < 3 || bucket.len() > 63 || !bucket.bytes().all(valid) {
        return Err(format!("{bucket:?} is not a bucket name"));
    }
    if prefix.contains('?') || prefix.contains('#') {
        return Err("the prefix holds a query or a fragment".into());
    }
    let prefix = match prefix.trim_start_matches('/') {
        "" => DEFAULT_PREFIX.to_owned(),
        p if p.ends_with('/') => p.to_owned(),
        p => format!("{p}/"),
    };
    // A bucket with dots cannot be a host name under AWS's certificate: path-style then.
    let style = match style {
        UrlStyle::VirtualHost if bucket.contains('.') => UrlStyle::Path,
        style => style,
    };
    let endpoint = endpoint
        .parse()
        .map_err(|e| format!("the endpoint is not a URL: {e}"))?;
    let bucket = Bucket::new(endpoint, style, bucket.to_owned(), region.to_owned())
        .map_err(|e| format!("{e}"))?;
    Ok((bucket, prefix))
}

/// The credentials set in code.
struct Explicit {
    key: Option<String>,
    secret: Option<Zeroizing<String>>,
    token: Option<Zeroizing<String>>,
    file: Option<PathBuf>,
    profile: Option<String>,
}

/// The largest shared credentials file read: a few hundred profiles.
const MAX_CREDENTIALS_FILE: usize = 64 << 10;

/// The credentials to sign with: set in code, else `AWS_ACCESS_KEY_ID` and
/// `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`), else the shared credentials file's
/// profile; `None` (unsigned requests) when there are none. A key without its secret, a file
/// or a profile named but unusable, refuse the configuration.
fn credentials(
    set: Explicit,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<Option<Credentials>, String> {
    let secret_env = |name: &str| {
        env(name)
            .map(|v| v.into_string().map(Zeroizing::new))
            .transpose()
            .map_err(|_| format!("{name} is not valid UTF-8"))
    };
    let pair = |key: Option<String>, secret: Option<Zeroizing<String>>, token, whence: &str| match (
        key, secret,
    ) {
        (Some(key), Some(secret)) => Ok(Some(signing(key, &secret, token))),
        (None, None) => Ok(None),
        _ => Err(format!(
            "{whence} has an access key id without its secret access key, or the reverse"
        )),
    };
    if let Some(found) = pair(set.key, set.secret, set.token, "the configuration")? {
        return Ok(Some(found));
    }
    let key = secret_env("AWS_ACCESS_KEY_ID")?.map(|k| String::clone(&k));
    let found = pair(
        key,
        secret_env("AWS_SECRET_ACCESS_KEY")?,
        secret_env("AWS_SESSION_TOKEN")?,
        "the environment",
    )?;
    if found.is_some() {
        return Ok(found);
    }
    let named_profile = set
        .profile
        .or_else(|| env("AWS_PROFILE").map(|p| p.to_string_lossy().into_owned()));
    let (file, named) = match (set.file, env("AWS_SHARED_CREDENTIALS_FILE")) {
        (Some(file), _) => (file, true),
        (None, Some(file)) => (PathBuf::from(file), true),
        (None, None) => match env("HOME") {
            Some(home) => (Path::new(&home).join(".aws/credentials"), false),
            None => return Ok(None),
        },
    };
    if !named && !file.exists() {
        return Ok(None);
    }
    let bytes = operator_file::read(
        &file,
        "credentials file",
        Content::Secret,
        MAX_CREDENTIALS_FILE,
    )
    .map_err(|e| match e {
        Error::InvalidArgument(m) | Error::Io(m) | Error::Untrusted(m) => m,
        other => other.to_string(),
    })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| format!("credentials file {} is not UTF-8", file.display()))?;
    let profile = named_profile.as_deref().unwrap_or("default");
    match profile_of(text, profile) {
        Some(p) => pair(
            p.key.map(|k| String::clone(&k)),
            p.secret,
            p.token,
            &format!("profile {profile:?} of {}", file.display()),
        ),
        None if named_profile.is_some() => Err(format!(
            "credentials file {} has no profile {profile:?}",
            file.display()
        )),
        None => Ok(None),
    }
}

fn signing(key: String, secret: &str, token: Option<Zeroizing<String>>) -> Credentials {
    match token {
        Some(token) => Credentials::new_with_token(key, secret, token.as_str()),
        None => Credentials::new(key, secret),
    }
}

#[derive(Default)]
struct Profile {
    key: Option<Zeroizing<String>>,
    secret: Option<Zeroizing<String>>,
    token: Option<Zeroizing<String>>,
}

/// The keys of `[profile]` in a shared credentials file (INI: `[name]` or `[profile name]`,
/// then `key = value` lines; `#` and `;` start comments); `None` when it has no such section.
fn profile_of(text: &str, profile: &str) -> Option<Profile> {
    let mut found = None;
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let section = section.trim();
            let name = section.strip_prefix("profile ").unwrap_or(section).trim();
            inside = name == profile;
            if inside && found.is_none() {
                found = Some(Profile::default());
            }
            continue;
        }
        let (Some(p), Some((name, value))) =
            (found.as_mut().filter(|_| inside), line.split_once('='))
        else {
            continue;
        };
        let value = Some(Zeroizing::new(value.trim().to_owned()));
        match name.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => p.key = value,
            "aws_secret_access_key" => p.secret = value,
            "aws_session_token" => p.token = value,
            _ => {}
        }
    }
    found
}

/// The object store's settings: its name in messages and its warnings.
const SETTINGS: Settings = Settings {
    tier: "object-store tier",
    off: Warning::ObjectStoreConfig,
    wait: Warning::ObjectStoreWait,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn located(url: &str, endpoint: Option<&str>) -> Result<(String, String), String> {
        locate(url, endpoint, "us-east-1").map(|(b, p)| (b.base_url().to_string(), p))
    }

    #[test]
    fn urls() {
        assert_eq!(
            located("s3://cache/ci/kernels", Some("http://127.0.0.1:8333")).unwrap(),
            ("http://127.0.0.1:8333/cache/".into(), "ci/kernels/".into())
        );
        assert_eq!(
            located("http://10.0.0.1:9000/cache", None).unwrap(),
            ("http://10.0.0.1:9000/cache/".into(), DEFAULT_PREFIX.into())
        );
        assert_eq!(
            located("https://minio.example/cache/p/", None).unwrap(),
            ("https://minio.example/cache/".into(), "p/".into())
        );
        assert_eq!(
            located("s3://cache", None).unwrap(),
            (
                "https://cache.s3.us-east-1.amazonaws.com/".into(),
                DEFAULT_PREFIX.into()
            )
        );
        for (url, endpoint, why) in [
            ("redis://host/", None, "neither"),
            ("s3://Bad_Bucket/x", None, "not a bucket name"),
            ("s3://ok-bucket", Some("ftp://host"), "not http"),
            (
                "http://key:secret@host/bucket",
                None,
                "credentials in a URL",
            ),
            (
                "http://host/bucket",
                Some("http://other"),
                "names its server",
            ),
            ("http://host", None, "not a bucket name"),
        ] {
            let e = located(url, endpoint).err().unwrap();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn refusals_and_defaults() {
        let ok = ObjectStoreConfig::at("http://127.0.0.1:1/bucket")
            .resolve()
            .expect("a valid configuration");
        assert_eq!(
            (ok.timeout, ok.max_entry_size, ok.lease_wait),
            (DEFAULT_TIMEOUT, DEFAULT_MAX_ENTRY_SIZE, DEFAULT_LEASE_WAIT)
        );
        assert!(!ok.read_only && !ok.allow_unkeyed && ok.credentials.is_none());
        assert!(ObjectStoreConfig::default().resolve().is_none());
        let zero = ObjectStoreConfig {
            timeout: Some(Duration::ZERO),
            ..ObjectStoreConfig::at("http://127.0.0.1:1/bucket")
        };
        assert!(zero.resolve().is_none());
        let half = ObjectStoreConfig {
            access_key_id: Some("AKID".into()),
            ..ObjectStoreConfig::at("http://127.0.0.1:1/bucket")
        };
        assert!(half.resolve().is_none());
    }

    const FILE: &str = "\
# comment
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secret-default

[profile ci]
aws_access_key_id=AKIDCI
aws_secret_access_key=secret-ci
aws_session_token = token-ci
";

    fn write(dir: &Path, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("credentials");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn from_file(file: &Path, profile: Option<&str>) -> Result<Option<Credentials>, String> {
        let set = Explicit {
            key: None,
            secret: None,
            token: None,
            file: Some(file.to_owned()),
            profile: profile.map(str::to_owned),
        };
        credentials(set, |_| None)
    }

    #[test]
    fn shared_credentials_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = write(tmp.path(), FILE, 0o600);
        let default = from_file(&file, None).unwrap().unwrap();
        assert_eq!(
            (default.key(), default.secret()),
            ("AKIDDEFAULT", "secret-default")
        );
        assert_eq!(default.token(), None);
        let ci = from_file(&file, Some("ci")).unwrap().unwrap();
        assert_eq!(
            (ci.key(), ci.secret(), ci.token()),
            ("AKIDCI", "secret-ci", Some("token-ci"))
        );
        let missing = from_file(&file, Some("prod")).err().unwrap();
        assert!(missing.contains("no profile \"prod\""), "{missing}");
        // Anyone else able to read or replace it: refused, whatever it holds.
        let shared = write(tmp.path(), FILE, 0o620);
        let refused = from_file(&shared, None).err().unwrap();
        assert!(refused.contains("group or others"), "{refused}");
        let large = write(tmp.path(), &"#".repeat(MAX_CREDENTIALS_FILE + 1), 0o600);
        assert!(from_file(&large, None).is_err());
        assert!(from_file(Path::new("relative/credentials"), None).is_err());
        // Set in code, it wins over the file; a key alone is refused.
        let set = Explicit {
            key: Some("AKIDCODE".into()),
            secret: Some(Zeroizing::new("secret-code".into())),
            token: None,
            file: Some(file.clone()),
            profile: None,
        };
        let code = credentials(set, |_| None).unwrap().unwrap();
        assert_eq!(code.key(), "AKIDCODE");
        let env = |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some(OsString::from("AKIDENV")),
            "AWS_SECRET_ACCESS_KEY" => Some(OsString::from("secret-env")),
            _ => None,
        };
        let none = Explicit {
            key: None,
            secret: None,
            token: None,
            file: None,
            profile: None,
        };
        let from_env = credentials(none, env).unwrap().unwrap();
        assert_eq!(
            (from_env.key(), from_env.secret()),
            ("AKIDENV", "secret-env")
        );
    }
}
