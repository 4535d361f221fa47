//! A fake S3 server for the hostile cases a real one never shows: a thread answering every
//! request of every connection on a loopback port as the test says ([`Answer`]), counting the
//! requests and the bytes it sent. Standard library only, so that kcache's own unit tests
//! include this file by path.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How the fake answers each request.
#[derive(Clone, Debug)]
pub enum Answer {
    /// This status, with an empty body.
    Status(u16),
    /// 200 announcing `Content-Length: announced`, then `sent` bytes as fast as they are taken,
    /// then nothing (the connection held open).
    Lying { announced: u64, sent: u64 },
    /// 200, chunked, chunks without end.
    Endless,
    /// 200 announcing `len` bytes, sent one every `every`.
    Trickle { len: u64, every: Duration },
    /// Reads the request and never answers.
    Silent,
}

/// A running fake, stopped on drop.
pub struct FakeS3 {
    port: u16,
    requests: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl FakeS3 {
    pub fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, halt) = (requests.clone(), sent.clone(), stop.clone());
        std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (answer, r, s, halt) =
                            (answer.clone(), r.clone(), s.clone(), halt.clone());
                        std::thread::spawn(move || serve(stream, &answer, &r, &s, &halt));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeS3 {
            port,
            requests,
            sent,
            stop,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Requests received (their headers read).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Body bytes written to clients (what the kernel took).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for FakeS3 {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads one request's head (and its body, by `Content-Length`); `false` when the client left.
fn read_request(stream: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return false,
        }
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    std::io::copy(&mut stream.take(len), &mut std::io::sink()).is_ok()
}

fn serve(
    mut stream: TcpStream,
    answer: &Answer,
    requests: &AtomicU64,
    sent: &AtomicU64,
    stop: &AtomicBool,
) {
    let _ = stream.set_nodelay(true);
    while read_request(&mut stream) {
        requests.fetch_add(1, Ordering::Relaxed);
        let filler = [b'x'; 16 << 10];
        let mut send = |bytes: &[u8]| -> bool {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            stream.write_all(bytes).is_ok()
        };
        let ok = match answer {
            Answer::Status(status) => {
                send(format!("HTTP/1.1 {status} Fake\r\nContent-Length: 0\r\n\r\n").as_bytes())
            }
            Answer::Lying {
                announced,
                sent: body,
            } => {
                let mut ok = send(
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {announced}\r\n\r\n").as_bytes(),
                );
                let mut left = *body;
                while ok && left > 0 {
                    let n = left.min(filler.len() as u64) as usize;
                    ok = send(&filler[..n]);
                    if ok {
                        sent.fetch_add(n as u64, Ordering::Relaxed);
                        left -= n as u64;
                    }
                }
                // Holds the connection open, sending nothing more.
                while ok && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                false
            }
            Answer::Endless => {
                let mut ok = send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
                while ok {
                    ok = send(format!("{:x}\r\n", filler.len()).as_bytes())
                        && send(&filler)
                        && send(b"\r\n");
                    if ok {
                        sent.fetch_add(filler.len() as u64, Ordering::Relaxed);
                    }
                }
                false
            }
            Answer::Trickle { len, every } => {
                let mut ok =
                    send(format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n").as_bytes());
                for _ in 0..*len {
                    if !ok {
                        break;
                    }
                    std::thread::sleep(*every);
                    ok = send(b"x");
                    if ok {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
                ok
            }
            Answer::Silent => {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                false
            }
        };
        if !ok {
            return;
        }
    }
}
