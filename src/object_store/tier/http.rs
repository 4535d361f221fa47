//! Signed S3 requests with one deadline each: the request, the response and the whole body
//! are bounded together by the operation's budget, and a body is read up to a byte count the
//! caller sets, whatever the server announces (a `Content-Length` that lies, a chunked body
//! without end, one that trickles a byte at a time: each costs at most the budget and the
//! limit plus one byte).
//!
//! Requests are presigned URLs (rusty-s3 signs, ureq sends): the signature covers the method,
//! the object and the host; the conditional and range headers travel beside it. A signed URL
//! names the access key and carries the session token, so none is ever logged: errors are
//! described without it.

use std::io::{self, Read};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusty_s3::{Bucket, Credentials, S3Action};
use ureq::Agent;
use ureq::http::Response;

/// How long a signed URL is valid: far longer than any operation's budget, so that a request
/// is never refused as expired on its way (the budget ends it first).
const SIGNED_FOR: Duration = Duration::from_secs(300);
/// The reads of a body: small enough to check the deadline often, large enough to be cheap.
const CHUNK: usize = 64 << 10;

/// How an operation failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The budget ran out.
    Timeout,
    /// No answer: refused, reset, unreachable, a protocol error.
    Transport(String),
    /// An answer kcache does not take: 403 (credentials), 5xx, ...
    Status(u16),
}

impl Failure {
    /// Whether it says the store is down or overloaded, which the breaker counts; a refusal
    /// (wrong credentials, a missing bucket) is the store answering.
    pub(crate) fn is_outage(&self) -> bool {
        match self {
            Failure::Timeout | Failure::Transport(_) => true,
            Failure::Status(status) => *status >= 500,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout => write!(f, "timed out"),
            Failure::Transport(why) => write!(f, "{why}"),
            Failure::Status(status) => write!(f, "HTTP status {status}"),
        }
    }
}

/// A condition on a write.
#[derive(Clone, Copy)]
pub(crate) enum Condition<'a> {
    Always,
    /// `If-None-Match: *`: only if no object has the name.
    Absent,
    /// `If-Match: <etag>`: only if the object is still this version.
    Matches(&'a str),
}

/// What a read found.
pub(crate) struct Object {
    /// At most the limit plus one byte.
    pub bytes: Vec<u8>,
    pub etag: Option<String>,
}

pub(crate) struct Client {
    agent: Agent,
    bucket: Bucket,
    credentials: Option<Credentials>,
    timeout: Duration,
}

impl Client {
    pub(crate) fn new(bucket: Bucket, credentials: Option<Credentials>, timeout: Duration) -> Self {
        let mut config = Agent::config_builder()
            // Statuses are answers to look at (404 is a miss, 412 a lease held), not errors.
            .http_status_as_error(false)
            // A store that redirects is misconfigured: its answer is an error, not a hop.
            .max_redirects(0)
            .user_agent(concat!("kcache/", env!("CARGO_PKG_VERSION")))
            .timeout_global(Some(timeout));
        if bucket.base_url().scheme() == "https" {
            config = config.tls_config(tls());
        }
        Client {
            agent: config.build().new_agent(),
            bucket,
            credentials,
            timeout,
        }
    }

    /// The object `key`, at most `limit + 1` bytes of it (`Range`, and a read that stops there
    /// whatever the server sends); `None` when absent.
    pub(crate) fn get(&self, key: &str, limit: u64) -> Result<Option<Object>, Failure> {
        let deadline = Instant::now() + self.timeout;
        let url = self
            .bucket
            .get_object(self.credentials.as_ref(), key)
            .sign(SIGNED_FOR);
        let response = self
            .agent
            .get(url.as_str())
            .header("Range", format!("bytes=0-{limit}"))
            .call()
            .map_err(failure)?;
        match response.status().as_u16() {
            200 | 206 => {
                let etag = etag(&response);
                let bytes = read_bounded(response, limit.saturating_add(1), deadline)?;
                Ok(Some(Object { bytes, etag }))
            }
            404 => Ok(None),
            // The range of an empty object: no bytes, which no entry is.
            416 => Ok(Some(Object {
                bytes: Vec::new(),
                etag: None,
            })),
            status => Err(Failure::Status(status)),
        }
    }

    /// Writes `body` as `key` if `condition` holds: `Some(etag)` written, `None` refused by the
    /// condition (412, or 409 for a conditional write racing another).
    pub(crate) fn put(
        &self,
        key: &str,
        body: &[u8],
        condition: Condition<'_>,
    ) -> Result<Option<String>, Failure> {
        let url = self
            .bucket
            .put_object(self.credentials.as_ref(), key)
            .sign(SIGNED_FOR);
        let mut request = self.agent.put(url.as_str());
        match condition {
            Condition::Always => {}
            Condition::Absent => request = request.header("If-None-Match", "*"),
            Condition::Matches(etag) => request = request.header("If-Match", etag),
        }
        let response = request.send(body).map_err(failure)?;
        match response.status().as_u16() {
            200..=299 => Ok(Some(etag(&response).unwrap_or_default())),
            409 | 412 => Ok(None),
            status => Err(Failure::Status(status)),
        }
    }

    /// Deletes `key`, only if it is still version `etag` when one is given (a server that
    /// ignores `If-Match` on deletes deletes it anyway); absent or changed is no failure.
    pub(crate) fn delete(&self, key: &str, etag: Option<&str>) -> Result<(), Failure> {
        let url = self
            .bucket
            .delete_object(self.credentials.as_ref(), key)
            .sign(SIGNED_FOR);
        let mut request = self.agent.delete(url.as_str());
        if let Some(etag) = etag {
            request = request.header("If-Match", etag);
        }
        let response = request.call().map_err(failure)?;
        match response.status().as_u16() {
            200..=299 | 404 | 412 => Ok(()),
            status => Err(Failure::Status(status)),
        }
    }
}

fn etag<B>(response: &Response<B>) -> Option<String> {
    let etag = response.headers().get("etag")?;
    etag.to_str().ok().map(str::to_owned)
}

/// At most `most` bytes of the body, before `deadline`. ureq bounds each transport read by
/// what is left of the operation's budget; the clock is checked here too, between reads.
fn read_bounded(
    response: Response<ureq::Body>,
    most: u64,
    deadline: Instant,
) -> Result<Vec<u8>, Failure> {
    let mut reader = response.into_body().into_reader().take(most);
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    loop {
        if Instant::now() >= deadline {
            return Err(Failure::Timeout);
        }
        match reader.read(&mut chunk) {
            Ok(0) => return Ok(bytes),
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_failure(e)),
        }
    }
}

/// What a ureq error says, without the URL (a signed one names the access key and carries the
/// session token).
fn failure(e: ureq::Error) -> Failure {
    match e {
        ureq::Error::Timeout(_) => Failure::Timeout,
        ureq::Error::Io(e) => io_failure(e),
        ureq::Error::HostNotFound => Failure::Transport("host not found".into()),
        ureq::Error::ConnectionFailed => Failure::Transport("connection failed".into()),
        e => {
            let text = e.to_string();
            Failure::Transport(if text.contains("X-Amz-") || text.contains("x-amz-") {
                "request failed".into()
            } else {
                text
            })
        }
    }
}

fn io_failure(e: io::Error) -> Failure {
    if matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    ) {
        return Failure::Timeout;
    }
    // ureq's errors while a body is read come wrapped in an `io::Error`.
    if e.get_ref().is_some_and(|inner| inner.is::<ureq::Error>()) {
        return match e.into_inner().map(|inner| inner.downcast::<ureq::Error>()) {
            Some(Ok(e)) => failure(*e),
            _ => Failure::Transport("I/O error".into()),
        };
    }
    Failure::Transport(e.to_string())
}

/// HTTPS with the crate's one TLS stack: rustls on ring, the system's roots.
fn tls() -> ureq::tls::TlsConfig {
    let native = rustls_native_certs::load_native_certs();
    let roots: Vec<ureq::tls::Certificate<'static>> = native
        .certs
        .iter()
        .map(|der| ureq::tls::Certificate::from_der(der.as_ref()).to_owned())
        .collect();
    ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .root_certs(ureq::tls::RootCerts::from(roots))
        .build()
}
