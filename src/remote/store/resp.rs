//! Replies from the store, read within bounds: a reply may take at most a byte budget (the
//! entry size limit plus a constant), a few hundred values and a few levels of nesting, and a
//! length it declares is checked against what is left of the budget before a byte of it is
//! read or allocated. Whatever the server sends, reading a reply costs at most that much
//! memory and reads at most that many bytes; past a bound the reply is an error and the
//! connection is dropped.
//!
//! Only RESP2 is read (kcache never asks for RESP3): `+` simple strings, `-` errors, `:`
//! integers, `$` bulk strings and `*` arrays, as redis-rs's [`Value`]. redis-rs itself reads a
//! whole reply before anyone can look at its size, which is why this reader exists; error
//! lines are still handed to redis-rs's parser, so that their kinds (`MOVED`, `ASK`, `NOAUTH`,
//! ...) are exactly redis-rs's.

use std::io::{BufRead, ErrorKind as IoKind};

use redis::{ErrorKind, RedisError, RedisResult, Value};

/// Bytes a reply may take beyond its largest bulk string: the framing of that string and of
/// the small values around it.
pub const OVERHEAD: u64 = 4096;
/// The longest line (a simple string, an error, a number).
pub const MAX_LINE: usize = 1024;
/// The most values one reply may hold, all levels together (kcache's replies hold one).
pub const MAX_VALUES: usize = 256;
/// The deepest nesting of arrays.
pub const MAX_DEPTH: usize = 4;

/// Reads one reply from `reader`, whose largest bulk string may be `max_bulk` bytes. An error
/// reply is a [`Value::ServerError`]; what breaks a bound, the protocol or the connection is
/// an `Err`.
pub fn read_reply(reader: &mut impl BufRead, max_bulk: u64) -> RedisResult<Value> {
    let mut budget = Budget {
        max_bulk,
        bytes: max_bulk.saturating_add(OVERHEAD),
        values: MAX_VALUES,
    };
    value(reader, &mut budget, 0)
}

struct Budget {
    /// The largest bulk string.
    max_bulk: u64,
    /// What the rest of the reply may take.
    bytes: u64,
    values: usize,
}

fn value(reader: &mut impl BufRead, budget: &mut Budget, depth: usize) -> RedisResult<Value> {
    if budget.values == 0 {
        return Err(refused("more values than a reply may hold"));
    }
    budget.values -= 1;
    let line = line(reader, budget)?;
    let Some((&kind, rest)) = line.split_first() else {
        return Err(refused("an empty line"));
    };
    match kind {
        b'+' => Ok(match rest {
            b"OK" => Value::Okay,
            _ => Value::SimpleString(text(rest)?.to_owned()),
        }),
        b'-' => {
            // A bounded line: redis-rs parses it into its error kinds.
            let mut error = line.clone();
            error.extend_from_slice(b"\r\n");
            redis::parse_redis_value(&error)
        }
        b':' => Ok(Value::Int(number(rest)?)),
        b'$' => match number(rest)? {
            -1 => Ok(Value::Nil),
            len if len < 0 => Err(refused("a negative length")),
            len => bulk(reader, budget, len as u64),
        },
        b'*' => match number(rest)? {
            -1 => Ok(Value::Nil),
            len if len < 0 => Err(refused("a negative length")),
            len if len as u64 > budget.values as u64 => {
                Err(refused("an array larger than a reply may hold"))
            }
            _ if depth + 1 > MAX_DEPTH => Err(refused("arrays nested too deep")),
            len => (0..len)
                .map(|_| value(reader, budget, depth + 1))
                .collect::<RedisResult<Vec<_>>>()
                .map(Value::Array),
        },
        _ => Err(refused("a reply of an unknown type")),
    }
}

/// A bulk string of `len` bytes (its header read), checked against the budget first.
fn bulk(reader: &mut impl BufRead, budget: &mut Budget, len: u64) -> RedisResult<Value> {
    let framed = len.saturating_add(2);
    if len > budget.max_bulk || framed > budget.bytes {
        return Err(refused("a string larger than the entry size limit"));
    }
    budget.bytes -= framed;
    let mut bytes = vec![0; len as usize + 2];
    reader.read_exact(&mut bytes)?;
    if !bytes.ends_with(b"\r\n") {
        return Err(refused("a string longer than its length"));
    }
    bytes.truncate(len as usize);
    Ok(Value::BulkString(bytes))
}

/// A line without its `\r\n`, at most [`MAX_LINE`] bytes and within the budget.
fn line(reader: &mut impl BufRead, budget: &mut Budget) -> RedisResult<Vec<u8>> {
    let most = budget.bytes.min(MAX_LINE as u64 + 2) as usize;
    let mut line = Vec::new();
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Err(
                std::io::Error::new(IoKind::UnexpectedEof, "the reply was cut short").into(),
            );
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > most {
            return Err(refused("a line longer than a reply may hold"));
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if done {
            break;
        }
    }
    budget.bytes -= line.len() as u64;
    if !line.ends_with(b"\r\n") {
        return Err(refused("a line not ended by CRLF"));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn text(bytes: &[u8]) -> RedisResult<&str> {
    std::str::from_utf8(bytes).map_err(|_| refused("a simple string that is not UTF-8"))
}

fn number(bytes: &[u8]) -> RedisResult<i64> {
    text(bytes)?
        .parse()
        .map_err(|_| refused("a number that does not parse"))
}

fn refused(why: &'static str) -> RedisError {
    RedisError::from((ErrorKind::ParseError, "reply refused", why.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8], max_bulk: u64) -> RedisResult<Value> {
        read_reply(&mut &bytes[..], max_bulk)
    }

    #[test]
    fn values_and_bounds() {
        assert_eq!(read(b"+OK\r\n", 0).unwrap(), Value::Okay);
        assert_eq!(read(b":-7\r\n", 0).unwrap(), Value::Int(-7));
        assert_eq!(read(b"$-1\r\n", 0).unwrap(), Value::Nil);
        assert_eq!(
            read(b"$3\r\nabc\r\n", 3).unwrap(),
            Value::BulkString(b"abc".to_vec())
        );
        assert_eq!(
            read(b"*2\r\n:1\r\n$0\r\n\r\n", 0).unwrap(),
            Value::Array(vec![Value::Int(1), Value::BulkString(vec![])])
        );
        let moved = read(b"-MOVED 3999 127.0.0.1:6381\r\n", 0)
            .unwrap()
            .extract_error()
            .unwrap_err();
        assert_eq!(moved.kind(), ErrorKind::Moved);
        assert_eq!(moved.redirect_node(), Some(("127.0.0.1:6381", 3999)));
        // Over the budget: refused from the header alone.
        assert!(read(b"$5000\r\n", 100).is_err());
        assert!(read(b"$4\r\nabcd\r\n", 3).is_err());
        assert!(read(b"$2000000000\r\n", 64 << 20).is_err());
        assert!(read(b"*2000000\r\n", 64 << 20).is_err());
        assert!(read(&b"*1\r\n".repeat(MAX_DEPTH + 1), 0).is_err());
        assert!(read(b"$3\r\nabcd\r\n", 10).is_err());
        assert!(read(b"$3\r\nab", 10).is_err());
        assert!(read(b"%1\r\n", 10).is_err());
        assert!(read(&[b'+'; 2000], 1 << 20).is_err());
    }
}
