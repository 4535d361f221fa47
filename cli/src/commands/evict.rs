//! `kcache evict`: removes the entries of one backend or one device, as their descriptors say.
//! A descriptor is trusted only once the entry's tag has been checked with this process's key,
//! so entries that do not verify (other key generations, corrupt, format 1 without a
//! descriptor) are never matched: `gc` and `verify --remove` deal with those.

use kcache::disk::{Check, Descriptor};
use serde::Serialize;

use super::{SCHEMA, Target, descriptor_of};
use crate::{Failure, report};

/// What `evict` selects: every given criterion must match.
pub struct Selection {
    pub backend: Option<String>,
    pub device: Option<String>,
}

impl Selection {
    fn matches(&self, d: &Descriptor) -> bool {
        self.backend.as_deref().is_none_or(|b| d.backend() == b)
            && self.device.as_deref().is_none_or(|n| d.device() == n)
    }
}

#[derive(Serialize)]
struct EvictJson {
    schema: u32,
    backend: Option<String>,
    device: Option<String>,
    removed: Vec<EvictedJson>,
    bytes_freed: u64,
}

#[derive(Serialize)]
struct EvictedJson {
    name: String,
    backend: String,
    device: String,
    entry_name: String,
    size: u64,
}

/// Removes every verified entry of this key whose descriptor matches `selection`. An entry
/// read or rewritten since it was listed is kept (it is in use).
pub fn evict(target: &Target, selection: &Selection, json: bool) -> Result<u8, Failure> {
    if selection.backend.is_none() && selection.device.is_none() {
        return Err(Failure::usage("evict needs --backend or --device"));
    }
    let (cache, _) = target.open()?;
    let mut out = EvictJson {
        schema: SCHEMA,
        backend: selection.backend.clone(),
        device: selection.device.clone(),
        removed: Vec::new(),
        bytes_freed: 0,
    };
    for entry in cache.entries()? {
        let check = cache.check(&entry);
        if !matches!(check, Check::Verified(_)) {
            continue;
        }
        let Some(descriptor) = descriptor_of(&check).filter(|d| selection.matches(d)) else {
            continue;
        };
        if cache.remove_listed(&entry)? {
            out.bytes_freed += entry.size;
            out.removed.push(EvictedJson {
                name: entry.name.clone(),
                backend: descriptor.backend().to_owned(),
                device: descriptor.device().to_owned(),
                entry_name: descriptor.name().to_owned(),
                size: entry.size,
            });
        }
    }
    if json {
        report::json(&out);
        return Ok(0);
    }
    for r in &out.removed {
        out!(
            "removed {} ({} on {}: {}, {})",
            r.name,
            report::printable(&r.backend),
            report::printable(&r.device),
            report::printable(&r.entry_name),
            report::size(r.size)
        );
    }
    out!(
        "removed {} entries ({}) from {}",
        out.removed.len(),
        report::size(out.bytes_freed),
        cache.path().display()
    );
    Ok(0)
}
