//! The directory's counter files (`.stats-0` … `.stats-f`) on hostile bytes.
//!
//! Any process of the user may have written a counter file, and a crash may have torn one:
//! `CounterRecord::decode` must refuse everything but a whole record of the documented layout
//! (`src/disk/shards.rs`, `docs/disk-tier.md`), never panic nor allocate past
//! `MAX_COUNTERS` counters. The target holds it to an oracle written from that layout.
//!
//! First byte even: the rest is a counter file's bytes, decoded and checked against the
//! oracle, and (one input in eight) also written as a counter file of a real directory whose
//! `directory_stats` must count it exactly as the oracle says. Odd: a record built from the
//! input, encoded, then changed (a byte flipped, cut, extended) with or without its checksum
//! recomputed.
#![no_main]

use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use kcache::disk::{CounterRecord, DirectoryCounters, MAX_COUNTERS};
use kcache::{Persistence, PersistenceConfig};
use libfuzzer_sys::fuzz_target;

const MAGIC: &[u8; 8] = b"KCSTATS\n";
const HEADER_LEN: usize = 24;
const SUM_LEN: usize = 32;

/// What the layout says `bytes` hold: magic, version 1 (u16), reserved 0 (u16), count `n`
/// (u32, at most `MAX_COUNTERS`), zeroing time (u64), `n` counters (u64), BLAKE3 of all that;
/// nothing before, nothing after. All little-endian.
fn oracle(bytes: &[u8]) -> Option<CounterRecord> {
    if bytes.len() < HEADER_LEN + SUM_LEN {
        return None;
    }
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    if &bytes[..8] != MAGIC || u16_at(8) != 1 || u16_at(10) != 0 {
        return None;
    }
    let count = u32_at(12) as usize;
    if count > MAX_COUNTERS || bytes.len() != HEADER_LEN + 8 * count + SUM_LEN {
        return None;
    }
    let body = &bytes[..bytes.len() - SUM_LEN];
    if blake3::hash(body).as_bytes() != &bytes[body.len()..] {
        return None;
    }
    Some(CounterRecord {
        zeroed_ns: u64_at(16),
        values: (0..count).map(|i| u64_at(HEADER_LEN + 8 * i)).collect(),
    })
}

fn check_bytes(bytes: &[u8]) {
    let decoded = CounterRecord::decode(bytes);
    assert_eq!(decoded, oracle(bytes), "decode disagrees with the layout");
    if let Some(record) = &decoded {
        assert_eq!(
            record.encode(),
            bytes,
            "an accepted record re-encodes to its bytes"
        );
        assert!(record.values.len() <= MAX_COUNTERS);
        // `counters` is the known prefix, zero-filled.
        let c = record.counters();
        let names = [c.memory_hits, c.memory_misses, c.disk_hits, c.disk_misses];
        for (i, v) in names.iter().enumerate() {
            assert_eq!(*v, record.values.get(i).copied().unwrap_or(0));
        }
    }
}

/// One directory for the whole run, holding counter files the input writes: in the
/// temporary directory (`scripts/fuzz` points `TMPDIR` at one it removes afterwards).
fn directory() -> &'static Persistence {
    static DIR: OnceLock<Persistence> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("kcache-fuzz-counters-{}", std::process::id()));
        Persistence::open(PersistenceConfig::in_dir(dir)).unwrap()
    })
}

/// `bytes` as counter file `index`, alone in the directory: `directory_stats` counts it as the
/// oracle says, and reading it changes nothing.
fn check_file(index: u8, bytes: &[u8]) {
    let disk = directory();
    for i in 0..kcache::disk::SHARDS {
        let _ = std::fs::remove_file(disk.path().join(format!(".stats-{i:x}")));
    }
    let path = disk.path().join(format!(
        ".stats-{:x}",
        u32::from(index) % kcache::disk::SHARDS
    ));
    std::fs::write(&path, bytes).unwrap();
    let stats = disk.directory_stats().unwrap();
    match oracle(bytes) {
        Some(record) => {
            assert_eq!((stats.shards, stats.shards_ignored), (1, 0));
            assert_eq!(stats.counters, record.counters());
            assert_eq!(stats.last_zeroed.is_some(), record.zeroed_ns > 0);
        }
        None => {
            assert_eq!((stats.shards, stats.shards_ignored), (0, 1));
            assert_eq!(stats.counters, DirectoryCounters::default());
        }
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "a read never writes");
}

#[derive(Arbitrary, Debug)]
enum Change {
    None,
    Flip { at: u16, mask: u8 },
    Cut { keep: u16 },
    Extend { bytes: Vec<u8> },
    SetCount { count: u32 },
}

#[derive(Arbitrary, Debug)]
struct Structured {
    zeroed_ns: u64,
    values: Vec<u64>,
    change: Change,
    resum: bool,
}

fn check_structured(input: Structured) {
    let record = CounterRecord {
        zeroed_ns: input.zeroed_ns,
        values: input.values,
    };
    let mut bytes = record.encode();
    assert_eq!(bytes.len(), HEADER_LEN + 8 * record.values.len() + SUM_LEN);
    let intact = bytes.clone();
    if record.values.len() <= MAX_COUNTERS {
        assert_eq!(CounterRecord::decode(&bytes).as_ref(), Some(&record));
    } else {
        assert_eq!(CounterRecord::decode(&bytes), None, "too many counters");
    }
    match input.change {
        Change::None => {}
        Change::Flip { at, mask } => {
            let at = usize::from(at) % bytes.len();
            bytes[at] ^= mask;
        }
        Change::Cut { keep } => bytes.truncate(usize::from(keep) % (bytes.len() + 1)),
        Change::Extend { bytes: more } => bytes.extend_from_slice(&more),
        Change::SetCount { count } => bytes[12..16].copy_from_slice(&count.to_le_bytes()),
    }
    if input.resum && bytes.len() >= SUM_LEN {
        let body = bytes.len() - SUM_LEN;
        let sum = *blake3::hash(&bytes[..body]).as_bytes();
        bytes[body..].copy_from_slice(&sum);
    }
    check_bytes(&bytes);
    if bytes != intact && !input.resum {
        assert_eq!(
            CounterRecord::decode(&bytes),
            None,
            "a change without its checksum"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        check_bytes(rest);
        if mode % 16 == 0 {
            check_file(mode / 16, rest);
        }
    } else if let Ok(input) = Structured::arbitrary_take_rest(Unstructured::new(rest)) {
        check_structured(input);
    }
});
