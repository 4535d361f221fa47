//! `kcache verify`: checks every entry's tag, and removes the corrupt ones with `--remove`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use kcache::disk::Check;
use serde::Serialize;

use super::{SCHEMA, Target, error_message};
use crate::{Failure, report};

#[derive(Serialize)]
struct VerifyJson {
    schema: u32,
    checked: u64,
    verified: u64,
    stale_schema: u64,
    other_key: u64,
    corrupt: Vec<CorruptJson>,
}

#[derive(Serialize)]
struct CorruptJson {
    name: String,
    reason: &'static str,
    removed: bool,
}

/// `kcache verify`: exit status 1 when an entry is corrupt (removed or not).
pub fn verify(target: &Target, remove: bool, json: bool) -> Result<u8, Failure> {
    let (cache, _) = target.open()?;
    let entries = cache.entries()?;
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(entries.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} entries, {eta} left")
                .expect("a valid template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut out = VerifyJson {
        schema: SCHEMA,
        checked: 0,
        verified: 0,
        stale_schema: 0,
        other_key: 0,
        corrupt: Vec::new(),
    };
    let mut failed_removals = Vec::new();
    for entry in &entries {
        match cache.check(entry) {
            Check::Verified(_) => out.verified += 1,
            Check::StaleSchema(_) => out.stale_schema += 1,
            Check::OtherKey(_) => out.other_key += 1,
            Check::Corrupt(reason) => {
                let removed = remove
                    && match cache.remove_listed(entry) {
                        Ok(removed) => removed,
                        Err(e) => {
                            failed_removals.push(error_message(&e));
                            false
                        }
                    };
                if !json {
                    bar.suspend(|| {
                        let what = if removed { " (removed)" } else { "" };
                        out!("corrupt: {}: {reason}{what}", entry.name);
                    });
                }
                out.corrupt.push(CorruptJson {
                    name: entry.name.clone(),
                    reason,
                    removed,
                });
            }
            Check::Gone => continue,
        }
        out.checked += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    for failure in &failed_removals {
        eprintln!("kcache: {failure}");
    }
    if json {
        report::json(&out);
    } else {
        let removed = out.corrupt.iter().filter(|c| c.removed).count();
        out!(
            "{} entries checked: {} verified, {} corrupt{}",
            out.checked,
            out.verified,
            out.corrupt.len(),
            if remove {
                format!(" ({removed} removed)")
            } else {
                String::new()
            }
        );
        if out.other_key > 0 {
            out!(
                "{} of other key generations: structure checked, tags not (no key)",
                out.other_key
            );
        }
        if out.stale_schema > 0 {
            out!(
                "{} of another key schema: gc removes them",
                out.stale_schema
            );
        }
    }
    Ok(u8::from(!out.corrupt.is_empty()))
}
