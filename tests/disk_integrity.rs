//! Reads of the disk tier refuse anything that is not exactly what was written for the
//! requested key: every refusal is a miss, counted, and removes the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kcache::Error;
use kcache::disk::format::{ALG_BLAKE3, FORMAT_VERSION, Header};
use kcache::disk::{Descriptor, Durability, OperatorKey};
use kcache::key::{KEY_SCHEMA_VERSION, Key, KeyBuilder};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::assert_err;

fn key(name: &str) -> Key {
    KeyBuilder::new()
        .backend("test")
        .entry(name)
        .finish()
        .unwrap()
}

fn open(dir: &Path, operator: Option<&[u8]>) -> Persistence {
    let mut config = PersistenceConfig::in_dir(dir.join("cache"));
    config.key = operator.map(|k| OperatorKey::new(k.to_vec()).unwrap());
    config.durability = Durability::Relaxed;
    Persistence::open(config).unwrap()
}

/// [`open`] in a new temporary directory, which lasts as long as the first value.
fn open_temp(operator: Option<&[u8]>) -> (tempfile::TempDir, Persistence) {
    let tmp = tempfile::tempdir().unwrap();
    let disk = open(tmp.path(), operator);
    (tmp, disk)
}

/// A disk tier in a temporary directory, and a file `outside` it holding `keep`: what links
/// planted in the tier point at, and what must stay as it is.
fn open_beside_a_file() -> (tempfile::TempDir, Persistence, PathBuf) {
    let (tmp, disk) = open_temp(None);
    let outside = tmp.path().join("outside");
    std::fs::write(&outside, b"keep").unwrap();
    (tmp, disk, outside)
}

const OPERATOR: &[u8] = b"0123456789abcdef0123456789abcdef";

/// Bytes `put` adds to a payload: the fixed header, the descriptor length and the default
/// descriptor (`custom`, no device, no name), and the tag.
const OVERHEAD: usize = 72 + 2 + (2 + 6 + 2 + 2) + 32;

#[test]
fn round_trip_and_counters() {
    let (_tmp, disk) = open_temp(None);
    let k = key("a");
    assert_eq!(disk.get(&k).unwrap(), None);
    disk.put(&k, b"payload bytes", Duration::from_millis(1234))
        .unwrap();
    let entry = disk.get(&k).unwrap().unwrap();
    assert_eq!(entry.payload(), b"payload bytes");
    assert_eq!(entry.build_time(), Duration::from_millis(1234));
    assert_eq!(entry.clone().into_payload(), b"payload bytes".to_vec());
    disk.put(&k, b"replaced", Duration::ZERO).unwrap();
    assert_eq!(disk.get(&k).unwrap().unwrap().payload(), b"replaced");
    assert!(disk.remove(&k).unwrap());
    assert!(!disk.remove(&k).unwrap());
    assert_eq!(disk.get(&k).unwrap(), None);
    let s = disk.stats();
    assert_eq!((s.hits, s.misses, s.puts, s.removes), (2, 2, 2, 1));
    assert_eq!(s.bytes_written, 13 + 8 + 2 * OVERHEAD as u64);
    assert_eq!(s.bytes_read, 13 + 8 + 2 * OVERHEAD as u64);
    assert_eq!((s.integrity_rejects, s.io_errors), (0, 0));
    let mode = std::fs::metadata(disk.path()).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o700
    );
}

#[test]
fn empty_payload_round_trips() {
    let (_tmp, disk) = open_temp(None);
    disk.put(&key("e"), b"", Duration::ZERO).unwrap();
    assert_eq!(disk.get(&key("e")).unwrap().unwrap().payload(), b"");
}

fn tamper_every_byte(operator: Option<&[u8]>) {
    let (_tmp, disk) = open_temp(operator);
    let k = key("tamper");
    disk.put(&k, b"sixteen byte pay", Duration::from_nanos(77))
        .unwrap();
    let path = disk.entry_path(&k);
    let original = std::fs::read(&path).unwrap();
    assert_eq!(original.len(), 16 + OVERHEAD);
    for i in 0..original.len() {
        let mut bad = original.clone();
        bad[i] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        let got = disk.get(&k);
        assert!(matches!(got, Err(Error::Integrity(_))), "byte {i}: {got:?}");
        assert!(!path.exists(), "byte {i}: file not removed");
        assert_eq!(disk.stats().integrity_rejects, i as u64 + 1);
    }
    let s = disk.stats();
    assert_eq!((s.hits, s.misses), (0, original.len() as u64));
    std::fs::write(&path, &original).unwrap();
    assert_eq!(
        disk.get(&k).unwrap().unwrap().payload(),
        b"sixteen byte pay"
    );
}

#[test]
fn tamper_every_byte_blake3() {
    tamper_every_byte(None);
}

#[test]
fn tamper_every_byte_hmac() {
    tamper_every_byte(Some(OPERATOR));
}

#[test]
fn swapped_entries_are_rejected() {
    let (_tmp, disk) = open_temp(Some(OPERATOR));
    let (a, b) = (key("a"), key("b"));
    disk.put(&a, b"AAAA", Duration::ZERO).unwrap();
    disk.put(&b, b"BBBB", Duration::ZERO).unwrap();
    let (pa, pb) = (disk.entry_path(&a), disk.entry_path(&b));
    let (ba, bb) = (std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
    std::fs::write(&pa, &bb).unwrap();
    std::fs::write(&pb, &ba).unwrap();
    assert!(matches!(disk.get(&a), Err(Error::Integrity(_))));
    assert!(matches!(disk.get(&b), Err(Error::Integrity(_))));
    assert!(!pa.exists() && !pb.exists());
    assert_eq!(disk.stats().integrity_rejects, 2);
}

#[test]
fn entry_of_key_a_read_as_key_b_is_rejected() {
    let (_tmp, disk) = open_temp(None);
    let (a, b) = (key("a"), key("b"));
    disk.put(&a, b"value of a", Duration::ZERO).unwrap();
    std::fs::copy(disk.entry_path(&a), disk.entry_path(&b)).unwrap();
    assert!(matches!(disk.get(&b), Err(Error::Integrity(_))));
    assert!(!disk.entry_path(&b).exists());
    assert_eq!(disk.get(&a).unwrap().unwrap().payload(), b"value of a");
}

#[test]
fn truncated_entries_are_rejected() {
    let (_tmp, disk) = open_temp(None);
    let k = key("t");
    let payload = vec![5u8; 4096];
    for len in [0usize, 1, 71, 72, 103, 104, 4096 + 103] {
        disk.put(&k, &payload, Duration::ZERO).unwrap();
        let path = disk.entry_path(&k);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len as u64).unwrap();
        drop(f);
        assert!(
            matches!(disk.get(&k), Err(Error::Integrity(_))),
            "length {len}"
        );
        assert!(!path.exists());
    }
    // Grown instead of truncated: the length field no longer matches either.
    disk.put(&k, &payload, Duration::ZERO).unwrap();
    let path = disk.entry_path(&k);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.push(0);
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(disk.get(&k), Err(Error::Integrity(_))));
    assert_eq!(disk.stats().integrity_rejects, 8);
}

#[test]
fn forged_blake3_entry_is_rejected_when_a_key_is_configured() {
    let (_tmp, disk) = open_temp(Some(OPERATOR));
    let k = key("forged");
    // The forger knows the whole format and the (public) fingerprint, but not the key.
    let payload = b"malicious code";
    let header = Header {
        version: FORMAT_VERSION,
        algorithm: ALG_BLAKE3,
        schema: KEY_SCHEMA_VERSION,
        fingerprint: disk.fingerprint(),
        key: k,
        payload_len: payload.len() as u64,
        build_nanos: 0,
        descriptor: Some(Descriptor::default()),
    }
    .encode();
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(payload);
    let checksum = blake3::hash(&bytes);
    bytes.extend_from_slice(checksum.as_bytes());
    std::fs::write(disk.entry_path(&k), &bytes).unwrap();
    assert!(matches!(disk.get(&k), Err(Error::Integrity(_))));
    assert!(!disk.entry_path(&k).exists());

    // Same forgery with the header claiming HMAC: the checksum is not a valid HMAC.
    bytes[10] = kcache::disk::format::ALG_HMAC_SHA256;
    let body_len = bytes.len() - 32;
    let checksum = blake3::hash(&bytes[..body_len]);
    bytes[body_len..].copy_from_slice(checksum.as_bytes());
    std::fs::write(disk.entry_path(&k), &bytes).unwrap();
    assert!(matches!(disk.get(&k), Err(Error::Integrity(_))));
    assert_eq!(disk.stats().integrity_rejects, 2);
}

#[test]
fn unkeyed_entries_are_invisible_to_a_keyed_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key("x");
    open(tmp.path(), None)
        .put(&k, b"unkeyed", Duration::ZERO)
        .unwrap();
    let keyed = open(tmp.path(), Some(OPERATOR));
    assert_eq!(keyed.get(&k).unwrap(), None);
    // Copying the unkeyed file under the keyed name does not help either.
    let unkeyed = open(tmp.path(), None);
    std::fs::copy(unkeyed.entry_path(&k), keyed.entry_path(&k)).unwrap();
    assert!(matches!(keyed.get(&k), Err(Error::Integrity(_))));
    // Another operator key cannot read it either.
    let other = open(tmp.path(), Some(b"another operator key, 32 bytes.."));
    keyed.put(&k, b"keyed", Duration::ZERO).unwrap();
    std::fs::copy(keyed.entry_path(&k), other.entry_path(&k)).unwrap();
    assert!(matches!(other.get(&k), Err(Error::Integrity(_))));
    assert_eq!(keyed.get(&k).unwrap().unwrap().payload(), b"keyed");
}

#[test]
fn symlinked_entry_is_refused_and_target_untouched() {
    let (tmp, disk) = open_temp(None);
    let (a, b) = (key("a"), key("b"));
    disk.put(&a, b"real", Duration::ZERO).unwrap();
    std::os::unix::fs::symlink(disk.entry_path(&a), disk.entry_path(&b)).unwrap();
    assert!(matches!(disk.get(&b), Err(Error::Integrity(_))));
    assert!(std::fs::symlink_metadata(disk.entry_path(&b)).is_err());
    assert_eq!(disk.get(&a).unwrap().unwrap().payload(), b"real");
    // A put to a name held by a symlink replaces the link, never writes through it.
    let outside = tmp.path().join("outside");
    std::fs::write(&outside, b"precious").unwrap();
    std::os::unix::fs::symlink(&outside, disk.entry_path(&b)).unwrap();
    disk.put(&b, b"new", Duration::ZERO).unwrap();
    assert_eq!(std::fs::read(&outside).unwrap(), b"precious");
    assert_eq!(disk.get(&b).unwrap().unwrap().payload(), b"new");
}

#[test]
fn fifo_under_an_entry_name_does_not_block() {
    let (_tmp, disk) = open_temp(None);
    let k = key("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(disk.entry_path(&k))
        .status()
        .unwrap();
    assert!(status.success());
    assert!(matches!(disk.get(&k), Err(Error::Integrity(_))));
    assert!(std::fs::symlink_metadata(disk.entry_path(&k)).is_err());
}

#[test]
fn oversized_entry_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = PersistenceConfig::in_dir(tmp.path().join("cache"));
    config.max_size = Some(1024);
    let disk = Persistence::open(config).unwrap();
    let k = key("big");
    assert_err!(
        disk.put(&k, &[0u8; 1024], Duration::ZERO),
        Error::InvalidArgument(_)
    );
    assert!(!disk.entry_path(&k).exists());
    disk.put(&k, &[0u8; 1024 - OVERHEAD], Duration::ZERO)
        .unwrap();
    assert_eq!(
        disk.get(&k).unwrap().unwrap().payload().len(),
        1024 - OVERHEAD
    );
}

#[test]
fn file_layout_matches_the_documented_format() {
    let (_tmp, disk) = open_temp(None);
    let k = key("layout");
    let descriptor = Descriptor::new("opencl", "cpu", "add");
    disk.put_described(&k, b"abc", Duration::from_nanos(0x0102), &descriptor)
        .unwrap();
    let bytes = std::fs::read(disk.entry_path(&k)).unwrap();
    let d = 2 + 6 + 2 + 3 + 2 + 3;
    assert_eq!(bytes.len(), 72 + 2 + d + 3 + 32);
    assert_eq!(&bytes[0..8], b"\x89KCACHE\n");
    assert_eq!(&bytes[8..10], &[2, 0]); // format version 2
    assert_eq!(bytes[10], ALG_BLAKE3);
    assert_eq!(bytes[11], 0);
    assert_eq!(&bytes[12..16], &KEY_SCHEMA_VERSION.to_le_bytes());
    assert_eq!(&bytes[16..24], &[0; 8]); // no operator key
    assert_eq!(&bytes[24..56], k.as_bytes());
    assert_eq!(&bytes[56..64], &3u64.to_le_bytes());
    assert_eq!(&bytes[64..72], &0x0102u64.to_le_bytes());
    assert_eq!(&bytes[72..74], &(d as u16).to_le_bytes());
    assert_eq!(&bytes[74..74 + d], b"\x06\0opencl\x03\0cpu\x03\0add");
    let payload = 74 + d;
    assert_eq!(&bytes[payload..payload + 3], b"abc");
    assert_eq!(
        &bytes[payload + 3..],
        blake3::hash(&bytes[..payload + 3]).as_bytes()
    );
    assert_eq!(
        disk.get(&k).unwrap().unwrap().descriptor(),
        Some(&descriptor)
    );
    let name = disk.entry_path(&k);
    let name = name.file_name().unwrap().to_string_lossy();
    assert_eq!(name, format!("0000000000000000-{}.kce", k.to_hex()));
}

#[test]
fn sparse_entry_larger_than_memory_is_a_miss_and_is_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = PersistenceConfig::in_dir(tmp.path().join("cache"));
    config.max_size = Some(1 << 40);
    config.durability = Durability::Relaxed;
    let disk = Persistence::open(config).unwrap();
    let k = key("sparse");
    let path = disk.entry_path(&k);
    let plant = || {
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(100 << 30).unwrap();
    };
    plant();
    assert!(matches!(disk.get(&k), Err(Error::Integrity(_))));
    assert!(std::fs::symlink_metadata(&path).is_err());
    assert_eq!(disk.stats().integrity_rejects, 1);
    // gc classifies it without reading it either.
    plant();
    let report = disk.gc(&[], Duration::ZERO).unwrap();
    assert_eq!(report.corrupt, 1);
    assert!(std::fs::symlink_metadata(&path).is_err());
}

#[test]
fn directory_at_an_entry_name_is_removed_by_a_read_and_by_a_write() {
    let (_tmp, disk) = open_temp(None);
    let k = key("dir");
    let path = disk.entry_path(&k);
    std::fs::create_dir(&path).unwrap();
    assert!(matches!(disk.get(&k), Err(Error::Integrity(_))));
    assert!(std::fs::symlink_metadata(&path).is_err());
    assert_eq!(disk.get(&k).unwrap(), None);
    disk.put(&k, b"after", Duration::ZERO).unwrap();
    assert_eq!(disk.get(&k).unwrap().unwrap().payload(), b"after");

    // A write finding a directory at its name removes it too.
    let other = key("dir, written");
    std::fs::create_dir(disk.entry_path(&other)).unwrap();
    disk.put(&other, b"written", Duration::ZERO).unwrap();
    assert_eq!(disk.get(&other).unwrap().unwrap().payload(), b"written");
    assert_eq!(disk.stats().integrity_rejects, 2);
}

/// A directory tree at `path`: a file, a subdirectory holding a file, and a link to `target`.
fn plant_tree(path: &Path, target: &Path) {
    std::fs::create_dir_all(path.join("sub")).unwrap();
    std::fs::write(path.join("inside"), b"x").unwrap();
    std::fs::write(path.join("sub/file"), b"x").unwrap();
    std::os::unix::fs::symlink(target, path.join("link")).unwrap();
}

/// A chain of `depth` nested directories at `path`, with a file at the bottom.
fn plant_deep(path: &Path, depth: usize) {
    let mut bottom = path.to_path_buf();
    for _ in 0..depth {
        bottom.push("d");
    }
    std::fs::create_dir_all(&bottom).unwrap();
    std::fs::write(bottom.join("file"), b"x").unwrap();
}

#[test]
fn a_directory_tree_at_an_entry_name_never_breaks_its_key() {
    let (_tmp, disk, outside) = open_beside_a_file();

    // A read removes the whole tree, never following the link in it.
    let k = key("tree, read");
    plant_tree(&disk.entry_path(&k), &outside);
    assert_err!(disk.get(&k), Error::Integrity(_));
    assert!(std::fs::symlink_metadata(disk.entry_path(&k)).is_err());
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");

    // A write takes its place: every write of this key failed before, for good.
    let k = key("tree, written");
    plant_tree(&disk.entry_path(&k), &outside);
    disk.put(&k, b"written", Duration::ZERO).unwrap();
    assert_eq!(disk.get(&k).unwrap().unwrap().payload(), b"written");
    assert_eq!(disk.stats().integrity_rejects, 2);

    // A tree too deep to remove is stepped around: moved aside, where `gc` reports it.
    let k = key("too deep");
    plant_deep(&disk.entry_path(&k), 40);
    disk.put(&k, b"around", Duration::ZERO).unwrap();
    assert_eq!(disk.get(&k).unwrap().unwrap().payload(), b"around");
    let report = disk.gc(&[], Duration::ZERO).unwrap();
    assert_eq!((report.undeletable, report.kept), (1, 2), "{report:?}");

    // Nothing else is left: the two entries written and the deep tree, moved aside.
    let names = std::fs::read_dir(disk.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".stats-") && !n.ends_with(".lock"))
        .count();
    assert_eq!(names, 3);
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
}

#[test]
fn gc_removes_trees_at_entry_and_lock_names() {
    let (_tmp, disk, outside) = open_beside_a_file();
    let k = key("entry tree");
    let entry = disk.entry_path(&k);
    plant_tree(&entry, &outside);
    let lock = entry.with_file_name(format!(
        ".{}.lock",
        entry.file_name().unwrap().to_str().unwrap()
    ));
    plant_tree(&lock, &outside);
    let report = disk.gc(&[], Duration::ZERO).unwrap();
    assert_eq!(
        (report.corrupt, report.lock_files, report.undeletable),
        (1, 1, 0),
        "{report:?}"
    );
    assert!(std::fs::symlink_metadata(&entry).is_err());
    assert!(std::fs::symlink_metadata(&lock).is_err());
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
    disk.put(&k, b"v", Duration::ZERO).unwrap();
    assert_eq!(disk.get(&k).unwrap().unwrap().payload(), b"v");
}

#[test]
fn a_foreign_object_at_a_counter_file_is_replaced_and_zeroing_goes_through_every_file() {
    let (_tmp, disk, outside) = open_beside_a_file();
    let dir = disk.path().to_path_buf();
    // This process's own counter file, and three others: a tree, a link, a tree too deep.
    let own = format!(".stats-{:x}", std::process::id() % kcache::disk::SHARDS);
    let others: Vec<String> = (0..kcache::disk::SHARDS)
        .map(|i| format!(".stats-{i:x}"))
        .filter(|n| *n != own)
        .take(3)
        .collect();
    plant_tree(&dir.join(&own), &outside);
    plant_tree(&dir.join(&others[0]), &outside);
    std::os::unix::fs::symlink(&outside, dir.join(&others[1])).unwrap();
    plant_deep(&dir.join(&others[2]), 40);

    // This process's counters reach the directory: its file is replaced by a real one.
    let k = key("counted");
    disk.put(&k, b"v", Duration::ZERO).unwrap();
    disk.flush();
    let stats = disk.directory_stats().unwrap();
    assert_eq!(stats.counters.disk_writes, 1);
    assert!(std::fs::symlink_metadata(dir.join(&own)).unwrap().is_file());

    // Zeroing goes through all sixteen files and names the one it could not zero.
    let failed = disk.zero_directory_stats();
    assert_eq!(
        failed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        [others[2].as_str()]
    );
    for name in &others[..2] {
        assert!(std::fs::symlink_metadata(dir.join(name)).unwrap().is_file());
    }
    let stats = disk.directory_stats().unwrap();
    assert_eq!(stats.counters.disk_writes, 0);
    assert_eq!((stats.shards, stats.shards_ignored), (15, 1));
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
}
