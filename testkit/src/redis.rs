//! A `redis-server` of the test's own on a loopback port, for the remote tier's tests: started,
//! killed, restarted on the same port, stopped and continued by the test; and a fake server
//! ([`FakeRedis`]) that sends whatever a test tells it to, for a broken or hostile store.
//! Without `redis-server` (or `redis-cli`, `openssl` where they are used) the test is skipped
//! ([`needs`]).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tempfile::TempDir;

use crate::needs::{self, Missing};

/// How to get `redis-server` and `redis-cli`.
const INSTALL_REDIS: &str = "apt install redis-server; scripts/test installs it";

/// `redis-server`, or what is missing.
fn redis_server() -> Result<PathBuf, Missing> {
    needs::program("redis-server", INSTALL_REDIS)
}

/// `Some` when `redis-server` is installed; `None` once said that what needs it is skipped
/// ([`needs::met`]), for a caller that starts its servers later.
pub fn installed() -> Option<()> {
    needs::met(redis_server()).map(drop)
}

/// A running (or killed) `redis-server`, killed on drop.
pub struct RedisServer {
    binary: PathBuf,
    port: u16,
    dir: TempDir,
    /// Settings on top of the defaults (`--name value` pairs).
    args: Vec<String>,
    /// A client's `user:password@`, for the test's own connections.
    auth: String,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with no persistence on a free loopback port and waits until it answers;
    /// `None` when `redis-server` is not installed, the test skipped ([`needs::met`]).
    pub fn start() -> Option<Self> {
        Self::start_with(&[], "")
    }

    /// As [`RedisServer::start`], with more settings (ACL users, a Unix socket); the test's own
    /// connections authenticate as `auth` (`user:password`, or empty).
    pub fn start_with(args: &[&str], auth: &str) -> Option<Self> {
        let binary = needs::met(redis_server())?;
        let port = free_port();
        let mut server = RedisServer {
            binary,
            port,
            dir: tempfile::tempdir().unwrap(),
            args: args.iter().map(|a| a.to_string()).collect(),
            auth: auth.to_owned(),
            child: None,
        };
        server.restart();
        Some(server)
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
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
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
    /// create`, which the `redis-server` package's `redis-tools` provides); `None` when either
    /// program is not installed, the test skipped.
    pub fn start(masters: usize) -> Option<Self> {
        let cli = needs::met(redis_server().and(needs::program("redis-cli", INSTALL_REDIS)))?;
        let settings = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ];
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_with(&settings, ""))
            .collect::<Option<_>>()?;
        let created = Command::new(cli)
            .args(["--cluster", "create"])
            .args(nodes.iter().map(RedisServer::address))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
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
        Some(RedisCluster { nodes })
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
    /// Makes the CA and the server's certificate in `dir`; `None` when `openssl` is not
    /// installed, the test skipped.
    pub fn make(dir: &Path) -> Option<TlsFiles> {
        needs::met(needs::program("openssl", "apt install openssl"))?;
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
        Some(TlsFiles {
            ca: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
        })
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

/// What [`FakeRedis`] sends back to one command.
#[derive(Clone, Debug)]
pub enum Reply {
    /// These bytes, at once.
    Bytes(Vec<u8>),
    /// These bytes, one every `Duration`.
    Trickle(Vec<u8>, Duration),
    /// These bytes, then `usize` bytes of filler as fast as the client takes them, then the
    /// connection is closed.
    Flood(Vec<u8>, usize),
    /// These bytes, then the connection is closed.
    Close(Vec<u8>),
    /// Nothing: the connection stays open and silent.
    Never,
}

/// What [`FakeRedis`] answers to a command (its arguments, the name first).
pub type Answer = dyn Fn(&[Vec<u8>]) -> Reply + Send + Sync;

/// A server on a loopback port that speaks just enough RESP to be a broken or hostile Redis:
/// it reads each command and sends what its answer function says, however wrong. It counts
/// the bytes it managed to send (accepted by the socket: the client's reads plus what the
/// kernel buffers hold).
pub struct FakeRedis {
    port: u16,
    sent: Arc<AtomicU64>,
    commands: Arc<Mutex<Vec<String>>>,
}

impl FakeRedis {
    /// Starts the server; it runs until the test process ends (its threads end with their
    /// connections).
    pub fn start(answer: impl Fn(&[Vec<u8>]) -> Reply + Send + Sync + 'static) -> Self {
        Self::start_on(0, answer)
    }

    /// As [`FakeRedis::start`], on `port` (0: any free port).
    pub fn start_on(
        port: u16,
        answer: impl Fn(&[Vec<u8>]) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = Arc::new(AtomicU64::new(0));
        let commands = Arc::new(Mutex::new(Vec::new()));
        let answer: Arc<Answer> = Arc::new(answer);
        let (s, c) = (Arc::clone(&sent), Arc::clone(&commands));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (answer, sent, commands) =
                    (Arc::clone(&answer), Arc::clone(&s), Arc::clone(&c));
                std::thread::spawn(move || serve(stream, &*answer, &sent, &commands));
            }
        });
        FakeRedis {
            port,
            sent,
            commands,
        }
    }

    /// A server that answers `command` (upper case) with `reply` and every other command as
    /// an empty Redis would.
    pub fn answering(command: &'static str, reply: Reply) -> Self {
        Self::start(move |args| {
            if args[0].eq_ignore_ascii_case(command.as_bytes()) {
                reply.clone()
            } else {
                Reply::Bytes(plain_answer(args))
            }
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `127.0.0.1:PORT`, as a cluster's redirect names a node.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The bytes sent so far, all connections together.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// The names of the commands received so far, in order.
    pub fn commands(&self) -> Vec<String> {
        self.commands.lock().unwrap().clone()
    }
}

/// What an empty Redis answers: `SET` OK, `EVAL` 1, `EXISTS` 0, a read nothing.
pub fn plain_answer(args: &[Vec<u8>]) -> Vec<u8> {
    match args[0].to_ascii_uppercase().as_slice() {
        b"GETRANGE" => b"$0\r\n\r\n".to_vec(),
        b"GET" => b"$-1\r\n".to_vec(),
        b"EVAL" => b":1\r\n".to_vec(),
        b"EXISTS" => b":0\r\n".to_vec(),
        _ => b"+OK\r\n".to_vec(),
    }
}

fn serve(stream: TcpStream, answer: &Answer, sent: &AtomicU64, commands: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    while let Some(args) = read_command(&mut reader) {
        commands
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(&args[0]).to_ascii_uppercase());
        let mut send = |bytes: &[u8]| {
            let ok = writer.write_all(bytes).is_ok();
            if ok {
                sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
            }
            ok
        };
        match answer(&args) {
            Reply::Bytes(bytes) => {
                if !send(&bytes) {
                    return;
                }
            }
            Reply::Trickle(bytes, every) => {
                for b in bytes {
                    std::thread::sleep(every);
                    if !send(&[b]) {
                        return;
                    }
                }
            }
            Reply::Flood(head, mut filler) => {
                if !send(&head) {
                    return;
                }
                let chunk = vec![b'x'; 64 << 10];
                while filler > 0 {
                    let n = filler.min(chunk.len());
                    if !send(&chunk[..n]) {
                        return;
                    }
                    filler -= n;
                }
                return;
            }
            Reply::Close(bytes) => {
                send(&bytes);
                return;
            }
            Reply::Never => {
                // Read on (and drop) until the client goes away.
                let _ = std::io::copy(&mut reader, &mut std::io::sink());
                return;
            }
        }
    }
}

/// One command as a client sends it (an array of bulk strings); `None` at the end of the
/// connection or on anything else.
fn read_command(reader: &mut impl BufRead) -> Option<Vec<Vec<u8>>> {
    let count: usize = read_header(reader, b'*')?;
    (0..count)
        .map(|_| {
            let len: usize = read_header(reader, b'$')?;
            let mut arg = vec![0; len + 2];
            reader.read_exact(&mut arg).ok()?;
            arg.truncate(len);
            Some(arg)
        })
        .collect()
}

fn read_header(reader: &mut impl BufRead, kind: u8) -> Option<usize> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line).ok()?;
    let line = line.strip_suffix(b"\r\n")?;
    let (&first, number) = line.split_first()?;
    (first == kind).then_some(())?;
    std::str::from_utf8(number).ok()?.parse().ok()
}
