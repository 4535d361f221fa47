//! The log says why each miss missed: a hook collects what the tiered lookup and the disk tier
//! log while each kind of miss is made to happen, and `KCACHE_LOG` picks the level.
//!
//! The hook and the level belong to the process, so the scenarios run in order in one test;
//! the other test only starts child processes.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcache::BuildError;
use kcache::log::{self, Level};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::rerun_test;
use kcache_testkit::strings::{
    self, Cache, disk, disk_with_lock_timeout, find_or_build, l2_key, load, serialize,
};

type Messages = Arc<Mutex<Vec<(Level, String)>>>;

/// A tiered cache with an empty memory tier in front of `disk`.
fn tiered(disk: &Arc<Persistence>) -> Cache {
    strings::tiered(Some(disk.clone()))
}

/// Looks `source` up, building `compiled(source)` on a miss, and waits for the write-back.
fn lookup(cache: &Cache, source: &str) -> String {
    let value = find_or_build(
        cache,
        source,
        || Ok((format!("compiled({source})"), 1)),
        serialize,
    )
    .unwrap()
    .value()
    .clone();
    cache.flush();
    value
}

fn entry_path(disk: &Persistence, source: &str) -> PathBuf {
    disk.entry_path(&l2_key(source))
}

fn entry_name(disk: &Persistence, source: &str) -> String {
    let path = entry_path(disk, source);
    path.file_name().unwrap().to_str().unwrap().to_owned()
}

/// The messages logged since the last call.
fn take(messages: &Messages) -> Vec<(Level, String)> {
    std::mem::take(&mut *messages.lock().unwrap())
}

/// Asserts that exactly `expected` was logged since the last [`take`].
#[track_caller]
fn assert_logged(messages: &Messages, expected: &[(Level, String)]) {
    assert_eq!(take(messages), expected);
}

fn debug(text: String) -> (Level, String) {
    (Level::Debug, text)
}

fn info(text: String) -> (Level, String) {
    (Level::Info, text)
}

/// What a lookup that finds no entry `name` logs.
fn absent(name: &str) -> (Level, String) {
    debug(format!("disk miss: {name}: absent"))
}

/// What a lookup that finds the entry `name` and refuses it for `reason` logs.
fn rejected(name: &str, reason: &str) -> (Level, String) {
    debug(format!(
        "disk miss: integrity check failed: {name}: {reason}"
    ))
}

/// Holds the lock file of `source`'s entry as another process building it would.
fn hold_lock(disk: &Persistence, source: &str) -> File {
    let entry = entry_path(disk, source);
    let name = format!(".{}.lock", entry.file_name().unwrap().to_str().unwrap());
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(entry.with_file_name(name))
        .unwrap();
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).unwrap();
    file
}

/// Releases `lock` after a while, on another thread, after `before_release` has run.
fn release_later(
    mut lock: File,
    before_release: impl FnOnce(&mut File) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        before_release(&mut lock);
    })
}

#[test]
fn each_miss_says_where_and_why() {
    let messages: Messages = Arc::default();
    let sink = messages.clone();
    log::set_hook(move |level, message| sink.lock().unwrap().push((level, message.to_owned())));
    log::set_level(Level::Debug);
    assert_eq!(log::level(), Level::Debug);

    let tmp = tempfile::tempdir().unwrap();
    let disk = disk(tmp.path());

    // Absent: nothing on disk, so the value is built and written.
    let cache = tiered(&disk);
    assert_eq!(lookup(&cache, "a"), "compiled(a)");
    let a = entry_name(&disk, "a");
    assert_logged(&messages, &[absent(&a)]);

    // Hits say nothing, at any level: from memory, then from disk.
    assert_eq!(lookup(&cache, "a"), "compiled(a)");
    assert_eq!(lookup(&tiered(&disk), "a"), "compiled(a)");
    assert_eq!(disk.stats().hits, 1);
    assert_logged(&messages, &[]);

    // Integrity reject: one flipped byte fails the tag.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(entry_path(&disk, "a"))
        .unwrap();
    let last = file.seek(SeekFrom::End(-1)).unwrap();
    let byte = std::fs::read(entry_path(&disk, "a")).unwrap()[last as usize];
    file.write_all(&[!byte]).unwrap();
    drop(file);
    assert_eq!(lookup(&tiered(&disk), "a"), "compiled(a)");
    assert_logged(&messages, &[rejected(&a, "tag mismatch")]);

    // Stored key differs: a genuine entry under another entry's name.
    let cache = tiered(&disk);
    lookup(&cache, "b");
    lookup(&cache, "c");
    take(&messages);
    std::fs::copy(entry_path(&disk, "b"), entry_path(&disk, "c")).unwrap();
    assert_eq!(lookup(&tiered(&disk), "c"), "compiled(c)");
    let c = entry_name(&disk, "c");
    let differs = "stored key differs from the requested key";
    assert_logged(&messages, &[rejected(&c, differs)]);

    // Refused by the runtime: the entry verifies, `load` does not take it.
    disk.put(&l2_key("d"), &[0xff, 0xfe], Duration::ZERO)
        .unwrap();
    assert_eq!(lookup(&tiered(&disk), "d"), "compiled(d)");
    let d = entry_name(&disk, "d");
    let refused = format!(
        "disk miss: {d}: the runtime refused the stored value (code 1): not UTF-8; removed"
    );
    assert_logged(&messages, &[debug(refused)]);
    assert_eq!(disk.stats().load_failures, 1);

    // A failed build, at info, with the first line of its error only.
    let failed = tiered(&disk).find_or_build(
        b"e".as_slice(),
        None,
        || Ok(l2_key("e")),
        load,
        || Err(BuildError::new(7, "error: line one\nline two")),
        serialize,
    );
    assert!(failed.is_err());
    let e = entry_name(&disk, "e");
    let failure = info(format!("{e}: build failed with code 7: error: line one"));
    assert_logged(&messages, &[absent(&e), failure]);

    // A value that cannot be serialized is not written, at info.
    let cache = tiered(&disk);
    cache
        .find_or_build(
            b"f".as_slice(),
            None,
            || Ok(l2_key("f")),
            load,
            || Ok(("f".to_owned(), 1)),
            |_| Err(BuildError::new(0, "no bytes")),
        )
        .unwrap();
    cache.flush();
    let f = entry_name(&disk, "f");
    let skipped = format!("disk write of {f} skipped: the value could not be serialized: no bytes");
    assert_logged(&messages, &[absent(&f), info(skipped)]);

    // Lock timeout: another process holds the entry's lock for longer than the wait; given up
    // on, at warn, once per process.
    let impatient = disk_with_lock_timeout(tmp.path(), Some(Duration::from_millis(50)));
    let held = hold_lock(&impatient, "g");
    assert_eq!(lookup(&tiered(&impatient), "g"), "compiled(g)");
    drop(held);
    let g = entry_name(&disk, "g");
    assert_logged(
        &messages,
        &[
            absent(&g),
            (
                Level::Warn,
                format!(
                    "{}: waited the lock timeout (50ms) for a process building an entry: \
                     building here, and not waiting for that process's other entries",
                    tmp.path().display()
                ),
            ),
            debug(format!(
                "disk lock: {g}: timed out after 50ms waiting for another process: building \
                 here too"
            )),
        ],
    );

    // The process building it fails (it marks its lock file) or dies (it just lets go; taking
    // over from it is warned about).
    let patient = disk_with_lock_timeout(tmp.path(), Some(Duration::from_secs(30)));
    let marker = release_later(hold_lock(&patient, "h"), |lock| {
        lock.write_all(b"F").unwrap()
    });
    assert_eq!(lookup(&tiered(&patient), "h"), "compiled(h)");
    marker.join().unwrap();
    let dying = release_later(hold_lock(&patient, "i"), |_| {});
    assert_eq!(lookup(&tiered(&patient), "i"), "compiled(i)");
    dying.join().unwrap();
    let (h, i) = (entry_name(&disk, "h"), entry_name(&disk, "i"));
    let logged = take(&messages);
    assert_eq!(logged.len(), 5, "{logged:?}");
    assert_eq!(logged[0], absent(&h));
    let failed = format!("disk lock: {h}: the process building it failed after ");
    assert!(logged[1].1.starts_with(&failed), "{logged:?}");
    assert!(logged[1].1.ends_with(": building here"), "{logged:?}");
    assert_eq!(logged[2], absent(&i));
    let died = format!(
        "{}: a process died while it built an entry: taking its build over",
        tmp.path().display()
    );
    assert_eq!(logged[3], (Level::Warn, died));
    assert_eq!(
        logged[4],
        debug(format!(
            "disk lock: {i}: the process building it died: taking over its build"
        ))
    );

    // Tier off: a directory others may write to, warned about once and said why at debug.
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(Persistence::open(PersistenceConfig::in_dir(&shared)).is_err());
    let logged = take(&messages);
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert_eq!(logged[0].0, Level::Warn);
    assert!(
        logged[0].1.starts_with("disk tier disabled: "),
        "{logged:?}"
    );
    assert!(
        logged[0].1.contains("writable by group or others"),
        "{logged:?}"
    );
    assert_eq!(logged[1].0, Level::Debug);
    assert!(
        logged[1].1.starts_with("disk tier off: untrusted: "),
        "{logged:?}"
    );
    // The warning once per process; the reason each time.
    assert!(Persistence::open(PersistenceConfig::in_dir(&shared)).is_err());
    let logged = take(&messages);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0].1.starts_with("disk tier off: untrusted: "));

    // At warn, misses say nothing (and their text is not even made).
    log::set_level(Level::Warn);
    assert_eq!(lookup(&tiered(&disk), "j"), "compiled(j)");
    assert_logged(&messages, &[]);

    // A hook that panics loses its message, not the lookup.
    log::set_level(Level::Debug);
    log::set_hook(|_, _| panic!("a broken hook"));
    assert_eq!(lookup(&tiered(&disk), "k"), "compiled(k)");
    log::reset_hook();
    assert_logged(&messages, &[]);
}

/// Runs inside a child process only (with `KCACHE_LOG_TEST_DIR` set): one miss, one hit.
#[test]
fn child_role() {
    let Ok(dir) = std::env::var("KCACHE_LOG_TEST_DIR") else {
        return;
    };
    let disk = disk(Path::new(&dir));
    let cache = tiered(&disk);
    lookup(&cache, "env");
    lookup(&cache, "env");
    std::process::exit(0);
}

/// The stderr of a child that missed and hit once with `KCACHE_LOG` set to `value`.
fn stderr_with(value: &str) -> (String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let output = rerun_test("child_role")
        .env("KCACHE_LOG_TEST_DIR", tmp.path())
        .env("KCACHE_LOG", value)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let disk = disk(tmp.path());
    (
        String::from_utf8_lossy(&output.stderr).into_owned(),
        entry_name(&disk, "env"),
    )
}

#[test]
fn kcache_log_picks_the_level_written_to_stderr() {
    let (stderr, name) = stderr_with("debug");
    assert!(
        stderr.contains(&format!("kcache: debug: disk miss: {name}: absent\n")),
        "{stderr}"
    );
    assert_eq!(stderr.matches("kcache: ").count(), 1, "{stderr}");

    let (stderr, _) = stderr_with("WARN");
    assert!(!stderr.contains("kcache: "), "{stderr}");

    let (stderr, _) = stderr_with("chatty");
    let warning = "kcache: KCACHE_LOG=\"chatty\" is not error, warn, info or debug: warn is used\n";
    assert_eq!(stderr.matches("kcache: ").count(), 1, "{stderr}");
    assert!(stderr.contains(warning), "{stderr}");
}
