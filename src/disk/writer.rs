//! The background writer: a built value's bytes are made and written after its caller has it.
//!
//! Serializing (asking a driver for a program's binary can compile, on PoCL for hundreds of
//! milliseconds) and writing (fsyncs) are the two costs of a miss that no caller needs to wait
//! for. One thread per disk tier, started on the first write, runs them in order from a
//! bounded queue; a full queue runs the write on the caller instead, so memory stays bounded
//! and nothing is dropped. [`Writer::flush`] waits for the queue to drain; the disk tier
//! flushes when it is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

/// Writes waiting at most; the next one runs on its caller.
pub const QUEUE_BOUND: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

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

    /// Writes queued or running.
    pub(super) fn pending(&self) -> u64 {
        let state = self.queue.state.lock();
        state.jobs.len() as u64 + u64::from(state.busy)
    }

    /// Waits until every write submitted before the call has finished.
    pub(super) fn flush(&self) {
        let mut state = self.queue.state.lock();
        while !state.jobs.is_empty() || state.busy {
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
            self.idle.notify_all();
            if state.closed {
                return;
            }
            self.work.wait(&mut state);
        }
    }
}

impl Drop for Writer {
    /// Runs what is queued, then stops the thread.
    fn drop(&mut self) {
        self.queue.state.lock().closed = true;
        self.queue.work.notify_one();
        if let Some(thread) = self.thread.get_mut().take() {
            // The last job can drop the last reference to the disk tier on the writer thread
            // itself; it cannot join itself, and returns to a loop that now ends.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}
