//! Worker processes for tests of what several processes sharing a directory do: the test
//! executable run again as one worker test ([`crate::rerun_test`]) given its job as one value,
//! its standard output read line by line as it goes, its standard error kept in a file, and
//! what `/proc` says about it.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::rerun_test;

/// The variable that carries a worker's job, as JSON.
const JOB_ENV: &str = "KCACHE_TEST_WORKER_JOB";

/// The test `test` of this executable run again as a worker, given `job` ([`worker_job`] reads
/// it back there): one value rather than a variable for each setting.
pub fn worker_command(test: &str, job: &impl Serialize) -> Command {
    let mut command = rerun_test(test);
    command.env(JOB_ENV, serde_json::to_string(job).unwrap());
    command
}

/// The job this process was given as a worker ([`worker_command`]); `None` in the normal test
/// run.
pub fn worker_job<T: DeserializeOwned>() -> Option<T> {
    let json = std::env::var(JOB_ENV).ok()?;
    Some(serde_json::from_str(&json).unwrap())
}

/// A running worker. Dropping it kills and reaps it, so that a test that fails leaves no worker
/// behind, stopped or waiting.
pub struct Worker {
    pub child: Child,
    stdout: BufReader<ChildStdout>,
    stderr: PathBuf,
}

impl Worker {
    /// Starts `command` with its standard output piped to the test and its standard error in
    /// a new file in `logs`.
    pub fn spawn(mut command: Command, logs: &Path) -> Worker {
        let (stderr_file, stderr) = tempfile::Builder::new()
            .prefix("worker-")
            .suffix(".err")
            .tempfile_in(logs)
            .unwrap()
            .keep()
            .unwrap();
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(stderr_file)
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Worker {
            child,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }

    /// What the worker wrote to its standard error so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Reads the worker's output up to the first line that contains `said` (libtest may print
    /// before it on the same line) and returns the rest of that line, trimmed.
    pub fn wait_for(&mut self, said: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "worker exited before it said {said}: {}",
                self.stderr()
            );
            if let Some(at) = line.find(said) {
                return line[at + said.len()..].trim().to_owned();
            }
        }
    }

    /// Waits for the worker to exit, for `watchdog` at most (then kills it and panics),
    /// checks that it succeeded, and returns the rest of its standard output and all of its
    /// standard error.
    pub fn finish_output(mut self, watchdog: Duration) -> (String, String) {
        let deadline = Instant::now() + watchdog;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "worker still running after {watchdog:?}: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut out = String::new();
        self.stdout.read_to_string(&mut out).unwrap();
        assert!(
            status.success(),
            "worker failed ({status}): {out}\n{}",
            self.stderr()
        );
        (out, self.stderr())
    }

    pub fn signal(&self, signal: Signal) {
        rustix::process::kill_process(self.pid(), signal).unwrap();
    }

    /// Kills it and reaps it.
    pub fn kill(mut self) {
        self.signal(Signal::KILL);
        self.child.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The processes that took an `flock` held on the inode `ino`, as `/proc/locks` says (which
/// names the process that took a lock, not those that keep it now). Read rather than probed
/// with a lock of one's own: a probe that won the lock for an instant would change what is
/// watched.
pub fn flock_takers(ino: u64) -> Vec<String> {
    let locks = std::fs::read_to_string("/proc/locks").unwrap();
    locks
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let at = fields.iter().position(|&f| f == "FLOCK")?;
            // FLOCK ADVISORY WRITE <pid> <major:minor:inode> …
            let inode = fields.get(at + 4)?.rsplit(':').next()?;
            (inode == ino.to_string()).then(|| fields.get(at + 3).map(|pid| pid.to_string()))?
        })
        .collect()
}

/// Whether a thread of process `pid` sleeps (`/proc/<pid>/task/*/wchan`): in a worker that has
/// a lock file open, only the lock's poll sleeps, and only after an attempt that failed.
pub fn sleeps(pid: Pid) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", pid.as_raw_nonzero())) else {
        return false;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("wchan")).ok())
        .any(|wchan| wchan.contains("nanosleep"))
}
