//! `kcache gc`: the library's sweep, then the age and size passes, least recently used first.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use kcache::disk::format::Tagger;
use kcache::disk::{Check, DEFAULT_TEMP_MAX_AGE, OperatorKey};
use serde::Serialize;

use super::{NotDoneJson, PARTIAL, SCHEMA, Target, partial_status};
use crate::{Failure, report};

pub struct GcArgs {
    pub older_than: Option<Duration>,
    pub max_size: Option<u64>,
    pub retain_key: Vec<PathBuf>,
    pub dry_run: bool,
}

#[derive(Serialize)]
struct GcJson {
    schema: u32,
    dry_run: bool,
    /// What the library's sweep removed (none in a dry run).
    sweep: Option<SweepJson>,
    /// Entries removed (or, in a dry run, that would be) by name.
    removed: Vec<RemovedJson>,
    bytes_freed: u64,
    kept_entries: u64,
    kept_bytes: u64,
    /// Entries of the age and size passes that could not be removed, each with why (the
    /// sweep's are counted in `sweep.undeletable`).
    not_removed: Vec<NotDoneJson>,
}

#[derive(Serialize)]
struct SweepJson {
    stale_fingerprint: u64,
    stale_schema: u64,
    corrupt: u64,
    old_format: u64,
    temp_files: u64,
    lock_files: u64,
    undeletable: u64,
    bytes_freed: u64,
}

#[derive(Serialize)]
struct RemovedJson {
    name: String,
    reason: &'static str,
    size: u64,
}

pub fn gc(target: &Target, args: &GcArgs, json: bool) -> Result<u8, Failure> {
    let mut retain = Vec::new();
    for path in &args.retain_key {
        let key = OperatorKey::from_file(path)
            .map_err(|e| Failure::usage(format!("--retain-key {}: {e}", path.display())))?;
        retain.push(Tagger::new(Some(&key)).fingerprint());
    }
    let (cache, _) = target.open()?;
    let mut out = GcJson {
        schema: SCHEMA,
        dry_run: args.dry_run,
        sweep: None,
        removed: Vec::new(),
        bytes_freed: 0,
        kept_entries: 0,
        kept_bytes: 0,
        not_removed: Vec::new(),
    };
    let mut kept = Vec::new();
    if args.dry_run {
        // What the sweep would remove, judged as it judges (temporaries and lock files are
        // not listed: whether one is idle is only known by locking it).
        for entry in cache.entries()? {
            let current = entry.fingerprint == cache.fingerprint();
            let reason = if !current && !retain.contains(&entry.fingerprint) {
                Some("stale-fingerprint")
            } else {
                match cache.check(&entry) {
                    Check::Corrupt(_) => Some("corrupt"),
                    Check::StaleSchema(_) => Some("stale-schema"),
                    Check::Gone => continue,
                    Check::Verified(h) | Check::OtherKey(h) if h.descriptor.is_none() => {
                        Some("old-format")
                    }
                    Check::Verified(_) | Check::OtherKey(_) => None,
                }
            };
            match reason {
                Some(reason) => out.removed.push(RemovedJson {
                    name: entry.name.clone(),
                    reason,
                    size: entry.size,
                }),
                None => kept.push(entry),
            }
        }
    } else {
        let report = cache.gc(&retain, DEFAULT_TEMP_MAX_AGE)?;
        out.sweep = Some(SweepJson {
            stale_fingerprint: report.stale_fingerprint,
            stale_schema: report.stale_schema,
            corrupt: report.corrupt,
            old_format: report.old_format,
            temp_files: report.temp_files,
            lock_files: report.lock_files,
            undeletable: report.undeletable,
            bytes_freed: report.bytes_freed,
        });
        out.bytes_freed = report.bytes_freed;
        kept = cache.entries()?.into_iter().filter(|e| e.regular).collect();
    }
    // Least recently used first: the order both the age and the size passes remove in.
    kept.sort_by_key(|e| e.modified);
    let now = SystemTime::now();
    let mut total: u64 = kept.iter().map(|e| e.size).sum();
    for entry in kept {
        let age = now.duration_since(entry.modified).unwrap_or_default();
        let reason = if args.older_than.is_some_and(|limit| age >= limit) {
            Some("older-than")
        } else if args.max_size.is_some_and(|max| total > max) {
            Some("max-size")
        } else {
            None
        };
        let gone = match reason {
            Some(_) if args.dry_run => true,
            // One that cannot be removed is reported, and the others still go.
            Some(_) => cache.remove_listed(&entry).unwrap_or_else(|e| {
                out.not_removed.push(NotDoneJson {
                    name: entry.name.clone(),
                    error: e.to_string(),
                });
                false
            }),
            None => false,
        };
        match reason {
            Some(reason) if gone => {
                total -= entry.size;
                out.removed.push(RemovedJson {
                    name: entry.name,
                    reason,
                    size: entry.size,
                });
            }
            _ => {
                out.kept_entries += 1;
                out.kept_bytes += entry.size;
            }
        }
    }
    // In a real run `removed` lists the age and size passes only; the sweep's bytes are in.
    out.bytes_freed += out.removed.iter().map(|r| r.size).sum::<u64>();
    let undeletable = out.sweep.as_ref().map_or(0, |s| s.undeletable);
    if undeletable > 0 {
        eprintln!("kcache: the sweep could not remove {undeletable} names (left in place)");
    }
    let status = match partial_status("remove", &out.not_removed) {
        0 if undeletable > 0 => PARTIAL,
        status => status,
    };
    if json {
        report::json(&out);
        return Ok(status);
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    for r in &out.removed {
        out!("{verb} {} ({}, {})", r.name, r.reason, report::size(r.size));
    }
    if let Some(s) = &out.sweep {
        out!(
            "sweep: {} of retired keys, {} of other key schemas, {} corrupt, {} of format 1, \
             {} temporaries, {} idle lock files{}",
            s.stale_fingerprint,
            s.stale_schema,
            s.corrupt,
            s.old_format,
            s.temp_files,
            s.lock_files,
            if s.undeletable > 0 {
                format!(", {} could not be removed", s.undeletable)
            } else {
                String::new()
            }
        );
    }
    out!(
        "{verb} {}; kept {} entries ({})",
        report::size(out.bytes_freed),
        out.kept_entries,
        report::size(out.kept_bytes)
    );
    Ok(status)
}
