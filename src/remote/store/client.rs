//! Connections to the store, standalone or Redis Cluster: a few kept open between operations,
//! each operation bounded by one deadline (connecting, TLS, authenticating, sending, reading and
//! following cluster redirects all count against it) and each reply read within the entry
//! size limit ([`resp`]). A server that stalls, trickles, floods or lies costs an operation at
//! most its budget and `max_entry_size` plus a constant.
//!
//! redis-rs parses the URLs, packs the commands and turns values into Rust types and server
//! errors into its error kinds; kcache does the I/O itself, because redis-rs's own connections
//! only set per-read socket timeouts (a byte every so often keeps them waiting forever) and
//! read a whole reply, of whatever size it declares, before returning it.

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError,
    RedisResult, TlsCertificates, Value,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::resp;
use crate::ffi::process;

/// Connections kept open for later operations, all nodes together; more may be open at once,
/// and are closed after their operation.
const POOL: usize = 8;
/// Cluster redirects (`MOVED`, `ASK`) one operation follows.
const MAX_REDIRECTS: usize = 3;
/// Redis Cluster's hash slots.
const SLOTS: u16 = 16384;

/// What the remote URL names: one server, or a Redis Cluster reached through its seed nodes
/// (each operation goes to the node of its key's slot, learned from the cluster's redirects).
pub(crate) struct Target {
    seeds: Vec<ConnectionInfo>,
    cluster: bool,
    /// For `rediss://`: the server's roots (the operator's CA, else the system's) and the
    /// client certificate.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Target {
    /// `seeds`: the URLs; `cluster`: a Redis Cluster (implied by several seeds).
    pub(crate) fn new(
        seeds: &[&str],
        cluster: bool,
        tls: Option<TlsCertificates>,
    ) -> RedisResult<Target> {
        let seeds = seeds
            .iter()
            .map(|s| s.into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        let mut insecure = false;
        let mut secure = false;
        for seed in &seeds {
            match seed.addr {
                ConnectionAddr::TcpTls { insecure: i, .. } => {
                    secure = true;
                    insecure |= i;
                }
                ConnectionAddr::Unix(_) if cluster || seeds.len() > 1 => {
                    return Err(config_error("a Redis Cluster over Unix sockets"));
                }
                _ => {}
            }
        }
        if insecure {
            return Err(config_error("TLS without verifying the server (#insecure)"));
        }
        let tls = match secure {
            true => Some(Arc::new(tls_config(tls)?)),
            false => None,
        };
        Ok(Target {
            cluster: cluster || seeds.len() > 1,
            seeds,
            tls,
        })
    }
}

fn config_error(what: &'static str) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, "not supported", what.into()))
}

/// The TLS settings of `rediss://` servers: rustls with ring; the operator's CA alone, else the
/// system's roots; the client certificate when given.
fn tls_config(certs: Option<TlsCertificates>) -> RedisResult<rustls::ClientConfig> {
    let invalid = |what: &str, e: &dyn std::fmt::Display| {
        RedisError::from((
            ErrorKind::InvalidClientConfig,
            "unusable TLS file",
            format!("{what}: {e}"),
        ))
    };
    let certs = certs.unwrap_or(TlsCertificates {
        client_tls: None,
        root_cert: None,
    });
    let mut roots = rustls::RootCertStore::empty();
    match &certs.root_cert {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| invalid("CA file", &e))?;
                roots.add(cert).map_err(|e| invalid("CA file", &e))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("TLS versions", &e))?
        .with_root_certificates(roots);
    Ok(match certs.client_tls {
        Some(client) => {
            let chain = CertificateDer::pem_slice_iter(&client.client_cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid("client certificate", &e))?;
            let key = PrivateKeyDer::from_pem_slice(&client.client_key)
                .map_err(|e| invalid("client key", &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid("client certificate", &e))?
        }
        None => builder.with_no_client_auth(),
    })
}

pub(super) struct Client {
    target: Target,
    timeout: Duration,
    /// The largest bulk string a reply may hold: one byte over the entry size limit.
    max_bulk: u64,
    /// Idle connections and the node each is to.
    idle: Mutex<Idle>,
    /// A cluster's slots whose node a redirect named.
    slots: Mutex<HashMap<u16, ConnectionInfo>>,
}

impl Client {
    pub(super) fn new(target: Target, timeout: Duration, max_entry_size: u64) -> Self {
        Client {
            target,
            timeout,
            max_bulk: max_entry_size.saturating_add(1),
            idle: Mutex::new(Idle {
                generation: process::fork_generation(),
                links: Vec::new(),
            }),
            slots: Mutex::default(),
        }
    }

    /// Sends `cmd` (about `key`) to the key's node and reads its reply as a `T`, all within
    /// the budget. A connection whose operation failed is dropped: what it would read next is
    /// unknown.
    pub(super) fn query<T: FromRedisValue>(&self, key: &str, cmd: &Cmd) -> RedisResult<T> {
        let deadline = Instant::now() + self.timeout;
        let packed = cmd.get_packed_command();
        let slot = slot(key.as_bytes());
        // A cluster's node for the slot, when a redirect named it; else a seed.
        let mut node = match self.target.cluster {
            true => self.slots.lock().get(&slot).cloned(),
            false => None,
        };
        let mut asking = false;
        for _ in 0..=MAX_REDIRECTS {
            let (name, mut link) = self.link(node.as_ref(), deadline)?;
            if asking {
                link.call(&redis::cmd("ASKING").get_packed_command(), deadline, 0)?
                    .extract_error()?;
            }
            let reply = link.call(&packed, deadline, self.max_bulk)?;
            // Whatever the server said, the connection is in step: keep it.
            self.keep(name, link);
            let error = match reply.extract_error() {
                Ok(value) => return T::from_owned_redis_value(value),
                Err(e) => e,
            };
            let redirect = match error.kind() {
                ErrorKind::Moved | ErrorKind::Ask if self.target.cluster => error
                    .redirect_node()
                    .and_then(|(addr, _)| self.node_at(addr)),
                _ => None,
            };
            let Some(to) = redirect else {
                return Err(error);
            };
            asking = error.kind() == ErrorKind::Ask;
            if !asking {
                self.slots.lock().insert(slot, to.clone());
            }
            node = Some(to);
        }
        Err(RedisError::from((
            ErrorKind::ClusterDown,
            "too many cluster redirects",
        )))
    }

    /// An idle connection to `node` (else to any seed), or a new one.
    fn link(
        &self,
        node: Option<&ConnectionInfo>,
        deadline: Instant,
    ) -> RedisResult<(String, Link)> {
        let candidates = match node {
            Some(node) => std::slice::from_ref(node),
            None => &self.target.seeds[..],
        };
        {
            let mut idle = self.idle.lock();
            let idle = idle.own();
            for info in candidates {
                let name = info.addr.to_string();
                if let Some(at) = idle.iter().position(|(n, _)| *n == name) {
                    return Ok(idle.swap_remove(at));
                }
            }
        }
        let mut failure = None;
        for info in candidates {
            match Link::connect(info, self.target.tls.as_ref(), deadline) {
                Ok(link) => return Ok((info.addr.to_string(), link)),
                Err(e) => failure = Some(e),
            }
        }
        Err(failure.unwrap_or_else(|| config_error("no seed node")))
    }

    fn keep(&self, name: String, link: Link) {
        let mut idle = self.idle.lock();
        let idle = idle.own();
        if idle.len() < POOL && link.in_step() {
            idle.push((name, link));
        }
    }

    /// The node at `addr` (`host:port`, as a redirect names it), reached as the seeds are.
    fn node_at(&self, addr: &str) -> Option<ConnectionInfo> {
        let (host, port) = addr.rsplit_once(':')?;
        let port = port.parse().ok()?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let seed = &self.target.seeds[0];
        let addr = match seed.addr {
            ConnectionAddr::TcpTls { .. } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        Some(ConnectionInfo {
            addr,
            redis: seed.redis.clone(),
        })
    }

    /// Closes the idle connections (after a failure: they may lead to the same dead server).
    pub(super) fn drop_idle(&self) {
        self.idle.lock().links.clear();
        self.slots.lock().clear();
    }
}

/// Idle connections, and the fork generation ([`process::fork_generation`]) that opened them:
/// a forked child shares its parent's sockets (and TLS sessions), and must not talk over them.
struct Idle {
    generation: u64,
    links: Vec<(String, Link)>,
}

impl Idle {
    /// This process's idle connections; a forked child closes its copies of its parent's
    /// (closing a copy leaves the parent's socket open).
    fn own(&mut self) -> &mut Vec<(String, Link)> {
        let generation = process::fork_generation();
        if self.generation != generation {
            self.links.clear();
            self.generation = generation;
        }
        &mut self.links
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of the key, or of its `{hash tag}`.
fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS
}

/// One connection: its stream, every read and write of which ends by the operation's
/// deadline, behind a read buffer.
struct Link {
    io: BufReader<Stream>,
}

impl Link {
    /// Connects to `info` (TCP, TLS or a Unix socket) and authenticates and selects its
    /// database as the URL says, by `deadline`.
    fn connect(
        info: &ConnectionInfo,
        tls: Option<&Arc<rustls::ClientConfig>>,
        deadline: Instant,
    ) -> RedisResult<Link> {
        let timed = |socket| Timed { socket, deadline };
        let stream = match &info.addr {
            ConnectionAddr::Tcp(host, port) => {
                Stream::Plain(timed(Socket::Tcp(tcp(host, *port, deadline)?)))
            }
            ConnectionAddr::TcpTls { host, port, .. } => {
                let Some(config) = tls else {
                    return Err(config_error("rediss:// without TLS settings"));
                };
                let name = ServerName::try_from(host.clone()).map_err(|e| {
                    RedisError::from((
                        ErrorKind::InvalidClientConfig,
                        "not a server name",
                        e.to_string(),
                    ))
                })?;
                let session = rustls::ClientConnection::new(Arc::clone(config), name)
                    .map_err(|e| RedisError::from(io::Error::other(e)))?;
                let sock = timed(Socket::Tcp(tcp(host, *port, deadline)?));
                Stream::Tls(Box::new(rustls::StreamOwned::new(session, sock)))
            }
            ConnectionAddr::Unix(path) => {
                Stream::Plain(timed(Socket::Unix(UnixStream::connect(path)?)))
            }
        };
        let mut link = Link {
            // The buffer is for the small values; a large bulk string is read past it.
            io: BufReader::with_capacity(16 << 10, stream),
        };
        let r = &info.redis;
        if let Some(password) = &r.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &r.username {
                auth.arg(user);
            }
            auth.arg(password);
            link.call(&auth.get_packed_command(), deadline, 0)?
                .extract_error()?;
        }
        if r.db != 0 {
            link.call(
                &redis::cmd("SELECT").arg(r.db).get_packed_command(),
                deadline,
                0,
            )?
            .extract_error()?;
        }
        Ok(link)
    }

    /// Sends a packed command and reads its reply (a bulk string of at most `max_bulk`
    /// bytes), by `deadline`.
    fn call(&mut self, packed: &[u8], deadline: Instant, max_bulk: u64) -> RedisResult<Value> {
        self.io.get_mut().set_deadline(deadline);
        self.io.get_mut().write_all(packed)?;
        self.io.get_mut().flush()?;
        resp::read_reply(&mut self.io, max_bulk)
    }

    /// Whether the reply read last was all the server sent: bytes after it would be read as
    /// the next command's reply.
    fn in_step(&self) -> bool {
        self.io.buffer().is_empty()
    }
}

/// A TCP connection to `host:port`, made by `deadline`.
fn tcp(host: &str, port: u16, deadline: Instant) -> RedisResult<TcpStream> {
    let mut failure = None;
    for addr in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, left(deadline)?) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) => failure = Some(e),
        }
    }
    Err(failure
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
        .into())
}

/// The time left before `deadline`; a timeout error when there is none.
fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the remote operation ran past its budget",
        ));
    }
    Ok(left)
}

enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A socket whose every read and write waits at most until `deadline`: its timeout is set to
/// the time left before each, so that a server sending a byte at a time still ends the
/// operation at its deadline. (TLS sits on top of it, so that its records are bounded too.)
struct Timed {
    socket: Socket,
    deadline: Instant,
}

impl Timed {
    fn arm(&self) -> io::Result<()> {
        let left = Some(left(self.deadline)?);
        match &self.socket {
            Socket::Tcp(s) => {
                s.set_read_timeout(left)?;
                s.set_write_timeout(left)
            }
            Socket::Unix(s) => {
                s.set_read_timeout(left)?;
                s.set_write_timeout(left)
            }
        }
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        match &mut self.socket {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        match &mut self.socket {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Stream {
    Plain(Timed),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, Timed>>),
}

impl Stream {
    fn set_deadline(&mut self, deadline: Instant) {
        match self {
            Stream::Plain(t) => t.deadline = deadline,
            Stream::Tls(s) => s.sock.deadline = deadline,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(t) => t.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_as_redis_cluster_computes_them() {
        // Values from the Redis Cluster specification's examples and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 0x31c3 % SLOTS);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty tag is no tag: the whole key is hashed.
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
    }
}
