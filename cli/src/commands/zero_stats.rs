//! `kcache zero-stats`: zeroes the directory's counters.

use serde::Serialize;

use super::{NotDoneJson, SCHEMA, Target, partial_status};
use crate::{Failure, report};

#[derive(Serialize)]
struct ZeroJson {
    schema: u32,
    dir: String,
    zeroed_unix_ns: u64,
    /// Counter files that could not be zeroed, each with why.
    not_zeroed: Vec<NotDoneJson>,
}

pub fn zero_stats(target: &Target, json: bool) -> Result<u8, Failure> {
    let (cache, _) = target.open()?;
    let not_zeroed: Vec<NotDoneJson> = cache
        .zero_directory_stats()
        .into_iter()
        .map(|(name, error)| NotDoneJson { name, error })
        .collect();
    let zeroed = cache
        .directory_stats()?
        .last_zeroed
        .map_or(0, report::unix_nanos);
    let out = ZeroJson {
        schema: SCHEMA,
        dir: cache.path().display().to_string(),
        zeroed_unix_ns: zeroed,
        not_zeroed,
    };
    if json {
        report::json(&out);
    } else if out.not_zeroed.is_empty() {
        out!("zeroed the counters of {}", out.dir);
    } else {
        out!(
            "zeroed the counters of {}, but for {} of the {} counter files",
            out.dir,
            out.not_zeroed.len(),
            kcache::disk::SHARDS
        );
    }
    Ok(partial_status("zero", &out.not_zeroed))
}
