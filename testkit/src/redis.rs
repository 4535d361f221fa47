//! A `redis-server` of the test's own on a loopback port, for the remote tier's tests: started,
//! killed, restarted on the same port, stopped and continued by the test.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tempfile::TempDir;

/// A running (or killed) `redis-server`, killed on drop.
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    /// Settings on top of the defaults (`--name value` pairs).
    args: Vec<String>,
    /// A client's `user:password@`, for the test's own connections.
    auth: String,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with no persistence on a free loopback port and waits until it answers.
    /// Panics when `redis-server` is not installed (`scripts/test` installs it).
    pub fn start() -> Self {
        Self::start_with(&[], "")
    }

    /// As [`RedisServer::start`], with more settings (ACL users, a Unix socket); the test's own
    /// connections authenticate as `auth` (`user:password`, or empty).
    pub fn start_with(args: &[&str], auth: &str) -> Self {
        let port = free_port();
        let mut server = RedisServer {
            port,
            dir: tempfile::tempdir().unwrap(),
            args: args.iter().map(|a| a.to_string()).collect(),
            auth: auth.to_owned(),
            child: None,
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the server again (on the same port) after [`RedisServer::kill`].
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test installs it)");
        self.child = Some(child);
        for _ in 0..1000 {
            if self.try_connection().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not answer on port {}", self.port);
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops (`SIGSTOP`) or continues (`SIGCONT`) the server: a stopped one accepts
    /// connections (the kernel does) and answers nothing.
    pub fn pause(&self, paused: bool) {
        let child = self.child.as_ref().expect("the server is running");
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        let signal = if paused { Signal::STOP } else { Signal::CONT };
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// A connection for looking at what the store holds.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection().expect("the server answers")
    }

    fn try_connection(&self) -> Option<redis::Connection> {
        let url = match self.auth.as_str() {
            "" => self.url(),
            auth => format!("redis://{auth}@127.0.0.1:{}/", self.port),
        };
        let client = redis::Client::open(url).ok()?;
        let mut con = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        redis::cmd("PING").query::<String>(&mut con).ok()?;
        Some(con)
    }

    /// Every key in the store.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query(&mut self.connection())
            .unwrap();
        keys.sort();
        keys
    }

    /// The value at `key`.
    pub fn get(&self, key: &str) -> Vec<u8> {
        redis::cmd("GET")
            .arg(key)
            .query(&mut self.connection())
            .unwrap()
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) {
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query::<()>(&mut self.connection())
            .unwrap();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stopped server would not die of SIGTERM; SIGKILL works either way.
            self.kill();
        }
    }
}

/// A Redis Cluster of masters on loopback ports, its slots assigned and its state `ok`.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` servers in cluster mode and makes them one cluster (`redis-cli --cluster
    /// create`, which the `redis-server` package's `redis-tools` provides).
    pub fn start(masters: usize) -> Self {
        let settings = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ];
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_with(&settings, ""))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes.iter().map(RedisServer::address))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli must be installed (with redis-server)");
        assert!(created.success(), "redis-cli --cluster create failed");
        for node in &nodes {
            let ok = (0..1000).any(|_| {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection())
                    .unwrap();
                let ok = info.contains("cluster_state:ok");
                if !ok {
                    std::thread::sleep(Duration::from_millis(10));
                }
                ok
            });
            assert!(ok, "the cluster did not become ok");
        }
        RedisCluster { nodes }
    }

    /// Every node's URL, comma-separated: what `KCACHE_REMOTE_URL` takes for a cluster.
    pub fn url(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        urls.join(",")
    }

    /// The keys of each node.
    pub fn keys_by_node(&self) -> Vec<Vec<String>> {
        self.nodes.iter().map(RedisServer::keys).collect()
    }
}

/// A certificate authority and a server certificate for 127.0.0.1 it signed, made with the
/// `openssl` command in `dir`, for a TLS server.
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Runs `openssl ARGS` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl must be installed");
    assert!(status.success(), "openssl {args:?} failed");
}

/// Makes `NAME.key` and `NAME.crt` in `dir`, a certificate for `subject` that the CA there
/// (`ca.crt`, `ca.key`) signed, with the extensions in `ext`.
fn signed(dir: &Path, name: &str, subject: &str, ext: &str) {
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    let ext_file = format!("{name}.ext");
    std::fs::write(dir.join(&ext_file), ext).unwrap();
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "1",
            "-extfile",
            &ext_file,
        ],
    );
}

impl TlsFiles {
    pub fn make(dir: &Path) -> TlsFiles {
        let run = |args: &[&str]| openssl(dir, args);
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=kcache test CA",
        ]);
        signed(
            dir,
            "server",
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1\n",
        );
        TlsFiles {
            ca: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
        }
    }

    /// A client certificate and its key (for mutual TLS), signed by this CA: `(cert, key)`.
    pub fn client(&self) -> (PathBuf, PathBuf) {
        let dir = self.ca.parent().unwrap();
        signed(
            dir,
            "client",
            "/CN=kcache test client",
            "extendedKeyUsage=clientAuth\n",
        );
        (dir.join("client.crt"), dir.join("client.key"))
    }
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
