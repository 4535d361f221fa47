//! The circuit breaker: after `threshold` consecutive failed operations a store is skipped
//! for `cooldown`, then one operation probes it; a success closes the breaker, a failure opens
//! it for another cooldown. A store that is down then costs the lookups one timeout per
//! cooldown instead of one per lookup.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    consecutive: u32,
    /// Open until then: operations are skipped.
    open_until: Option<Instant>,
    /// An operation is probing the remote after a cooldown; the others still skip.
    probing: bool,
}

/// What [`Breaker::record`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    None,
    /// Closed → open.
    Tripped,
    /// A probe succeeded: open → closed.
    Closed,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            state: Mutex::default(),
        }
    }

    /// Whether an operation may go to the remote now (a probe, when the cooldown is over).
    pub(crate) fn allow(&self) -> bool {
        let mut s = self.state.lock();
        match s.open_until {
            None => true,
            Some(until) if s.probing || Instant::now() < until => false,
            Some(_) => {
                s.probing = true;
                true
            }
        }
    }

    /// Records an allowed operation's outcome.
    pub(crate) fn record(&self, ok: bool) -> Change {
        let mut s = self.state.lock();
        let was_open = s.open_until.is_some();
        if ok {
            *s = State::default();
            return if was_open {
                Change::Closed
            } else {
                Change::None
            };
        }
        s.consecutive = s.consecutive.saturating_add(1);
        if s.probing || s.consecutive >= self.threshold {
            s.open_until = Some(Instant::now() + self.cooldown);
            s.probing = false;
            if !was_open {
                return Change::Tripped;
            }
        }
        Change::None
    }

    pub(crate) fn is_open(&self) -> bool {
        self.state.lock().open_until.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_after_threshold_and_probes_after_cooldown() {
        let b = Breaker::new(2, Duration::ZERO);
        assert!(b.allow());
        assert_eq!(b.record(false), Change::None);
        assert!(!b.is_open());
        assert_eq!(b.record(false), Change::Tripped);
        assert!(b.is_open());
        // Cooldown zero: the next operation probes; a second one waits for the probe.
        assert!(b.allow());
        assert!(!b.allow());
        assert_eq!(b.record(false), Change::None);
        assert!(b.is_open());
        assert!(b.allow());
        assert_eq!(b.record(true), Change::Closed);
        assert!(!b.is_open());
        assert!(b.allow());
    }

    #[test]
    fn stays_open_during_cooldown() {
        let b = Breaker::new(1, Duration::from_secs(3600));
        assert_eq!(b.record(false), Change::Tripped);
        assert!(!b.allow());
        assert!(!b.allow());
    }
}
