//! Connections to the store, standalone or Redis Cluster: a few kept open between operations,
//! each operation bounded by the configured budget (connecting included), so that a store
//! that stalls costs a lookup at most that budget.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Connection, ConnectionLike, RedisResult};

use crate::ffi::process;

/// Connections kept open for later operations; more may be open at once, and are closed
/// after their operation.
const POOL: usize = 4;

/// What the remote URL names.
pub(crate) enum Target {
    Single(redis::Client),
    /// A Redis Cluster, reached through its seed nodes; the client follows its slots.
    Cluster(ClusterClient),
}

enum Conn {
    Single(Connection),
    /// Boxed: it holds a connection per node and the slot map.
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    fn like(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Conn::Single(c) => c,
            Conn::Cluster(c) => c.as_mut(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Conn::Single(c) => c.is_open(),
            Conn::Cluster(c) => c.is_open(),
        }
    }

    fn set_timeouts(&self, timeout: Duration) -> RedisResult<()> {
        match self {
            Conn::Single(c) => {
                c.set_read_timeout(Some(timeout))?;
                c.set_write_timeout(Some(timeout))
            }
            Conn::Cluster(c) => {
                c.set_read_timeout(Some(timeout))?;
                c.set_write_timeout(Some(timeout))
            }
        }
    }
}

pub(super) struct Client {
    target: Target,
    timeout: Duration,
    idle: Mutex<Idle>,
}

/// Idle connections, and the fork generation ([`process::fork_generation`]) that opened them:
/// a forked child shares its parent's sockets, and must not talk over them.
#[derive(Default)]
struct Idle {
    generation: u64,
    conns: Vec<Conn>,
}

impl Idle {
    /// This process's idle connections; a forked child closes its copies of its parent's.
    fn own(&mut self) -> &mut Vec<Conn> {
        let generation = process::fork_generation();
        if self.generation != generation {
            self.conns.clear();
            self.generation = generation;
        }
        &mut self.conns
    }
}

impl Client {
    pub(super) fn new(target: Target, timeout: Duration) -> Self {
        Client {
            target,
            timeout,
            idle: Mutex::default(),
        }
    }

    /// Runs `op` on an idle connection or a new one, within the budget. A connection whose
    /// operation failed is dropped: what it would read next is unknown.
    pub(super) fn run<T>(
        &self,
        op: impl FnOnce(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let started = Instant::now();
        let idle = {
            let mut idle = self.idle.lock();
            let idle = idle.own();
            std::iter::from_fn(|| idle.pop()).find(|c| c.is_open())
        };
        let mut con = match idle {
            Some(con) => con,
            None => self.connect()?,
        };
        // At least a millisecond: a zero timeout means none to the socket.
        let left = self
            .timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        con.set_timeouts(left)?;
        let out = op(con.like());
        if out.is_ok() {
            let mut idle = self.idle.lock();
            let idle = idle.own();
            if idle.len() < POOL {
                idle.push(con);
            }
        }
        out
    }

    fn connect(&self) -> RedisResult<Conn> {
        Ok(match &self.target {
            Target::Single(client) => {
                Conn::Single(client.get_connection_with_timeout(self.timeout)?)
            }
            // The cluster client's own connection and response timeouts bound this.
            Target::Cluster(client) => Conn::Cluster(Box::new(client.get_connection()?)),
        })
    }

    /// Closes the idle connections (after a failure: they may lead to the same dead server).
    pub(super) fn drop_idle(&self) {
        self.idle.lock().conns.clear();
    }
}
