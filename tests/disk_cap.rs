//! Size cap with least-recently-read eviction, key rotation and `gc`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kcache::disk::{Durability, OperatorKey};
use kcache::key::{KEY_SCHEMA_VERSION, Key, KeyBuilder};
use kcache::{Persistence, PersistenceConfig};

fn key(name: &str) -> Key {
    KeyBuilder::new()
        .backend("cap")
        .entry(name)
        .finish()
        .unwrap()
}

/// A directory for a disk tier, not yet created, inside a temporary directory that lasts as long
/// as the first value.
fn cache_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    (tmp, dir)
}

fn config(dir: &Path) -> PersistenceConfig {
    let mut config = PersistenceConfig::in_dir(dir);
    config.durability = Durability::Relaxed;
    config
}

/// A disk tier in `dir` capped at `max_size` bytes.
fn open_capped(dir: &Path, max_size: u64) -> Persistence {
    Persistence::open(PersistenceConfig {
        max_size: Some(max_size),
        ..config(dir)
    })
    .unwrap()
}

/// Runs `work(t)` for each `t` in `0..threads`, each on its own thread, and waits for them all.
fn on_threads(threads: usize, work: impl Fn(usize) + Sync) {
    std::thread::scope(|s| {
        for t in 0..threads {
            let work = &work;
            s.spawn(move || work(t));
        }
    });
}

/// An uncapped disk tier in `dir` holding entries "0", "1", … of `ENTRY` bytes each (1000 on
/// disk).
fn filled(dir: &Path, count: usize) -> Persistence {
    let disk = Persistence::open(config(dir)).unwrap();
    for i in 0..count {
        disk.put(&key(&i.to_string()), &[0u8; ENTRY], Duration::ZERO)
            .unwrap();
    }
    disk
}

/// Total size of the entry files in the directory, from a listing.
fn entry_bytes(dir: &Path) -> u64 {
    listing(dir).1
}

fn age(path: &Path, by: Duration) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - by).unwrap();
}

/// Bytes `put` adds to a payload: header with the default descriptor, and tag.
const OVERHEAD: usize = 118;
const ENTRY: usize = 1000 - OVERHEAD; // 1000 bytes on disk

#[test]
fn total_stays_under_the_cap_plus_one_entry() {
    let (_tmp, dir) = cache_dir();
    let disk = open_capped(&dir, 10_000);
    assert_eq!(disk.usage().bytes, 0);
    let mut largest = 0;
    for i in 0..60 {
        let len = 200 + (i * 137) % 1500;
        largest = largest.max((len + OVERHEAD) as u64);
        disk.put(&key(&i.to_string()), &vec![i as u8; len], Duration::ZERO)
            .unwrap();
        let on_disk = entry_bytes(&dir);
        assert!(on_disk <= 10_000 + largest, "after put {i}: {on_disk}");
        assert_eq!(disk.usage().bytes, on_disk);
    }
    assert!(disk.stats().evictions > 0);
    assert_eq!(disk.stats().evictions + disk.usage().entries, 60);
}

#[test]
fn least_recently_read_entry_goes_first() {
    let (_tmp, dir) = cache_dir();
    let capped = || PersistenceConfig {
        max_size: Some(4_500),
        ..config(&dir)
    };
    let disk = Persistence::open(capped()).unwrap();
    disk.usage();
    for name in ["a", "b", "c", "d"] {
        disk.put(&key(name), &[1u8; ENTRY], Duration::ZERO).unwrap();
    }
    // An hour ago, oldest first: reads refresh recency only for entries not read lately.
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        age(
            &disk.entry_path(&key(name)),
            Duration::from_secs(3600 - i as u64),
        );
    }
    assert!(disk.get(&key("a")).unwrap().is_some());
    disk.put(&key("e"), &[1u8; ENTRY], Duration::ZERO).unwrap();
    let present = |d: &Persistence, n: &str| d.entry_path(&key(n)).exists();
    assert!(present(&disk, "a"), "the entry read last was evicted");
    assert!(!present(&disk, "b"));
    assert!(present(&disk, "c") && present(&disk, "d") && present(&disk, "e"));
    assert_eq!(disk.stats().evictions, 1);

    // Another process (here: a second handle with its own index) reads "c"; this handle's
    // index still thinks "c" is old, but eviction rechecks the file and keeps it.
    let other = Persistence::open(capped()).unwrap();
    assert!(other.get(&key("c")).unwrap().is_some());
    disk.put(&key("f"), &[1u8; ENTRY], Duration::ZERO).unwrap();
    assert!(
        present(&disk, "c"),
        "read by another process, still evicted"
    );
    assert!(!present(&disk, "d"));
    assert_eq!(disk.stats().evictions, 2);
}

#[test]
fn opening_over_the_cap_trims_in_the_background() {
    let (_tmp, dir) = cache_dir();
    let _big = filled(&dir, 10);
    let small = open_capped(&dir, 3_000);
    assert_eq!(small.usage().entries, 3);
    assert_eq!(entry_bytes(&dir), 3_000);
    assert_eq!(small.stats().evictions, 7);
}

fn keyed(dir: &Path, k: &[u8]) -> Persistence {
    let mut c = config(dir);
    c.key = Some(OperatorKey::new(k.to_vec()).unwrap());
    Persistence::open(c).unwrap()
}

#[test]
fn rotation_misses_old_entries_and_gc_removes_exactly_the_old_generation() {
    let (_tmp, dir) = cache_dir();
    let old = keyed(&dir, b"old operator key, thirty-two byt");
    for name in ["a", "b", "c"] {
        old.put(&key(name), b"old", Duration::ZERO).unwrap();
    }
    let new = keyed(&dir, b"new operator key, thirty-two byt");
    assert_ne!(old.fingerprint(), new.fingerprint());
    assert_eq!(new.get(&key("a")).unwrap(), None);
    new.put(&key("a"), b"new", Duration::ZERO).unwrap();
    new.put(&key("d"), b"new", Duration::ZERO).unwrap();
    assert_eq!(old.get(&key("a")).unwrap().unwrap().payload(), b"old");
    let mut expected = vec![old.fingerprint(), new.fingerprint()];
    expected.sort();
    assert_eq!(new.fingerprints().unwrap(), expected);

    // Retaining the old generation (a rolling restart still in progress) removes nothing.
    let report = new.gc(&[old.fingerprint()], Duration::ZERO).unwrap();
    assert_eq!((report.stale_fingerprint, report.kept), (0, 5));

    let report = new.gc(&[], Duration::ZERO).unwrap();
    assert_eq!(report.stale_fingerprint, 3);
    assert_eq!(report.kept, 2);
    assert_eq!(
        (report.corrupt, report.stale_schema, report.temp_files),
        (0, 0, 0)
    );
    assert_eq!(new.fingerprints().unwrap(), vec![new.fingerprint()]);
    assert_eq!(new.get(&key("a")).unwrap().unwrap().payload(), b"new");
    assert_eq!(old.get(&key("b")).unwrap(), None);
}

#[test]
fn gc_removes_old_schemas_corrupt_entries_and_old_temp_files_only() {
    let (_tmp, dir) = cache_dir();
    let mut c = config(&dir);
    c.key_schema = KEY_SCHEMA_VERSION + 1000;
    let other_schema = Persistence::open(c).unwrap();
    other_schema.put(&key("s1"), b"x", Duration::ZERO).unwrap();
    other_schema.put(&key("s2"), b"x", Duration::ZERO).unwrap();

    let disk = Persistence::open(config(&dir)).unwrap();
    disk.put(&key("good"), b"good", Duration::ZERO).unwrap();
    disk.put(&key("bad"), b"bad!", Duration::ZERO).unwrap();
    let bad = disk.entry_path(&key("bad"));
    let mut bytes = std::fs::read(&bad).unwrap();
    bytes[80] ^= 0xff;
    std::fs::write(&bad, &bytes).unwrap();

    let entry_name = disk.entry_path(&key("good"));
    let entry_name = entry_name.file_name().unwrap().to_string_lossy();
    let old_temp = dir.join(format!(".{entry_name}.0123456789abcdef.tmp"));
    let new_temp = dir.join(format!(".{entry_name}.fedcba9876543210.tmp"));
    std::fs::write(&old_temp, b"partial").unwrap();
    std::fs::write(&new_temp, b"partial").unwrap();
    age(&old_temp, Duration::from_secs(3600));
    // Not ours: never touched, whatever they look like.
    for foreign in ["notes.txt", ".hidden.tmp", "ABCDEF.kce", ".x.kce.0123.tmp"] {
        std::fs::write(dir.join(foreign), b"keep me").unwrap();
    }

    let report = disk.gc(&[], Duration::from_secs(600)).unwrap();
    assert_eq!(report.stale_schema, 2);
    assert_eq!(report.corrupt, 1);
    assert_eq!(report.temp_files, 1);
    assert_eq!(report.kept, 1);
    assert!(!old_temp.exists() && new_temp.exists() && !bad.exists());
    for foreign in ["notes.txt", ".hidden.tmp", "ABCDEF.kce", ".x.kce.0123.tmp"] {
        assert!(dir.join(foreign).exists(), "{foreign} was removed");
    }
    assert_eq!(disk.get(&key("good")).unwrap().unwrap().payload(), b"good");
}

#[test]
fn threads_putting_and_reading_under_the_cap_keep_the_index_exact() {
    let (_tmp, dir) = cache_dir();
    let disk = open_capped(&dir, 20_000);
    disk.usage();
    on_threads(4, |t| {
        for i in 0..150 {
            let k = key(&format!("{t}-{i}"));
            let len = 300 + (i * 53 + t * 17) % 1200;
            disk.put(&k, &vec![t as u8; len], Duration::ZERO).unwrap();
            let back = key(&format!("{t}-{}", i / 2));
            if let Some(entry) = disk.get(&back).unwrap() {
                assert!(entry.payload().iter().all(|&b| b == t as u8));
            }
        }
    });
    let on_disk = entry_bytes(&dir);
    assert!(on_disk <= 20_000, "{on_disk}");
    let s = disk.stats();
    assert_eq!((s.integrity_rejects, s.io_errors), (0, 0));
    assert_eq!(s.puts, 600);
    assert!(s.evictions > 0);
    let usage = disk.usage();
    assert_eq!(usage.bytes, on_disk);
    assert_eq!(usage.entries + s.evictions, 600);
}

/// Entry files in the directory and their total size, from a listing.
fn listing(dir: &Path) -> (u64, u64) {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".kce"))
        .fold((0, 0), |(n, b), e| (n + 1, b + e.metadata().unwrap().len()))
}

#[test]
fn the_cap_holds_for_writes_made_while_the_opening_scan_runs() {
    const CAP: u64 = 1 << 20;
    const BIG: usize = (64 << 10) - OVERHEAD; // 64 KiB on disk
    for round in 0..3 {
        let (_tmp, dir) = cache_dir();
        {
            // Many small entries: a scan that takes a while, well under the cap.
            let disk = open_capped(&dir, CAP);
            for i in 0..3000 {
                disk.put(&key(&format!("small {i}")), &[1u8; 96], Duration::ZERO)
                    .unwrap();
            }
        }
        let disk = open_capped(&dir, CAP);
        on_threads(3, |t| {
            for i in 0..6 {
                let k = key(&format!("big {t} {i}"));
                disk.put(&k, &vec![2u8; BIG], Duration::ZERO).unwrap();
            }
        });
        // No waiting for the scan: the cap holds as soon as the writes have returned.
        let (_, bytes) = listing(&dir);
        assert!(bytes <= CAP, "round {round}: {bytes} bytes on disk");
        disk.usage();
        assert_eq!(listing(&dir), {
            let s = disk.stats();
            (s.entries, s.bytes)
        });
    }
}

#[test]
fn the_index_matches_the_directory_after_concurrent_puts_gets_and_removes() {
    for round in 0..24 {
        let (_tmp, dir) = cache_dir();
        // Small enough that puts evict and trigger rescans as well.
        let disk = open_capped(&dir, 12_000);
        disk.usage();
        on_threads(4, |t| {
            for i in 0..300usize {
                // Few names, so that the threads collide on them.
                let k = key(&format!("shared {}", (i * 7 + t) % 6));
                match (i + t) % 3 {
                    0 => {
                        let len = 100 + (i * 131 + t * 29) % 1900;
                        disk.put(&k, &vec![t as u8; len], Duration::ZERO).unwrap();
                    }
                    1 => {
                        let _ = disk.get(&k).unwrap();
                    }
                    _ => {
                        disk.remove(&k).unwrap();
                    }
                }
            }
        });
        disk.usage();
        let s = disk.stats();
        assert_eq!(
            (s.entries, s.bytes),
            listing(&dir),
            "round {round}: the index differs from the directory"
        );
        assert_eq!((s.integrity_rejects, s.io_errors), (0, 0));
    }
}

#[test]
fn gc_removes_directories_at_entry_names_and_reports_one_too_deep() {
    let (_tmp, dir) = cache_dir();
    let disk = Persistence::open(config(&dir)).unwrap();
    let empty = disk.entry_path(&key("empty dir"));
    let full = disk.entry_path(&key("full dir"));
    let deep = disk.entry_path(&key("deep dir"));
    std::fs::create_dir(&empty).unwrap();
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("inside"), b"not ours").unwrap();
    // Deeper than kcache goes (16 levels): left in place.
    let mut bottom = deep.clone();
    for _ in 0..40 {
        bottom.push("d");
    }
    std::fs::create_dir_all(&bottom).unwrap();
    std::fs::write(bottom.join("inside"), b"not ours").unwrap();
    disk.put(&key("good"), b"good", Duration::ZERO).unwrap();

    let report = disk.gc(&[], Duration::ZERO).unwrap();
    assert_eq!(report.corrupt, 2);
    assert_eq!(report.undeletable, 1);
    assert_eq!(report.kept, 1);
    assert!(!empty.exists() && !full.exists());
    assert!(bottom.join("inside").exists());
    // A read refuses it too, and says it could not be removed.
    assert!(disk.get(&key("deep dir")).is_err());
    assert!(bottom.join("inside").exists());
    assert_eq!(disk.usage().entries, 1);
}

#[test]
fn stats_say_when_the_opening_scan_has_finished() {
    let (_tmp, dir) = cache_dir();
    let _first = filled(&dir, 5);
    let disk = Persistence::open(config(&dir)).unwrap();
    disk.wait_scan();
    let s = disk.stats();
    assert!(s.scan_complete);
    assert_eq!((s.entries, s.bytes), (5, 5_000));
}

/// The file-count cap: least recently used entries go first, as under the size cap, and a
/// second handle counts what the first wrote (its opening scan) and stays under the cap too.
#[test]
fn the_file_count_cap_keeps_at_most_that_many_entries() {
    let (_tmp, dir) = cache_dir();
    let capped = || {
        let disk = Persistence::open(PersistenceConfig {
            max_files: Some(3),
            ..config(&dir)
        })
        .unwrap();
        disk.wait_scan();
        disk
    };
    let first = capped();
    assert_eq!(first.max_files(), Some(3));
    // Used an hour ago and fifty minutes ago: the least recently used, whatever the
    // filesystem's timestamp granularity makes of writes a few milliseconds apart.
    for (name, age) in [("a", 3600), ("b", 3000)] {
        first.put(&key(name), b"x", Duration::ZERO).unwrap();
        let file = std::fs::File::options()
            .write(true)
            .open(first.entry_path(&key(name)))
            .unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(age))
            .unwrap();
    }
    let second = capped();
    for name in ["c", "d", "e"] {
        second.put(&key(name), b"x", Duration::ZERO).unwrap();
    }
    assert_eq!(second.usage().entries, 3);
    let present: Vec<bool> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|n| second.entry_path(&key(n)).exists())
        .collect();
    assert_eq!(present, [false, false, true, true, true]);
    // Rewriting an entry replaces it: nothing else is evicted.
    second.put(&key("e"), b"y", Duration::ZERO).unwrap();
    assert_eq!(second.usage().entries, 3);
    assert_eq!(second.stats().evictions, 2);
    // `Some(0)` is no limit.
    let unlimited = Persistence::open(PersistenceConfig {
        max_files: Some(0),
        ..config(&dir)
    })
    .unwrap();
    assert_eq!(unlimited.max_files(), None);
}
