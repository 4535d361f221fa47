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
//! every [`POLL`] while anything it can poll is parked, and at most [`MAX_POLLED`] such writes
//! are parked at once (each holds a lock file open); parking one more runs the oldest as if
//! flushed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Writes waiting at most; the next one runs on its caller.
pub const QUEUE_BOUND: usize = 64;

/// How often the writer asks whether a parked write is wanted: how late, at most, it learns.
pub const POLL: Duration = Duration::from_millis(5);

/// Parked writes with a condition to poll, at most.
pub const MAX_POLLED: usize = 32;

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
    /// The job, to run for `cause`; the condition is dropped now (it may share what the job
    /// needs to own).
    fn run_for(self, cause: Cause) -> Job {
        let job = self.job;
        Box::new(move || job(cause))
    }
}

#[derive(Default)]
pub(super) struct Writer {
    queue: Arc<Queue>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Queue {
    state: Mutex<State>,
    /// Signalled when a job is queued or the writer is closed.
    work: Condvar,
    /// Signalled when the queue has drained.
    idle: Condvar,
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
    /// Runs `job` on the writer thread, or on the caller when the queue is full or the thread
    /// cannot be started.
    pub(super) fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let mut state = self.queue.state.lock();
        if state.jobs.len() >= QUEUE_BOUND || !self.started() {
            drop(state);
            job();
            return;
        }
        state.jobs.push_back(Box::new(job));
        drop(state);
        self.queue.work.notify_one();
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
        if !self.started() {
            return (parked.job)(Cause::Flush);
        }
        let mut state = self.queue.state.lock();
        let polled = parked.wanted.is_some();
        state.parked.push(parked);
        if polled && state.parked.iter().filter(|p| p.wanted.is_some()).count() > MAX_POLLED {
            let oldest = state.parked.iter().position(|p| p.wanted.is_some());
            let oldest = state.parked.remove(oldest.expect("counted above"));
            state.jobs.push_back(oldest.run_for(Cause::Flush));
        }
        drop(state);
        // Wakes the writer, which now polls (or runs the write moved to the queue).
        self.queue.work.notify_one();
    }

    /// Whether the thread runs, starting it if not.
    fn started(&self) -> bool {
        let mut thread = self.thread.lock();
        if thread.is_none() {
            let queue = Arc::clone(&self.queue);
            *thread = std::thread::Builder::new()
                .name("kcache-writer".into())
                .spawn(move || queue.run())
                .ok();
        }
        thread.is_some()
    }

    /// Writes queued, parked or running.
    pub(super) fn pending(&self) -> u64 {
        let state = self.queue.state.lock();
        (state.jobs.len() + state.parked.len()) as u64 + u64::from(state.busy)
    }

    /// Runs every parked write, and waits until every write submitted or parked before the
    /// call has finished (with those they parked in turn).
    pub(super) fn flush(&self) {
        let mut state = self.queue.state.lock();
        loop {
            if !state.parked.is_empty() {
                let parked = std::mem::take(&mut state.parked);
                state
                    .jobs
                    .extend(parked.into_iter().map(|p| p.run_for(Cause::Flush)));
                self.queue.work.notify_one();
            }
            if state.jobs.is_empty() && !state.busy && state.parked.is_empty() {
                return;
            }
            self.queue.idle.wait(&mut state);
        }
    }
}

impl Queue {
    fn run(&self) {
        let mut state = self.state.lock();
        loop {
            if let Some(job) = state.jobs.pop_front() {
                state.busy = true;
                drop(state);
                // A job that panics loses its write only; the writer goes on.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                state = self.state.lock();
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
            if state.parked.iter().any(|p| p.wanted.is_some()) {
                self.work.wait_for(&mut state, POLL);
            } else {
                self.work.wait(&mut state);
            }
        }
    }
}

impl Drop for Writer {
    /// Runs what is queued or parked, then stops the thread.
    fn drop(&mut self) {
        // Never started: nothing was queued or parked (both run at once without a thread).
        let Some(thread) = self.thread.get_mut().take() else {
            return;
        };
        // The last job can drop the last reference to the disk tier on the writer thread
        // itself (the disk tier flushed when it was dropped, so nothing else is left): it
        // cannot wait for itself nor join itself, and returns to a loop that now ends.
        let on_writer = thread.thread().id() == std::thread::current().id();
        if !on_writer {
            self.flush();
        }
        self.queue.state.lock().closed = true;
        self.queue.work.notify_one();
        if !on_writer {
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

    /// One polled write more than the bound runs the oldest at once.
    #[test]
    fn too_many_polled_writes_run_the_oldest() {
        let writer = Writer::default();
        let (sent, ran) = mpsc::channel();
        for i in 0..=MAX_POLLED {
            let sent = sent.clone();
            writer.park(Some(Box::new(|| false)), move |cause| {
                sent.send((i, cause)).unwrap()
            });
        }
        assert_eq!(ran.recv().unwrap(), (0, Cause::Flush));
        assert!(ran.recv_timeout(POLL * 4).is_err(), "only the oldest ran");
        drop(writer);
        assert_eq!(ran.try_iter().count(), MAX_POLLED, "dropping runs the rest");
    }
}
