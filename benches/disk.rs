//! Disk tier costs, each against a peer measured in the same run:
//! - a verified `get` of a 64 KiB entry vs a plain open+read+close of the same file;
//! - HMAC-SHA256 vs keyed BLAKE3 over 64 KiB (the tag choice);
//! - `put` with and without fsync.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hmac::{Hmac, Mac};
use kcache::disk::{Durability, OperatorKey};
use kcache::key::{Key, KeyBuilder};
use kcache::{Persistence, PersistenceConfig};
use sha2::Sha256;

const SIZE: usize = 64 * 1024;
const OPERATOR: &[u8] = b"benchmark operator key, 32 bytes";

fn key(name: &str) -> Key {
    KeyBuilder::new()
        .backend("bench")
        .entry(name)
        .finish()
        .unwrap()
}

fn open(dir: &std::path::Path, keyed: bool, durability: Durability) -> Persistence {
    let mut config = PersistenceConfig::in_dir(dir);
    config.durability = durability;
    if keyed {
        config.key = Some(OperatorKey::new(OPERATOR.to_vec()).unwrap());
    }
    Persistence::open(config).unwrap()
}

fn payload() -> Vec<u8> {
    (0..SIZE).map(|i| (i * 7 + 3) as u8).collect()
}

fn get(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let data = payload();
    let mut group = c.benchmark_group("get_64KiB");
    group.throughput(Throughput::Bytes(SIZE as u64));
    for (label, keyed) in [("verified_blake3", false), ("verified_hmac_sha256", true)] {
        let disk = open(&tmp.path().join(label), keyed, Durability::Relaxed);
        let k = key("entry");
        disk.put(&k, &data, Duration::ZERO).unwrap();
        group.bench_function(label, |b| {
            b.iter(|| black_box(disk.get(black_box(&k)).unwrap().unwrap()))
        });
        if !keyed {
            // The peer: the same file, read with no checks at all.
            let path = disk.entry_path(&k);
            group.bench_function("plain_open_read_close", |b| {
                b.iter(|| black_box(std::fs::read(black_box(&path)).unwrap()))
            });
        }
    }
    group.finish();
}

fn tags(c: &mut Criterion) {
    let data = payload();
    let mut group = c.benchmark_group("tag_64KiB");
    group.throughput(Throughput::Bytes(SIZE as u64));
    let mac = <Hmac<Sha256> as Mac>::new_from_slice(OPERATOR).unwrap();
    group.bench_function("hmac_sha256", |b| {
        b.iter(|| {
            let mut m = mac.clone();
            m.update(black_box(&data));
            black_box(m.finalize().into_bytes())
        })
    });
    let blake_key: [u8; 32] = OPERATOR.try_into().unwrap();
    group.bench_function("keyed_blake3", |b| {
        b.iter(|| black_box(blake3::keyed_hash(&blake_key, black_box(&data))))
    });
    group.bench_function("blake3_checksum", |b| {
        b.iter(|| black_box(blake3::hash(black_box(&data))))
    });
    group.finish();
}

fn put(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let data = payload();
    let mut group = c.benchmark_group("put_64KiB");
    group.throughput(Throughput::Bytes(SIZE as u64));
    for (label, durability) in [
        ("fsync", Durability::Sync),
        ("no_fsync", Durability::Relaxed),
    ] {
        let disk = open(&tmp.path().join(label), true, durability);
        let k = key("entry");
        group.bench_function(BenchmarkId::new("hmac", label), |b| {
            b.iter(|| {
                disk.put(black_box(&k), black_box(&data), Duration::ZERO)
                    .unwrap()
            })
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = get, tags, put
}
criterion_main!(benches);
