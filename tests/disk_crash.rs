//! Crashes, concurrent processes and a full disk. Each scenario runs writers in child
//! processes: this test binary re-executed with `KCACHE_TEST_ROLE` set.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kcache::Error;
use kcache::disk::Durability;
use kcache::key::{Key, KeyBuilder};
use kcache::{Persistence, PersistenceConfig};

const KEYS: u64 = 8;

fn key(i: u64) -> Key {
    KeyBuilder::new()
        .backend("crash-test")
        .entry(i.to_string())
        .finish()
        .unwrap()
}

/// A payload that says which key and which write it belongs to and can be checked whole:
/// a torn or mixed entry cannot pass `check_payload`.
fn payload(key: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(16 + len);
    p.extend_from_slice(&key.to_le_bytes());
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend((0..len).map(|j| (key as usize * 31 + seq as usize * 7 + j) as u8));
    p
}

fn check_payload(key: u64, bytes: &[u8]) -> bool {
    if bytes.len() < 16 || bytes[..8] != key.to_le_bytes() {
        return false;
    }
    let seq = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    bytes == payload(key, seq, bytes.len() - 16)
}

struct Rng(u64);

impl Rng {
    fn seeded(extra: u64) -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng(t ^ (u64::from(std::process::id()) << 32) ^ extra | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn open(dir: &Path, durability: Durability) -> Persistence {
    let mut config = PersistenceConfig::in_dir(dir);
    config.durability = durability;
    Persistence::open(config).unwrap()
}

fn child_command(role: &str, dir: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env("KCACHE_TEST_ROLE", role)
        .env("KCACHE_TEST_DIR", dir);
    cmd
}

fn temp_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with('.') && name.ends_with(".tmp")
        })
        .count()
}

/// Runs inside a child process only; a no-op in the normal test run.
#[test]
fn child_role() {
    let Ok(role) = std::env::var("KCACHE_TEST_ROLE") else {
        return;
    };
    let dir = PathBuf::from(std::env::var_os("KCACHE_TEST_DIR").unwrap());
    let code = match role.as_str() {
        "writer" => writer(&dir),
        "hammer" => hammer(&dir),
        "full-disk" => full_disk(&dir),
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

/// Writes until killed. Alternates durability so both write paths get interrupted.
fn writer(dir: &Path) -> i32 {
    let mut rng = Rng::seeded(0);
    let durability = if rng.next() & 1 == 0 {
        Durability::Sync
    } else {
        Durability::Relaxed
    };
    let disk = open(dir, durability);
    let mut seq = 0;
    loop {
        let k = rng.next() % KEYS;
        let len = (rng.next() % (256 * 1024)) as usize;
        disk.put(&key(k), &payload(k, seq, len), Duration::ZERO)
            .unwrap();
        if seq == 0 {
            println!("ready");
        }
        seq += 1;
    }
}

#[test]
fn killed_writers_leave_only_whole_entries_and_temp_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let mut rng = Rng::seeded(1);
    for _ in 0..200 {
        let mut child = child_command("writer", &dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // The test harness prints its own lines first; wait for the writer's.
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("ready") {
            line.clear();
            assert_ne!(reader.read_line(&mut line).unwrap(), 0, "writer exited");
        }
        std::thread::sleep(Duration::from_micros(rng.next() % 4000));
        child.kill().unwrap();
        child.wait().unwrap();
        drop(reader);
    }
    let disk = open(&dir, Durability::Sync);
    let mut present = 0;
    for k in 0..KEYS {
        if disk.entry_path(&key(k)).exists() {
            present += 1;
            let entry = disk
                .get(&key(k))
                .unwrap()
                .expect("an entry file that does not read");
            assert!(check_payload(k, entry.payload()), "key {k}: wrong payload");
        }
    }
    assert!(present > 0);
    let s = disk.stats();
    assert_eq!((s.hits, s.integrity_rejects, s.io_errors), (present, 0, 0));

    let leftovers = temp_files(&dir) as u64;
    // Fresh leftovers are kept by default: they could belong to a live writer.
    assert_eq!(
        disk.gc(&[], kcache::disk::DEFAULT_TEMP_MAX_AGE)
            .unwrap()
            .temp_files,
        0
    );
    let report = disk.gc(&[], Duration::ZERO).unwrap();
    assert_eq!(report.temp_files, leftovers);
    assert_eq!(report.kept, present);
    assert_eq!(
        report.corrupt + report.stale_schema + report.stale_fingerprint,
        0
    );
    assert_eq!(temp_files(&dir), 0);
}

/// 1000 operations on overlapping keys, half puts, half verified gets.
fn hammer(dir: &Path) -> i32 {
    let id: u64 = std::env::var("KCACHE_TEST_ID").unwrap().parse().unwrap();
    let disk = open(dir, Durability::Relaxed);
    let mut rng = Rng::seeded(id);
    for i in 0..1000 {
        let k = rng.next() % KEYS;
        if rng.next() & 1 == 0 {
            let len = (rng.next() % 8192) as usize;
            disk.put(&key(k), &payload(k, id * 10_000 + i, len), Duration::ZERO)
                .unwrap();
        } else if let Some(entry) = disk.get(&key(k)).unwrap()
            && !check_payload(k, entry.payload())
        {
            return 3;
        }
    }
    let s = disk.stats();
    println!(
        "hits={} rejects={} io={}",
        s.hits, s.integrity_rejects, s.io_errors
    );
    if s.integrity_rejects != 0 || s.io_errors != 0 {
        return 4;
    }
    0
}

#[test]
fn four_processes_never_read_a_torn_or_wrong_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    open(&dir, Durability::Relaxed);
    let children: Vec<_> = (0..4)
        .map(|id| {
            child_command("hammer", &dir)
                .env("KCACHE_TEST_ID", id.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut hits = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{:?}: {text}", out.status);
        let at = text.find("hits=").unwrap();
        hits += text[at + "hits=".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    assert!(hits > 0);
    assert_eq!(temp_files(&dir), 0);
}

/// Runs with `RLIMIT_FSIZE` below the size of the large entry and `SIGXFSZ` ignored, so the
/// write fails with `EFBIG` like a full file system.
fn full_disk(dir: &Path) -> i32 {
    let disk = open(dir, Durability::Sync);
    let small = payload(1, 1, 1024);
    disk.put(&key(1), &small, Duration::ZERO).unwrap();
    let big = payload(2, 1, 1 << 20);
    match disk.put(&key(2), &big, Duration::ZERO) {
        Err(Error::Io(message)) => println!("put failed: {message}"),
        other => {
            println!("unexpected: {other:?}");
            return 5;
        }
    }
    if disk.entry_path(&key(2)).exists() || temp_files(dir) != 0 {
        return 6;
    }
    match disk.get(&key(1)) {
        Ok(Some(entry)) if entry.payload() == small.as_slice() => {}
        other => {
            println!("small entry lost: {other:?}");
            return 7;
        }
    }
    if disk.stats().io_errors != 1 {
        return 8;
    }
    0
}

#[test]
fn full_disk_put_fails_with_io_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let exe = std::env::current_exe().unwrap();
    // `ulimit -f 256` is 128 or 256 KiB depending on the shell: below the 1 MiB entry either way.
    let out = Command::new("sh")
        .args([
            "-c",
            "trap '' XFSZ; ulimit -f 256 && exec \"$0\" --exact child_role --nocapture --test-threads=1",
        ])
        .arg(&exe)
        .env("KCACHE_TEST_ROLE", "full-disk")
        .env("KCACHE_TEST_DIR", &dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {text}", out.status);
    assert!(text.contains("put failed"), "{text}");
    // The parent, without the limit, sees the small entry and nothing else.
    let disk = open(&dir, Durability::Sync);
    assert!(disk.get(&key(1)).unwrap().is_some());
    assert_eq!(disk.get(&key(2)).unwrap(), None);
    assert_eq!(temp_files(&dir), 0);
}
