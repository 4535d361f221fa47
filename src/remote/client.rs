//! Connections to the store: a few kept open between operations, each operation bounded by
//! the configured budget (connecting included), so that a store that stalls costs a lookup
//! at most that budget.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{Connection, ConnectionLike, RedisResult};

/// Connections kept open for later operations; more may be open at once, and are closed
/// after their operation.
const POOL: usize = 4;

pub(super) struct Client {
    client: redis::Client,
    timeout: Duration,
    idle: Mutex<Vec<Connection>>,
}

impl Client {
    pub(super) fn new(client: redis::Client, timeout: Duration) -> Self {
        Client {
            client,
            timeout,
            idle: Mutex::default(),
        }
    }

    /// Runs `op` on an idle connection or a new one, within the budget. A connection whose
    /// operation failed is dropped: what it would read next is unknown.
    pub(super) fn run<T>(
        &self,
        op: impl FnOnce(&mut Connection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let started = Instant::now();
        let idle = {
            let mut idle = self.idle.lock();
            std::iter::from_fn(|| idle.pop()).find(|c| c.is_open())
        };
        let mut con = match idle {
            Some(con) => con,
            None => self.client.get_connection_with_timeout(self.timeout)?,
        };
        // At least a millisecond: a zero timeout means none to the socket.
        let left = self
            .timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        con.set_read_timeout(Some(left))?;
        con.set_write_timeout(Some(left))?;
        let out = op(&mut con);
        if out.is_ok() {
            let mut idle = self.idle.lock();
            if idle.len() < POOL {
                idle.push(con);
            }
        }
        out
    }

    /// Closes the idle connections (after a failure: they may lead to the same dead server).
    pub(super) fn drop_idle(&self) {
        self.idle.lock().clear();
    }
}
