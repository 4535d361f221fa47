//! Replies from the remote store as kcache reads them (`kcache::remote::resp::read_reply`).
//!
//! The store is not trusted: a server, or anyone on the path of a plain `redis://` link, can
//! send any bytes, in any pieces. The reader must never panic, never consume more than the
//! entry size limit plus `OVERHEAD` bytes, never hold a string over the limit, more values than
//! `MAX_VALUES` or nesting deeper than `MAX_DEPTH`, and what it accepts must be exactly what
//! redis-rs's own parser reads from the same bytes (so that kcache's bounded reader is a
//! restriction of the protocol, not another dialect of it).
//!
//! Input: two bytes of entry size limit (0..=65535), one byte of read size (the pieces the
//! "socket" hands over, 1..=256 bytes), then the bytes the server sends.
#![no_main]

use std::io::{BufReader, Read};

use kcache::remote::resp::{MAX_DEPTH, MAX_VALUES, OVERHEAD, read_reply};
use libfuzzer_sys::fuzz_target;
use redis::Value;

/// A socket that hands over at most `piece` bytes a read.
struct Pieces<'a> {
    bytes: &'a [u8],
    piece: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

/// The number of values in `v`, its nesting depth (arrays), and its longest bulk string.
fn shape(v: &Value) -> (usize, usize, usize) {
    match v {
        Value::Array(items) => items.iter().map(shape).fold((1, 1, 0), |(n, d, l), (n2, d2, l2)| {
            (n + n2, d.max(d2 + 1), l.max(l2))
        }),
        Value::BulkString(b) => (1, 0, b.len()),
        _ => (1, 0, 0),
    }
}

fuzz_target!(|data: &[u8]| {
    let [a, b, piece, sent @ ..] = data else {
        return;
    };
    let max_bulk = u64::from(u16::from_le_bytes([*a, *b]));
    let mut reader = BufReader::with_capacity(64, Pieces {
        bytes: sent,
        piece: usize::from(*piece).max(1),
    });
    let read = read_reply(&mut reader, max_bulk);
    // What the reader took from the socket, less what it holds buffered for the next reply.
    let consumed = sent.len() - reader.get_ref().bytes.len() - reader.buffer().len();
    assert!(
        consumed as u64 <= max_bulk + OVERHEAD + 64,
        "consumed {consumed} bytes with a limit of {max_bulk}"
    );
    if let Ok(value) = read {
        let (values, depth, longest) = shape(&value);
        assert!(values <= MAX_VALUES, "{values} values");
        assert!(depth <= MAX_DEPTH, "nested {depth} deep");
        assert!(longest as u64 <= max_bulk, "a string of {longest} bytes");
        // redis-rs reads the same bytes as the same value.
        let theirs = redis::parse_redis_value(&sent[..consumed]).expect("redis-rs refused");
        assert_eq!(theirs, value);
    }
});
