//! The remote tier between processes, configured through the environment alone (no code
//! change): OpenCL programs on PoCL, one `redis-server` on loopback, each process with a disk
//! directory of its own. The second process loads what the first built without compiling; an
//! entry changed in the store is rejected and rebuilt, with correct output; a read-only
//! process writes no key; a remote setting kcache cannot use leaves the remote off and the
//! lookup working; a process that holds an entry's lease holds PoCL's binary back as it would
//! without the remote tier (one compile, written at its flush) unless another node waits, which
//! then gets the entry before that flush.
//!
//! Each process is this test binary run again with [`WORKER_ENV`] set (see
//! [`remote_worker`]); it prints one line of counters.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use kcache::backend::opencl::{OpenClCache, OpenClOptions};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::{Context, KernelArg, run_kernel};
use kcache_testkit::prometheus::Parser;
use kcache_testkit::redis::RedisServer;
use kcache_testkit::{successful_stdout, write_key_file};
use tempfile::TempDir;

const WORKER_ENV: &str = "KCACHE_REMOTE_WORKER";
/// A file to wait for before the lookup, so that several workers miss at the same moment.
const GO_ENV: &str = "KCACHE_REMOTE_GO";
/// A file to wait for after the launch and before the flush (saying `launched` first).
const HOLD_ENV: &str = "KCACHE_REMOTE_HOLD";
const ITEMS: usize = 64;

const SOURCE: &str = "__kernel void twice_plus(__global float *y) {\n  uint i = get_global_id(0);\n  y[i] = 2.0f * y[i] + (float)(i ^ 5u);\n}\n";

/// The counters of a node that compiled the program and wrote it to the remote tier.
const COMPILED_AND_SHARED: &str = "remote=on builds=1 loads=0 hits=0 rejects=0 puts=1 correct=1";
/// The counters of a node that loaded the binary from the remote tier, compiling nothing.
const LOADED_FROM_REMOTE: &str = "remote=on builds=0 loads=1 hits=1 rejects=0 puts=0 correct=1";

/// Runs inside a child process only; a no-op in the normal test run.
#[test]
fn remote_worker() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    let disk = Arc::new(Persistence::open(PersistenceConfig::from_env()).unwrap());
    // A worker process: its test checked that there is a device.
    let context = Context::first_device().unwrap();
    let cache = OpenClCache::new(OpenClOptions {
        persistence: Some(disk.clone()),
        ..OpenClOptions::default()
    })
    .unwrap();
    if let Some(go) = std::env::var_os(GO_ENV) {
        while !Path::new(&go).exists() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let program = cache
        .find_or_build(context.context(), context.device(), &[SOURCE], "")
        .unwrap();
    let mut y: Vec<f32> = (0..ITEMS).map(|i| i as f32).collect();
    run_kernel(
        &context,
        program.value(),
        "twice_plus",
        &mut [KernelArg::Floats(&mut y)],
        ITEMS,
    )
    .unwrap();
    let correct = (0..ITEMS).all(|i| y[i] == 2.0 * i as f32 + (i ^ 5) as f32);
    drop(program);
    if let Some(hold) = std::env::var_os(HOLD_ENV) {
        println!("launched");
        while !Path::new(&hold).exists() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    cache.flush();
    let stats = cache.stats();
    let line = match disk.remote_stats() {
        Some(r) => {
            // The process's metrics say the same as its counters.
            let parser = Parser::for_test().expect("its test checked");
            let metrics = parser.parse(&kcache::metrics::render());
            let metric = |series: &str| metrics.value(series) as u64;
            assert_eq!(metric("kcache_remote_tiers{}"), 1);
            assert_eq!(
                metric("kcache_lookups_total{result=\"hit\",tier=\"remote\"}"),
                r.hits
            );
            assert_eq!(metric("kcache_remote_rejects_total{}"), r.rejects);
            assert_eq!(metric("kcache_remote_writes_total{}"), r.puts);
            format!(
                "remote=on builds={} loads={} hits={} rejects={} puts={} correct={}",
                stats.source_builds,
                stats.binary_loads,
                r.hits,
                r.rejects,
                r.puts,
                u8::from(correct)
            )
        }
        None => format!(
            "remote=off builds={} loads={} correct={}",
            stats.source_builds,
            stats.binary_loads,
            u8::from(correct)
        ),
    };
    println!("{line}");
    std::process::exit(0);
}

/// A private directory with an operator key file in it.
struct Setup {
    tmp: TempDir,
    key_file: PathBuf,
}

impl Setup {
    /// A Redis server and a fresh setup beside it; `None` when `redis-server` is not
    /// installed, or the workers would lack an OpenCL device or the Prometheus parser (the test
    /// skipped).
    fn with_server() -> Option<(RedisServer, Setup)> {
        Context::for_test()?;
        Parser::for_test()?;
        Some((RedisServer::start()?, Setup::new()))
    }

    fn new() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let key_file = tmp.path().join("operator.key");
        write_key_file(&key_file, &[42u8; 32]);
        Setup { tmp, key_file }
    }

    /// Runs a worker on a disk directory of its own, with `env` on top of the remote tier's
    /// variables, and returns its counters line.
    fn run(&self, server: &RedisServer, node: &str, env: &[(&str, &str)]) -> String {
        let out = successful_stdout(node, &mut self.worker(server, node, env));
        counters(node, &out)
    }

    /// The command of a worker on a disk directory of its own.
    fn worker(&self, server: &RedisServer, node: &str, env: &[(&str, &str)]) -> Command {
        let dir = self.tmp.path().join(node);
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "remote_worker",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ]);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("KCACHE_") {
                cmd.env_remove(name);
            }
        }
        cmd.env(WORKER_ENV, "1")
            .env("KCACHE_DIR", &dir)
            .env("KCACHE_KEY_FILE", &self.key_file)
            .env("KCACHE_REMOTE_URL", server.url())
            // PoCL's own kernel cache, per process, so that a compile is a compile.
            .env("POCL_CACHE_DIR", pocl_cache(&dir));
        for (name, value) in env {
            cmd.env(name, value);
        }
        cmd
    }
}

/// The counters line of a worker's output, after the test harness's "test remote_worker ... ".
fn counters(node: &str, out: &str) -> String {
    let at = out
        .find("remote=")
        .unwrap_or_else(|| panic!("{node} printed no counters:\n{out}"));
    out[at..].lines().next().unwrap().to_owned()
}

fn pocl_cache(dir: &Path) -> PathBuf {
    let cache = dir.with_extension("pocl");
    std::fs::create_dir_all(&cache).unwrap();
    cache
}

#[test]
fn processes_share_programs_through_redis_and_refuse_changed_ones() {
    let Some((server, setup)) = Setup::with_server() else {
        return;
    };

    let reader = setup.run(&server, "reader", &[("KCACHE_REMOTE_READ_ONLY", "1")]);
    assert_eq!(
        reader,
        "remote=on builds=1 loads=0 hits=0 rejects=0 puts=0 correct=1"
    );
    assert!(server.keys().is_empty(), "{:?}", server.keys());

    let first = setup.run(&server, "first", &[]);
    assert_eq!(first, COMPILED_AND_SHARED);
    let keys = server.keys();
    assert_eq!(keys.len(), 1);

    let second = setup.run(&server, "second", &[]);
    assert_eq!(second, LOADED_FROM_REMOTE);

    let mut entry = server.get(&keys[0]);
    let middle = entry.len() / 2;
    entry[middle] ^= 0x40;
    server.set(&keys[0], &entry);
    let third = setup.run(&server, "third", &[]);
    assert_eq!(
        third,
        "remote=on builds=1 loads=0 hits=0 rejects=1 puts=1 correct=1"
    );
    // The third process's rebuild replaced the changed entry.
    assert_ne!(server.get(&keys[0]), entry);

    // A duration that is not a number is warned about and replaced by its default: the remote
    // tier stays on and serves the entry the third process wrote.
    let bad = setup.run(&server, "bad", &[("KCACHE_REMOTE_TIMEOUT_MS", "soon")]);
    assert_eq!(bad, LOADED_FROM_REMOTE);
}

#[test]
fn four_processes_cold_starting_one_program_compile_it_once() {
    let Some((server, setup)) = Setup::with_server() else {
        return;
    };
    let go = setup.tmp.path().join("go");
    let go_env = go.to_str().unwrap();
    let workers: Vec<_> = (0..4)
        .map(|n| {
            setup
                .worker(&server, &format!("node{n}"), &[(GO_ENV, go_env)])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::write(&go, b"").unwrap();
    let lines: Vec<String> = workers
        .into_iter()
        .enumerate()
        .map(|(n, w)| {
            let out = w.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "node{n}: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            counters(&format!("node{n}"), &stdout)
        })
        .collect();
    let count = |word: &str| lines.iter().filter(|l| l.contains(word)).count();
    // The leader compiles the program, and a sibling for the nodes that wait (PoCL).
    assert_eq!(count("builds=2"), 1, "{lines:#?}");
    assert_eq!(count("builds=0 loads=1 hits=1"), 3, "{lines:#?}");
    assert_eq!(count("correct=1"), 4, "{lines:#?}");
    assert_eq!(server.keys().len(), 1, "{:?}", server.keys());
}

/// A lone node that holds an entry's lease does what it does without the remote tier: it
/// compiles once (no sibling for nodes that might wait) and writes the binary at its flush,
/// from where the next node loads it without compiling.
#[test]
fn a_lone_lease_holder_compiles_once_and_writes_at_its_flush() {
    let Some((server, setup)) = Setup::with_server() else {
        return;
    };
    let alone = setup.run(&server, "alone", &[]);
    assert_eq!(alone, COMPILED_AND_SHARED);
    let other = setup.run(&server, "other", &[]);
    assert_eq!(other, LOADED_FROM_REMOTE);
}

/// PoCL's binaries are held back until a process or a node wants them, or the cache is
/// flushed: a node that waits on the lease marks it, and the holder, still running and
/// unflushed, builds a sibling and writes its binary for it; the node loads it without
/// compiling.
#[test]
fn a_waiting_node_gets_the_entry_before_the_holders_flush() {
    let Some((server, setup)) = Setup::with_server() else {
        return;
    };
    let hold = setup.tmp.path().join("hold");
    let mut holder = KillOnDrop(
        setup
            .worker(&server, "holder", &[(HOLD_ENV, hold.to_str().unwrap())])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(holder.0.stdout.take().unwrap());
    let mut line = String::new();
    while !line.trim_end().ends_with("launched") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the holder ended early"
        );
    }
    let other = setup.run(&server, "other", &[]);
    assert_eq!(other, LOADED_FROM_REMOTE);
    std::fs::write(&hold, b"").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(holder.0.wait().unwrap().success());
    // Its program and the sibling built for the waiting node.
    assert!(
        counters("holder", &rest).starts_with("remote=on builds=2 loads=0 hits=0 rejects=0"),
        "{rest}"
    );
}

/// A worker that a failed assertion leaves behind is killed, not left waiting for its file.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
