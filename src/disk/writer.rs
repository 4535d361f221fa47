//! The background writer: a built value's bytes are made and written after its caller has it.
//!
//! Serializing (asking a driver for a program's binary can compile, on PoCL for hundreds of
//! milliseconds) and writing (fsyncs) are the two costs of a miss that no caller needs to wait
//! for. One thread per disk tier, started on the first write, runs them in order from a
//! bounded queue; a full queue runs the write on the caller instead, so memory stays bounded
//! and nothing is dropped. [`Writer::flush`] waits for the queue to drain; the disk tier
//! flushes when it is dropped.
//!
//! A write may also be *parked* ([`Writer::park`]): held back until a condition the writer
//! polls says it is wanted, or until the next flush, whichever comes first. The writer polls
//! every [`POLL`] while anything it can poll is parked. A parked write stays parked however
//! many follow it (it holds what its bytes are made from until the flush); but its condition
//! holds a lock file open, so at most [`max_polled`] conditions are kept: parking one more
//! drops the oldest one's condition (its lock is released, and other processes build that entry
//! for themselves rather than wait), and its write waits for the flush.
//!
//! A forked child inherits the queue but not the thread. What the parent queued or parked is
//! the parent's to write (its thread still will): the child forgets it, unrun and undropped
//! (dropping would release the parent's driver objects), and starts a queue and thread of its
//! own at its first write.
//!
//! The queue's lock and condition variables are the standard library's, which wait on their
//! own memory: parking_lot's wait on a table shared by the whole process, and a thread of the
//! parent that was inside that table at the fork left it locked in the child (seen: a child's
//! flush that never returned, one run in a few).
//!
//! A flush on a writer thread (from a log callback called there) cannot wait for the queue
//! that thread runs: it moves the parked writes to the queue and returns; they run as soon as
//! the callback does.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::ffi::process::{self, Held};

/// Writes waiting at most; the next one runs on its caller.
pub const QUEUE_BOUND: usize = 64;

/// How often the writer asks whether a parked write is wanted: how late, at most, it learns.
pub const POLL: Duration = Duration::from_millis(5);

/// How often a flush looks at the queue again while it waits.
const RECHECK: Duration = Duration::from_millis(50);

/// Conditions kept to poll, at least (see [`max_polled`]).
const MIN_POLLED: usize = 32;

/// Conditions of parked writes kept to poll, at most: a quarter of the process's open file
/// limit (`RLIMIT_NOFILE`, the soft one, as the first calls found it), each holding one lock
/// file open; at least 32.
pub fn max_polled() -> usize {
    // Worked out again by a thread that finds it unknown rather than waiting for another (see
    // `process::once_without_waiting`); threads racing at the first call may read two limits
    // if one changes the limit meanwhile, and the last to store wins.
    static MAX: AtomicUsize = AtomicUsize::new(0);
    match MAX.load(Ordering::Relaxed) {
        0 => {
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
            let quarter =
                limit.map_or(usize::MAX, |l| usize::try_from(l / 4).unwrap_or(usize::MAX));
            let max = quarter.max(MIN_POLLED);
            MAX.store(max, Ordering::Relaxed);
            max
        }
        known => known,
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Why a parked write runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Its condition said so.
    Wanted,
    /// A flush (or the disk tier's drop), or too many parked writes.
    Flush,
}

/// A write held back until it is wanted or flushed.
struct Parked {
    /// Polled on the writer thread; `None`: only a flush runs it.
    wanted: Option<Box<dyn Fn() -> bool + Send>>,
    job: Box<dyn FnOnce(Cause) + Send>,
}

impl Parked {
    /// The job, to run for `cause`; the condition is dropped after it (it may own what the job
    /// borrows: see `write_back`).
    fn run_for(self, cause: Cause) -> Job {
        let Parked { wanted, job } = self;
        Box::new(move || {
            job(cause);
            drop(wanted);
        })
    }
}

#[derive(Default)]
pub(super) struct Writer {
    line: Mutex<Line>,
    /// What the writer thread does every [`PUBLISH`] (the disk tier's: add its counters to the
    /// directory's), set once before the first write.
    every_few_seconds: OnceLock<Tick>,
}

/// A periodic task of the writer thread.
pub(super) type Tick = Arc<dyn Fn() + Send + Sync>;

/// How often the writer thread runs its [`Writer::every_few_seconds`] task: how stale, at
/// most, the directory's counters are of a running process that has written.
pub const PUBLISH: Duration = Duration::from_secs(2);

/// A process's queue and the thread that runs it.
struct Line {
    /// The fork generation ([`process::fork_generation`]) it was made in: a forked child finds
    /// its parent's and replaces it.
    generation: u64,
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            generation: process::fork_generation(),
            queue: Arc::default(),
            thread: None,
        }
    }
}

thread_local! {
    /// This thread runs a writer's queue.
    static ON_WRITER: Cell<bool> = const { Cell::new(false) };
}

#[derive(Default)]
struct Queue {
    state: Mutex<State>,
    /// Signalled when a job is queued or the writer is closed.
    work: Condvar,
    /// Signalled when the queue has drained.
    idle: Condvar,
}

impl Queue {
    /// The state; no code panics while holding it (jobs run unlocked).
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Oldest first.
    parked: Vec<Parked>,
    /// A job is running on the writer thread.
    busy: bool,
    closed: bool,
}

impl Writer {
    /// Has the writer thread, while it runs, call `tick` every [`PUBLISH`] when it is idle or
    /// between two writes. Only the first call counts.
    pub(super) fn every_few_seconds(&self, tick: Tick) {
        let _ = self.every_few_seconds.set(tick);
    }

    /// Runs `job` on the writer thread, or on the caller when the queue is full or the thread
    /// cannot be started.
    pub(super) fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let (queue, started) = self.queue(true);
        let mut state = queue.state();
        if state.jobs.len() >= QUEUE_BOUND || !started {
            drop(state);
            job();
            return;
        }
        state.jobs.push_back(Box::new(job));
        drop(state);
        queue.work.notify_one();
    }

    /// Holds `job` back until `wanted` (polled on the writer thread) returns true, then runs it
    /// there with [`Cause::Wanted`]; or until the next flush, which runs it with
    /// [`Cause::Flush`]. Without `wanted`, only a flush runs it. Without a writer thread, it
    /// runs now, as flushed.
    pub(super) fn park(
        &self,
        wanted: Option<Box<dyn Fn() -> bool + Send>>,
        job: impl FnOnce(Cause) + Send + 'static,
    ) {
        let parked = Parked {
            wanted,
            job: Box::new(job),
        };
        let (queue, started) = self.queue(true);
        if !started {
            return (parked.job)(Cause::Flush);
        }
        let mut state = queue.state();
        let polled = parked.wanted.is_some();
        state.parked.push(parked);
        if polled && state.parked.iter().filter(|p| p.wanted.is_some()).count() > max_polled() {
            let oldest = state.parked.iter_mut().find(|p| p.wanted.is_some());
            oldest.expect("counted above").wanted = None;
        }
        drop(state);
        // Wakes the writer, which now polls (or runs the write moved to the queue).
        queue.work.notify_one();
    }

    /// The line, held across a fork (the disk tier's `ForkLocked`): every write and flush
    /// takes it, and a child that inherited it held by a thread it does not have would wait
    /// forever at its first write (seen: one run in seven of the fork test). Whoever holds it
    /// waits for none of the tier's other fork-locked locks.
    pub(super) fn lock_for_fork(&self) -> impl Held + '_ {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This process's queue, and whether its thread runs; `start` starts it if not.
    fn queue(&self, start: bool) -> (Arc<Queue>, bool) {
        let mut line = self.line.lock().unwrap_or_else(PoisonError::into_inner);
        let generation = process::fork_generation();
        if line.generation != generation {
            // A forked child: see the module's comment.
            std::mem::forget(std::mem::take(&mut *line));
        }
        let mut started_now = false;
        if start && line.thread.is_none() {
            let queue = Arc::clone(&line.queue);
            let tick = self.every_few_seconds.get().cloned();
            line.thread = std::thread::Builder::new()
                .name("kcache-writer".into())
                .spawn(move || queue.run(tick))
                .ok();
            started_now = line.thread.is_some();
        }
        let queue = (Arc::clone(&line.queue), line.thread.is_some());
        // Outside the line, which a fork takes: registering may log, and a log hook may fork
        // or write.
        drop(line);
        if started_now {
            // From now on an exit has writes to finish.
            super::exit::flush_at_exit();
        }
        queue
    }

    /// Writes queued, parked or running.
    pub(super) fn pending(&self) -> u64 {
        let (queue, _) = self.queue(false);
        let state = queue.state();
        (state.jobs.len() + state.parked.len()) as u64 + u64::from(state.busy)
    }

    /// Runs every parked write, and waits until every write submitted or parked before the
    /// call has finished (with those they parked in turn).
    pub(super) fn flush(&self) {
        self.flush_until(None, true);
    }

    /// [`Writer::flush`], waiting until `deadline` at most, and leaving parked writes parked
    /// unless `parked`: whether every write (but those left parked) finished. On a writer
    /// thread it does not wait (see the module's comment) and says whether there was nothing
    /// to wait for.
    pub(super) fn flush_until(&self, deadline: Option<Instant>, parked: bool) -> bool {
        let (queue, _) = self.queue(false);
        let mut state = queue.state();
        loop {
            if parked && !state.parked.is_empty() {
                let parked = std::mem::take(&mut state.parked);
                state
                    .jobs
                    .extend(parked.into_iter().map(|p| p.run_for(Cause::Flush)));
                queue.work.notify_one();
            }
            let done = state.jobs.is_empty() && !state.busy && (!parked || state.parked.is_empty());
            if done || ON_WRITER.get() {
                return done;
            }
            // Looks again every RECHECK, and wakes the writer again when it has work: a wake-up
            // lost in a forked child then costs a delay, not a hang.
            let wait = deadline.map_or(RECHECK, |deadline| {
                RECHECK.min(deadline.saturating_duration_since(Instant::now()))
            });
            state = queue
                .idle
                .wait_timeout(state, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return false;
            }
            if !state.jobs.is_empty() {
                queue.work.notify_one();
            }
        }
    }
}

impl Queue {
    fn run(&self, tick: Option<Tick>) {
        ON_WRITER.set(true);
        let mut ticked = Instant::now();
        let mut state = self.state();
        loop {
            if let Some(tick) = tick.as_ref().filter(|_| ticked.elapsed() >= PUBLISH) {
                drop(state);
                tick();
                ticked = Instant::now();
                state = self.state();
            }
            if let Some(job) = state.jobs.pop_front() {
                state.busy = true;
                drop(state);
                // A job that panics loses its write only; the writer goes on.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                state = self.state();
                state.busy = false;
                continue;
            }
            if let Some(wanted) = state
                .parked
                .iter()
                .position(|p| p.wanted.as_ref().is_some_and(|wanted| wanted()))
            {
                let parked = state.parked.remove(wanted);
                state.jobs.push_back(parked.run_for(Cause::Wanted));
                continue;
            }
            self.idle.notify_all();
            if state.closed {
                return;
            }
            let polling = state.parked.iter().any(|p| p.wanted.is_some());
            let wait = match (polling, &tick) {
                (true, _) => Some(POLL),
                (false, Some(_)) => Some(PUBLISH.saturating_sub(ticked.elapsed())),
                (false, None) => None,
            };
            state = match wait {
                Some(wait) => {
                    self.work
                        .wait_timeout(state, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .work
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

impl Drop for Writer {
    /// Runs what is queued or parked, then stops the thread.
    fn drop(&mut self) {
        // Replaces a parent's line in a forked child. On the writer thread itself (the last
        // job can drop the last reference to the disk tier, which flushed when it was dropped,
        // so nothing else is left) it does not wait.
        self.flush();
        let line = self.line.get_mut().unwrap_or_else(PoisonError::into_inner);
        // Never started: nothing was queued or parked (both run at once without a thread).
        let Some(thread) = line.thread.take() else {
            return;
        };
        line.queue.state().closed = true;
        line.queue.work.notify_one();
        // A thread cannot join itself: it returns to a loop that now ends.
        if thread.thread().id() != std::thread::current().id() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    use super::*;

    /// A parked write whose condition turns true runs on the writer, without a flush.
    #[test]
    fn a_wanted_write_runs_without_a_flush() {
        let writer = Writer::default();
        let wanted = Arc::new(AtomicBool::new(false));
        let (sent, ran) = mpsc::channel();
        let poll = Arc::clone(&wanted);
        writer.park(
            Some(Box::new(move || poll.load(Ordering::SeqCst))),
            move |cause| sent.send(cause).unwrap(),
        );
        assert_eq!(writer.pending(), 1);
        assert!(
            ran.recv_timeout(POLL * 4).is_err(),
            "ran before it was wanted"
        );
        wanted.store(true, Ordering::SeqCst);
        assert_eq!(ran.recv().unwrap(), Cause::Wanted);
        writer.flush();
        assert_eq!(writer.pending(), 0);
    }

    /// A flush runs every parked write, and what those park in turn.
    #[test]
    fn a_flush_runs_parked_writes_and_what_they_park() {
        let writer = Arc::new(Writer::default());
        let (sent, ran) = mpsc::channel();
        let (again, inner) = (sent.clone(), Arc::clone(&writer));
        writer.park(Some(Box::new(|| false)), move |cause| {
            sent.send(("first", cause)).unwrap();
            inner.park(None, move |cause| again.send(("second", cause)).unwrap());
        });
        writer.flush();
        let ran: Vec<_> = ran.try_iter().collect();
        assert_eq!(ran, [("first", Cause::Flush), ("second", Cause::Flush)]);
        assert_eq!(writer.pending(), 0);
    }

    /// One polled write more than the bound drops the oldest one's condition (and what it
    /// holds) and runs nothing: every write waits for the flush.
    #[test]
    fn too_many_polled_writes_drop_the_oldest_condition_only() {
        let writer = Writer::default();
        let (sent, ran) = mpsc::channel();
        let held: Vec<Arc<()>> = (0..=max_polled()).map(|_| Arc::new(())).collect();
        for (i, held) in held.iter().enumerate() {
            let (sent, held) = (sent.clone(), Arc::clone(held));
            writer.park(
                Some(Box::new(move || Arc::strong_count(&held) == 0)),
                move |cause| sent.send((i, cause)).unwrap(),
            );
        }
        let still_held = |h: &Arc<()>| Arc::strong_count(h) == 2;
        assert!(!still_held(&held[0]), "the oldest condition is dropped");
        assert!(held[1..].iter().all(still_held), "the others are kept");
        assert!(
            ran.recv_timeout(POLL * 4).is_err(),
            "nothing ran before the flush"
        );
        assert_eq!(writer.pending(), held.len() as u64);
        drop(writer);
        let ran: Vec<_> = ran.try_iter().collect();
        assert_eq!(ran.len(), held.len(), "dropping runs every write");
        assert!(ran.iter().all(|&(_, cause)| cause == Cause::Flush));
    }
}
