//! `kcache ls`: the entries, one row each, with what their checked headers say.

use std::cmp::Reverse;
use std::time::{Duration, SystemTime};

use kcache::Persistence;
use kcache::disk::format::Header;
use kcache::disk::{Check, EntryInfo};
use serde::Serialize;

use super::{SCHEMA, Target, backend_of, descriptor_of, hex};
use crate::report::{self, Table};
use crate::{Failure, Sort};

#[derive(Serialize)]
struct LsJson {
    schema: u32,
    dir: String,
    entries: Vec<EntryJson>,
}

#[derive(Serialize)]
pub(super) struct EntryJson {
    pub(super) name: String,
    pub(super) key: String,
    pub(super) fingerprint: String,
    pub(super) current: bool,
    /// The descriptor's backend, `unknown` without a verified descriptor.
    pub(super) backend: String,
    pub(super) device: Option<String>,
    pub(super) entry_name: Option<String>,
    pub(super) size: u64,
    pub(super) status: &'static str,
    pub(super) reason: Option<&'static str>,
    pub(super) build_time_ns: Option<u64>,
    pub(super) last_used_unix_ns: u64,
}

/// `status` and `reason` of a check, and the header when its tag was checked.
fn describe(check: &Check) -> (&'static str, Option<&'static str>, Option<&Header>) {
    match check {
        Check::Verified(h) => ("ok", None, Some(h)),
        Check::StaleSchema(h) => ("stale-schema", None, Some(h)),
        Check::OtherKey(_) => ("other-key", None, None),
        Check::Corrupt(reason) => ("corrupt", Some(*reason), None),
        Check::Gone => ("gone", None, None),
    }
}

pub(super) fn entry_json(cache: &Persistence, entry: &EntryInfo, check: &Check) -> EntryJson {
    let (status, reason, header) = describe(check);
    let descriptor = descriptor_of(check);
    EntryJson {
        name: entry.name.clone(),
        key: entry.key.to_hex(),
        fingerprint: hex(&entry.fingerprint),
        current: entry.fingerprint == cache.fingerprint(),
        backend: backend_of(check).to_owned(),
        device: descriptor.map(|d| d.device().to_owned()),
        entry_name: descriptor.map(|d| d.name().to_owned()),
        size: entry.size,
        status,
        reason,
        build_time_ns: header.map(|h| h.build_nanos),
        last_used_unix_ns: report::unix_nanos(entry.modified),
    }
}

/// Text cut to `limit` characters for a table cell, with `…` when cut.
fn cell(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(limit - 1).collect();
    cut.push('…');
    cut
}

pub fn ls(
    target: &Target,
    json: bool,
    backend: Option<&str>,
    sort: Option<Sort>,
) -> Result<u8, Failure> {
    let (cache, _) = target.open()?;
    let mut entries = cache.entries()?;
    match sort {
        None => entries.sort_by_key(|e| (e.key, e.fingerprint)),
        Some(Sort::Size) => entries.sort_by_key(|e| Reverse(e.size)),
        Some(Sort::Age) => entries.sort_by_key(|e| e.modified),
        Some(Sort::LastRead) => entries.sort_by_key(|e| Reverse(e.modified)),
    }
    let rows: Vec<EntryJson> = entries
        .iter()
        .map(|e| entry_json(&cache, e, &cache.check(e)))
        .filter(|row| row.status != "gone")
        .filter(|row| backend.is_none_or(|b| row.backend == b))
        .collect();
    if json {
        report::json(&LsJson {
            schema: SCHEMA,
            dir: cache.path().display().to_string(),
            entries: rows,
        });
        return Ok(0);
    }
    let now = SystemTime::now();
    let mut table = Table::new(&[
        ("KEY", false),
        ("GENERATION", false),
        ("BACKEND", false),
        ("DEVICE", false),
        ("NAME", false),
        ("SIZE", true),
        ("BUILD", true),
        ("LAST USED (WRITTEN OR READ)", false),
        ("STATUS", false),
    ]);
    for row in &rows {
        table.row(vec![
            row.key[..16].to_owned(),
            if row.current {
                "this key".into()
            } else {
                row.fingerprint.clone()
            },
            report::printable(&row.backend).into_owned(),
            cell(&report::printable(row.device.as_deref().unwrap_or("-")), 24),
            cell(
                &report::printable(row.entry_name.as_deref().unwrap_or("-")),
                32,
            ),
            report::size(row.size),
            row.build_time_ns
                .map_or("-".into(), |n| report::duration(Duration::from_nanos(n))),
            report::time(
                SystemTime::UNIX_EPOCH + Duration::from_nanos(row.last_used_unix_ns),
                now,
            ),
            match row.reason {
                Some(reason) => format!("corrupt: {reason}"),
                None => row.status.to_owned(),
            },
        ]);
    }
    table.print();
    out!(
        "{} entries, {}",
        rows.len(),
        report::size(rows.iter().map(|r| r.size).sum())
    );
    Ok(0)
}
