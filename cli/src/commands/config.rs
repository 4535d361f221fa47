//! `kcache config`: the resolved directory and how it was chosen, whether the disk tier is on,
//! with the key, the caps and the environment the processes using the cache apply.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::path::Path;

use kcache::Error;
use kcache::Persistence;
use kcache::disk::settings::{SETTINGS_FILE, Setting};
use serde::Serialize;

use super::target::source_name;
use super::{SCHEMA, Target, error_kind, error_message, hex};
use crate::{Failure, report};

#[derive(Serialize)]
struct ConfigJson {
    schema: u32,
    dir: Option<String>,
    dir_source: Option<&'static str>,
    exists: bool,
    enabled: bool,
    trusted: Option<bool>,
    error: Option<ErrorJson>,
    key_source: Option<&'static str>,
    key_fingerprint: Option<String>,
    tag: Option<&'static str>,
    cap_bytes: Option<u64>,
    /// The file-count cap; `null` without one (or when the configuration is refused first).
    max_files: Option<u64>,
    lock_timeout_s: Option<f64>,
    /// What the directory's settings file (`kcache.conf`) sets, as written.
    directory_settings: BTreeMap<&'static str, String>,
    environment: BTreeMap<String, String>,
    notes: Vec<String>,
}

#[derive(Serialize)]
struct ErrorJson {
    kind: &'static str,
    message: String,
}

/// `kcache config`: exit status 0 when the disk tier is on, 1 when it is off.
pub fn config(target: &Target, json: bool) -> Result<u8, Failure> {
    let mut out = ConfigJson {
        schema: SCHEMA,
        dir: None,
        dir_source: None,
        exists: false,
        enabled: false,
        trusted: None,
        error: None,
        key_source: None,
        key_fingerprint: None,
        tag: None,
        cap_bytes: None,
        max_files: None,
        lock_timeout_s: None,
        directory_settings: BTreeMap::new(),
        environment: std::env::vars_os()
            .filter_map(|(k, v)| {
                let k = k.into_string().ok()?;
                let v = v.to_string_lossy();
                // A remote's URL may hold its password: it never leaves the process.
                let v = if k.ends_with("_URL") {
                    kcache::remote::masked_url(&v)
                } else {
                    v.into_owned()
                };
                k.starts_with("KCACHE_").then_some((k, v))
            })
            .collect(),
        notes: Vec::new(),
    };
    if kcache::env::secure_execution() {
        out.notes.push(
            "secure-execution process: no KCACHE_* variable but KCACHE_DISABLE and \
             KCACHE_REQUIRE_KEY is read"
                .into(),
        );
    }
    if let Some(dir) = std::env::var_os("KCACHE_DIR").filter(|d| !d.is_empty()) {
        if target.dir.is_some() {
            out.notes
                .push("KCACHE_DIR is ignored: --dir is given".into());
        } else if !Path::new(&dir).is_absolute() {
            out.notes
                .push(format!("KCACHE_DIR={dir:?} is a relative path: ignored"));
        }
    }
    if target.dir.is_some() && kcache::env::disk_disabled() {
        out.notes.push(
            "KCACHE_DISABLE=1 turns the tier off for the processes using the cache; with --dir \
             this command opens the directory all the same"
                .into(),
        );
    }
    let mut config = target.base_config()?;
    let outcome = config.locate_dir().map(|(dir, source)| {
        out.dir = Some(dir.display().to_string());
        out.dir_source = Some(source_name(source));
        out.exists = std::fs::symlink_metadata(&dir).is_ok();
    });
    let opened = match outcome {
        Err(e) => Err(e),
        Ok(()) => match target.add_settings(&mut config) {
            Err(e) => Err(e),
            Ok(mut settings) => {
                out.key_source = settings.key_source;
                // Opening creates a missing directory, unless `KCACHE_DISABLE=1` refuses first
                // (which `--dir` does not consult).
                if out.exists || (target.dir.is_none() && kcache::env::disk_disabled()) {
                    let opened = Persistence::open(config);
                    if let Ok(cache) = &opened {
                        settings.with_directory(cache.path());
                        if let Some(problem) = &settings.directory_problem {
                            out.notes
                                .push(format!("the directory's settings: {problem}"));
                        }
                        if let Ok(Some(file)) = kcache::disk::settings::load(cache.path()) {
                            for setting in Setting::ALL {
                                if let Some(value) = file.get(setting) {
                                    out.directory_settings
                                        .insert(setting.name(), value.to_owned());
                                }
                            }
                        }
                    }
                    out.cap_bytes = Some(settings.cap);
                    out.max_files = settings.max_files;
                    opened.map(Some)
                } else {
                    out.cap_bytes = Some(settings.cap);
                    out.max_files = settings.max_files;
                    out.notes.push(
                        "the directory does not exist yet: the first process that uses the \
                         cache creates it (mode 0700)"
                            .into(),
                    );
                    Ok(None)
                }
            }
        },
    };
    match &opened {
        Ok(Some(cache)) => {
            out.enabled = true;
            out.trusted = Some(true);
            let fp = cache.fingerprint();
            out.key_fingerprint = Some(hex(&fp));
            out.tag = Some(if fp == [0; 8] {
                "blake3"
            } else {
                "hmac-sha256"
            });
            out.lock_timeout_s = Some(cache.lock_timeout().as_secs_f64());
        }
        Ok(None) => out.enabled = true,
        Err(e) => {
            out.trusted = matches!(e, Error::Untrusted(_)).then_some(false);
            out.error = Some(ErrorJson {
                kind: error_kind(e),
                message: error_message(e),
            });
        }
    }
    if json {
        report::json(&out);
    } else {
        print_config(&out, opened.as_ref().ok().and_then(Option::as_ref));
    }
    Ok(if out.enabled { 0 } else { 1 })
}

fn print_config(out: &ConfigJson, cache: Option<&Persistence>) {
    use report::printable;
    let none = || "none".to_owned();
    out!(
        "directory:    {}",
        printable(&out.dir.clone().unwrap_or_else(none))
    );
    if let Some(source) = out.dir_source {
        out!("chosen by:    {source}");
    }
    out!("exists:       {}", if out.exists { "yes" } else { "no" });
    let state = match (&out.error, cache) {
        (Some(e), _) => format!("off: {}", printable(&e.message)),
        (None, Some(_)) => "on: owned by this user, not writable by group or others".into(),
        (None, None) => "on once created".into(),
    };
    out!("disk tier:    {state}");
    if let Some(cache) = cache {
        let key = match (out.tag, out.key_source) {
            (Some("hmac-sha256"), source) => format!(
                "HMAC-SHA256, fingerprint {} (from {})",
                hex(&cache.fingerprint()),
                source.unwrap_or("the configuration")
            ),
            _ => "none: entries are BLAKE3-checksummed, not keyed".into(),
        };
        out!("key:          {key}");
        if let Some(cap) = out.cap_bytes {
            out!("size cap:     {}", report::size(cap));
        }
        match out.max_files {
            Some(files) => out!("file cap:     {files} entries"),
            None => out!("file cap:     none"),
        }
        out!("lock timeout: {}", report::duration(cache.lock_timeout()));
    }
    print_map(
        &out.directory_settings,
        &format!("settings:     none in the directory's {SETTINGS_FILE}"),
        &format!("settings in the directory's {SETTINGS_FILE}:"),
        " = ",
    );
    print_map(
        &out.environment,
        "environment:  no KCACHE_* variable set",
        "environment:",
        "=",
    );
    for note in &out.notes {
        out!("note: {}", printable(note));
    }
}

/// `none` when `map` is empty, else `title` and a line per entry: its name, `between`, and its
/// value made printable.
fn print_map<K: Display>(map: &BTreeMap<K, String>, none: &str, title: &str, between: &str) {
    if map.is_empty() {
        out!("{none}");
        return;
    }
    out!("{title}");
    for (name, value) in map {
        out!("  {name}{between}{}", report::printable(value));
    }
}
