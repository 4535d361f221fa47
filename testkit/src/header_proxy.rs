//! A proxy in front of an HTTP server that drops some request headers (a store behind one that
//! loses `If-None-Match` and `If-Match`, as some gateways and caches do): one connection to the
//! server per request, `Connection: close` both ways, every request line recorded. Standard
//! library only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// A running proxy; its listener thread lives as long as the test process.
pub struct HeaderProxy {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

impl HeaderProxy {
    /// Forwards to `upstream` (`host:port`) every request, without the headers named in `drop`
    /// (any case).
    pub fn start(upstream: &str, drop: &'static [&'static str]) -> HeaderProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (upstream, seen) = (upstream.to_owned(), Arc::clone(&requests));
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (upstream, seen) = (upstream.clone(), Arc::clone(&seen));
                std::thread::spawn(move || {
                    let _ = relay(client, &upstream, drop, &seen);
                });
            }
        });
        HeaderProxy { port, requests }
    }

    /// `http://127.0.0.1:<port>`: the endpoint to give the client.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The request lines (`GET /bucket/key?... HTTP/1.1`) whose method is `method` and whose
    /// path contains `part`.
    pub fn requests(&self, method: &str, part: &str) -> usize {
        let seen = self.requests.lock().unwrap();
        let prefix = format!("{method} ");
        seen.iter()
            .filter(|line| line.starts_with(&prefix) && line.contains(part))
            .count()
    }
}

/// Relays the one request of a client connection over a connection of its own.
fn relay(
    client: TcpStream,
    upstream: &str,
    drop: &[&str],
    seen: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    let Some((head, length)) = read_head(&mut reader, drop)? else {
        return Ok(());
    };
    let line = head.lines().next().unwrap_or_default().to_owned();
    seen.lock().unwrap().push(line);
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    let mut server = TcpStream::connect(upstream)?;
    server.write_all(head.as_bytes())?;
    server.write_all(&body)?;
    let mut response = Vec::new();
    server.read_to_end(&mut response)?;
    // The response as sent, but for the connection's fate: this one closes.
    let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return client.write_all(&response);
    };
    let head = String::from_utf8_lossy(&response[..end]);
    let kept: Vec<&str> = head
        .split("\r\n")
        .filter(|h| !h.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    client.write_all(format!("{}\r\nConnection: close\r\n\r\n", kept.join("\r\n")).as_bytes())?;
    client.write_all(&response[end + 4..])
}

/// A request's head with the `drop` headers left out and `Connection: close` in place of any
/// connection header, and its body's length; `None` at the end of the connection.
fn read_head(
    reader: &mut BufReader<TcpStream>,
    drop: &[&str],
) -> std::io::Result<Option<(String, usize)>> {
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if line == "\r\n" {
            head.push_str("Connection: close\r\n\r\n");
            return Ok(Some((head, length)));
        }
        let name = line
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        if name == "content-length" {
            length = line[line.find(':').unwrap() + 1..]
                .trim()
                .parse()
                .unwrap_or(0);
        }
        if name == "connection" || drop.iter().any(|d| d.eq_ignore_ascii_case(&name)) {
            continue;
        }
        head.push_str(&line);
    }
}
