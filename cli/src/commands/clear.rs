//! `kcache clear`: removes every entry of this key.

use serde::Serialize;

use super::{NotDoneJson, SCHEMA, Target, partial_status};
use crate::{Failure, report};

#[derive(Serialize)]
struct ClearJson {
    schema: u32,
    removed: u64,
    bytes_freed: u64,
    /// Names of this key that could not be removed, each with why.
    not_removed: Vec<NotDoneJson>,
}

pub fn clear(target: &Target, json: bool) -> Result<u8, Failure> {
    let (cache, _) = target.open()?;
    let mut out = ClearJson {
        schema: SCHEMA,
        removed: 0,
        bytes_freed: 0,
        not_removed: Vec::new(),
    };
    for entry in cache.entries()? {
        if entry.fingerprint != cache.fingerprint() {
            continue;
        }
        // Whatever is at the name goes (a directory with everything in it); what cannot is
        // reported, and the other entries still go.
        match cache.remove(&entry.key) {
            Ok(true) => {
                out.removed += 1;
                out.bytes_freed += entry.size;
            }
            Ok(false) => {}
            Err(e) => out.not_removed.push(NotDoneJson {
                name: entry.name,
                error: e.to_string(),
            }),
        }
    }
    if json {
        report::json(&out);
    } else {
        out!(
            "removed {} entries ({}) from {}{}",
            out.removed,
            report::size(out.bytes_freed),
            cache.path().display(),
            match out.not_removed.len() {
                0 => String::new(),
                n => format!("; {n} could not be removed"),
            }
        );
    }
    Ok(partial_status("remove", &out.not_removed))
}
