//! Entries that say what they hold: a directory filled through the OpenCL backend on PoCL,
//! the Rust tiered API under a backend name of its own, a plain `put`, and one entry of the
//! previous format (written here byte by byte); then `ls --backend`, the per-backend figures
//! of `stats`, `evict --backend` / `--device` removing exactly the matching files, and `gc`
//! removing the old entry after reads have served it.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{json, run};
use kcache::backend::opencl::DeviceIdentity;
use kcache::disk::Descriptor;
use kcache::disk::format::{ALG_BLAKE3, FORMAT_VERSION_1, Header};
use kcache::key::{KEY_SCHEMA_VERSION, Key};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::opencl::Context;
use kcache_testkit::strings::{l2_key, load, serialize, tiered};
use serde_json::Value;

/// Entry files in `dir`.
fn entry_files(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_str().unwrap().ends_with(".kce")
        })
        .count()
}

/// Writes the entry for `key` as format 1 wrote it: the 72-byte header without a
/// descriptor, the payload and a BLAKE3 tag.
fn write_format_1(disk: &Persistence, key: &Key, payload: &[u8], build_nanos: u64) -> u64 {
    let header = Header {
        version: FORMAT_VERSION_1,
        algorithm: ALG_BLAKE3,
        schema: KEY_SCHEMA_VERSION,
        fingerprint: [0; 8],
        key: *key,
        payload_len: payload.len() as u64,
        build_nanos,
        descriptor: None,
    }
    .encode();
    assert_eq!(header.len(), 72);
    let mut bytes = [&header[..], payload].concat();
    let tag = blake3::hash(&bytes);
    bytes.extend_from_slice(tag.as_bytes());
    fs::write(disk.entry_path(key), &bytes).unwrap();
    bytes.len() as u64
}

/// Rows of `ls --json` with their file name and size, by file name.
fn rows(ls: &Value) -> Vec<(String, Value)> {
    let mut rows: Vec<(String, Value)> = ls["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_owned(), r.clone()))
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows
}

fn size_of_entry(disk: &Persistence, key: &Key) -> u64 {
    fs::metadata(disk.entry_path(key)).unwrap().len()
}

#[test]
fn entries_are_listed_counted_and_evicted_by_what_they_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let disk = Arc::new(Persistence::open(PersistenceConfig::in_dir(dir)).unwrap());

    // Through the OpenCL backend on PoCL: one program of two kernels.
    let Some(context) = Context::for_test() else {
        return;
    };
    let device_name = DeviceIdentity::query(context.device()).unwrap().device_name;
    let source = "// descriptors\n__kernel void first(__global int *x) { x[0] = 1; }\n\
                  __kernel void second(__global int *x) { x[0] = 2; }\n";
    let opencl_key = context.store_program(Arc::clone(&disk), source);

    // Through the Rust tiered API, as a backend kcache does not know: two devices.
    let strings = tiered(Some(Arc::clone(&disk)));
    let described = [
        ("kernel-a", "device-a"),
        ("kernel-b", "device-a"),
        ("kernel-c", "device-b"),
    ];
    for (name, device) in described {
        let lease = strings.find_or_build_described(
            name.as_bytes(),
            None,
            || Ok(l2_key(name)),
            load,
            || Ok((format!("compiled({name})"), 1)),
            |value: &String| Ok((serialize(value)?, Descriptor::new("strings", device, name))),
        );
        assert_eq!(lease.unwrap().value(), &format!("compiled({name})"));
    }
    strings.flush();
    // A plain put: the default descriptor.
    let plain = l2_key("plain");
    disk.put(&plain, b"plain", Duration::from_millis(3))
        .unwrap();
    // An entry of format 1.
    let old = l2_key("old");
    let old_size = write_format_1(&disk, &old, b"old payload", 42);
    assert_eq!(entry_files(dir), 6);

    // It is read as before, and says nothing of what it holds.
    let entry = disk.get(&old).unwrap().unwrap();
    assert_eq!(entry.payload(), b"old payload");
    assert_eq!(entry.build_time(), Duration::from_nanos(42));
    assert_eq!(entry.descriptor(), None);
    let entry = disk.get(&l2_key("kernel-c")).unwrap().unwrap();
    assert_eq!(
        entry.descriptor(),
        Some(&Descriptor::new("strings", "device-b", "kernel-c"))
    );

    // ls --backend opencl: the one program, with its device and kernels.
    let ls = json(dir, &["ls", "--json", "--backend", "opencl"]);
    let opencl_rows = rows(&ls);
    assert_eq!(opencl_rows.len(), 1);
    let row = &opencl_rows[0].1;
    assert_eq!(row["key"], opencl_key.to_hex());
    assert_eq!(row["backend"], "opencl");
    assert_eq!(row["device"], device_name.as_str());
    let mut kernels: Vec<&str> = row["entry_name"].as_str().unwrap().split(';').collect();
    kernels.sort_unstable();
    assert_eq!(kernels, ["first", "second"]);
    assert_eq!(row["size"], size_of_entry(&disk, &opencl_key));
    assert!(row["build_time_ns"].as_u64().unwrap() > 0);

    let strings_rows = rows(&json(dir, &["ls", "--json", "--backend", "strings"]));
    assert_eq!(strings_rows.len(), 3);
    let mut listed: Vec<(&str, &str)> = strings_rows
        .iter()
        .map(|(_, r)| {
            (
                r["entry_name"].as_str().unwrap(),
                r["device"].as_str().unwrap(),
            )
        })
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, described);

    // The old entry is listed as unknown, and counted under it.
    let unknown = rows(&json(dir, &["ls", "--json", "--backend", "unknown"]));
    assert_eq!(unknown.len(), 1);
    assert_eq!(unknown[0].1["key"], old.to_hex());
    assert_eq!(unknown[0].1["status"], "ok");
    assert_eq!(unknown[0].1["device"], Value::Null);
    assert_eq!(unknown[0].1["entry_name"], Value::Null);
    assert_eq!(unknown[0].1["build_time_ns"], 42);
    assert_eq!(
        json(dir, &["ls", "--json"])["entries"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    assert!(rows(&json(dir, &["ls", "--json", "--backend", "cuda"])).is_empty());

    // stats: entries and bytes per backend.
    let stats = json(dir, &["stats", "--json"]);
    let strings_bytes: u64 = ["kernel-a", "kernel-b", "kernel-c"]
        .iter()
        .map(|n| size_of_entry(&disk, &l2_key(n)))
        .sum();
    let expected = [
        ("custom", 1, size_of_entry(&disk, &plain)),
        ("opencl", 1, size_of_entry(&disk, &opencl_key)),
        ("strings", 3, strings_bytes),
        ("unknown", 1, old_size),
    ];
    let backends = stats["backends"].as_array().unwrap();
    assert_eq!(backends.len(), expected.len());
    for (got, (backend, entries, bytes)) in backends.iter().zip(expected) {
        assert_eq!(got["backend"], backend);
        assert_eq!(got["entries"], entries);
        assert_eq!(got["bytes"], bytes);
    }
    let human = String::from_utf8(run(dir, &["stats"]).stdout).unwrap();
    assert!(human.contains("backends:"), "{human}");

    // evict --device: exactly the two entries built for device-a.
    let evicted = json(dir, &["evict", "--json", "--device", "device-a"]);
    let removed = evicted["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 2);
    assert!(removed.iter().all(|r| r["device"] == "device-a"));
    assert_eq!(entry_files(dir), 4);
    assert!(!disk.entry_path(&l2_key("kernel-a")).exists());
    assert!(!disk.entry_path(&l2_key("kernel-b")).exists());
    assert!(disk.entry_path(&l2_key("kernel-c")).exists());

    // evict --backend opencl: the program only.
    let evicted = json(dir, &["evict", "--json", "--backend", "opencl"]);
    assert_eq!(evicted["removed"].as_array().unwrap().len(), 1);
    assert_eq!(evicted["bytes_freed"], row["size"]);
    assert_eq!(entry_files(dir), 3);
    assert!(!disk.entry_path(&opencl_key).exists());

    // Both criteria must match; a backend that wrote nothing removes nothing.
    let none = json(
        dir,
        &[
            "evict",
            "--json",
            "--backend",
            "custom",
            "--device",
            "device-b",
        ],
    );
    assert_eq!(none["removed"].as_array().unwrap().len(), 0);
    assert_eq!(
        json(dir, &["evict", "--json", "--backend", "cuda"])["bytes_freed"],
        0
    );
    // Entries without a verified descriptor are never matched, even as "unknown".
    let unmatched = json(dir, &["evict", "--json", "--backend", "unknown"]);
    assert_eq!(unmatched["removed"].as_array().unwrap().len(), 0);
    assert_eq!(entry_files(dir), 3);
    // Neither criterion: a usage error.
    assert_eq!(run(dir, &["evict"]).status.code(), Some(2));

    // gc removes the format-1 entry (documented rule), and keeps the rest; a dry run says so
    // first and removes nothing.
    let dry = json(dir, &["gc", "--json", "--dry-run"]);
    let would = dry["removed"].as_array().unwrap();
    assert_eq!(would.len(), 1);
    assert_eq!(would[0]["reason"], "old-format");
    assert_eq!(would[0]["size"], old_size);
    assert_eq!(entry_files(dir), 3);
    let gc = json(dir, &["gc", "--json"]);
    assert_eq!(gc["sweep"]["old_format"], 1);
    assert_eq!(gc["sweep"]["corrupt"], 0);
    assert_eq!(gc["kept_entries"], 2);
    assert_eq!(entry_files(dir), 2);
    assert!(!disk.entry_path(&old).exists());
    assert!(disk.entry_path(&plain).exists());
    assert!(disk.entry_path(&l2_key("kernel-c")).exists());
}

#[test]
fn an_edited_descriptor_is_neither_shown_nor_matched() {
    // A descriptor that does not verify is never shown nor matched: here an entry of this
    // key whose descriptor was edited after it was written (the tag no longer matches).
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let disk = Persistence::open(PersistenceConfig::in_dir(dir)).unwrap();
    let key = l2_key("edited");
    disk.put_described(
        &key,
        b"payload",
        Duration::ZERO,
        &Descriptor::new("opencl", "gpu-a", "k"),
    )
    .unwrap();
    let path = disk.entry_path(&key);
    let mut bytes = fs::read(&path).unwrap();
    // The device name's last byte: `gpu-a` becomes `gpu-b`.
    let at = 72 + 2 + 2 + 6 + 2 + 4;
    assert_eq!(bytes[at], b'a');
    bytes[at] = b'b';
    fs::write(&path, &bytes).unwrap();
    let ls = json(dir, &["ls", "--json"]);
    assert_eq!(ls["entries"][0]["backend"], "unknown");
    assert_eq!(ls["entries"][0]["status"], "corrupt");
    let evicted = json(dir, &["evict", "--json", "--device", "gpu-b"]);
    assert_eq!(evicted["removed"].as_array().unwrap().len(), 0);
    assert_eq!(entry_files(dir), 1);
}
