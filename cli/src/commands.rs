//! The subcommands. Each returns its exit status, or a [`Failure`] for stderr.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use indicatif::{ProgressBar, ProgressStyle};
use kcache::Error;
use kcache::disk::format::{ALG_BLAKE3, Header, Tagger};
use kcache::disk::settings::{SETTINGS_FILE, Setting};
use kcache::disk::{
    Check, DEFAULT_MAX_SIZE, DEFAULT_TEMP_MAX_AGE, Descriptor, DirSource, DirectoryCounters,
    DiskCache, DiskConfig, EntryInfo, Fingerprint, OperatorKey,
};
use serde::Serialize;

use crate::report::{self, Table};
use crate::{Failure, Sort};

/// Version of every `--json` schema (`docs/command.md`): bumped only when a field changes
/// meaning or goes away; fields may be added without a bump.
pub const SCHEMA: u32 = 1;

/// The backend shown for an entry whose descriptor is not known: format 1 (it has none), or
/// not verified with this process's key (another key generation, corrupt).
const UNKNOWN_BACKEND: &str = "unknown";

/// The descriptor of a checked entry, when its tag was checked and it has one.
pub fn descriptor_of(check: &Check) -> Option<&Descriptor> {
    match check {
        Check::Verified(h) | Check::StaleSchema(h) => h.descriptor.as_ref(),
        Check::OtherKey(_) | Check::Corrupt(_) | Check::Gone => None,
    }
}

/// The backend `ls --backend` and `stats` file a checked entry under.
fn backend_of(check: &Check) -> &str {
    descriptor_of(check).map_or(UNKNOWN_BACKEND, Descriptor::backend)
}

/// Which directory and key the command works on: `--dir` and `--key-file`, else the
/// environment as the library reads it.
pub struct Target {
    pub dir: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// Lowercase hex, as entry file names spell fingerprints and keys.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn source_name(source: DirSource) -> &'static str {
    match source {
        DirSource::Explicit => "--dir",
        DirSource::KcacheDir => "KCACHE_DIR",
        DirSource::XdgCacheHome => "XDG_CACHE_HOME",
        DirSource::Home => "HOME",
    }
}

fn non_empty_env(name: &str) -> Option<OsString> {
    kcache::env::var_os(name).filter(|v| !v.is_empty())
}

impl Target {
    /// The configuration's directory part: `--dir` (made absolute against the working
    /// directory, as a command-line path is expected to be), else the environment.
    fn base_config(&self) -> Result<DiskConfig, Failure> {
        match &self.dir {
            Some(dir) => {
                let dir = std::path::absolute(dir)
                    .map_err(|e| Failure::usage(format!("--dir {}: {e}", dir.display())))?;
                Ok(DiskConfig::in_dir(dir))
            }
            None => Ok(DiskConfig::from_env()),
        }
    }

    /// The directory, as every process resolves it, without opening it.
    pub fn dir(&self) -> Result<PathBuf, Failure> {
        self.base_config()?
            .locate_dir()
            .map(|(dir, _)| dir)
            .map_err(|e| Failure::usage(format!("no cache directory: {}", error_message(&e))))
    }

    /// [`Target::dir`], which must exist.
    pub fn existing_dir(&self) -> Result<PathBuf, Failure> {
        let dir = self.dir()?;
        if std::fs::symlink_metadata(&dir).is_err() {
            return Err(Failure::usage(format!(
                "the cache directory {} does not exist: nothing has been cached there",
                dir.display()
            )));
        }
        Ok(dir)
    }

    /// Adds the key (`--key-file`, else `KCACHE_KEY_FILE`, which the library ignores with
    /// `--dir`) and resolves the caps (`KCACHE_MAX_SIZE`, `KCACHE_MAX_FILES`, else the
    /// directory's settings, else the defaults: [`Settings::with_directory`]), with the
    /// library's refusals. The directory itself is opened without caps: the caps a process
    /// applies evict when it opens a directory over them, and looking at a cache must not
    /// change it.
    fn add_settings(&self, config: &mut DiskConfig) -> Result<Settings, Error> {
        let load = |path: &Path, what: &str| {
            OperatorKey::from_file(path)
                .map_err(|e| with_context(e, &format!("{what}={}", path.display())))
        };
        let key_source = if let Some(path) = &self.key_file {
            config.key = Some(load(path, "--key-file")?);
            Some("--key-file")
        } else if let Some(path) = kcache::env::var_os("KCACHE_KEY_FILE") {
            // Without `--dir` the library reads it itself, refusing an empty value too.
            if self.dir.is_some() && !path.is_empty() {
                config.key = Some(load(Path::new(&path), "KCACHE_KEY_FILE")?);
            }
            Some("KCACHE_KEY_FILE")
        } else {
            None
        };
        let env_cap = match non_empty_env("KCACHE_MAX_SIZE") {
            None => None,
            Some(text) => {
                let text = text.to_string_lossy();
                match kcache::disk::parse_size(&text) {
                    Ok(size) if size > 0 => Some(size),
                    _ => {
                        return Err(Error::Unavailable(format!(
                            "KCACHE_MAX_SIZE={text:?} is not a positive size (bytes, or with a \
                             unit: k, M, G, T, Ki, Mi, Gi, Ti): the disk tier is off"
                        )));
                    }
                }
            }
        };
        let env_max_files = match non_empty_env("KCACHE_MAX_FILES") {
            None => None,
            Some(text) => {
                let text = text.to_string_lossy();
                match text.trim().parse::<u64>() {
                    Ok(files) => Some(files),
                    Err(_) => {
                        return Err(Error::Unavailable(format!(
                            "KCACHE_MAX_FILES={text:?} is not a number of files (0: no limit): \
                             the disk tier is off"
                        )));
                    }
                }
            }
        };
        config.max_size = Some(u64::MAX);
        config.max_files = Some(0);
        Ok(Settings {
            key_source,
            env_cap,
            env_max_files,
            cap: env_cap.unwrap_or(DEFAULT_MAX_SIZE),
            max_files: env_max_files.filter(|&f| f > 0),
            directory_problem: None,
        })
    }

    /// Opens the directory as the library does. A directory that does not exist is an error
    /// rather than created: nothing has been cached there, and a mistyped `--dir` should say
    /// so instead of leaving an empty cache behind.
    pub fn open(&self) -> Result<(DiskCache, Settings), Failure> {
        let mut config = self.base_config()?;
        let (dir, source) = config
            .locate_dir()
            .map_err(|e| Failure::usage(format!("no cache directory: {}", error_message(&e))))?;
        if std::fs::symlink_metadata(&dir).is_err() {
            return Err(Failure::usage(format!(
                "the cache directory {} (from {}) does not exist: nothing has been cached there",
                dir.display(),
                source_name(source)
            )));
        }
        let refused = |e: Error| {
            Failure::usage(format!(
                "cannot use the cache directory {} (from {}): {}",
                dir.display(),
                source_name(source),
                error_message(&e)
            ))
        };
        let mut settings = self.add_settings(&mut config).map_err(refused)?;
        let cache = DiskCache::open(config).map_err(refused)?;
        settings.with_directory(cache.path());
        Ok((cache, settings))
    }
}

/// What [`Target::add_settings`] resolved besides the configuration.
pub struct Settings {
    /// Where the key came from: `--key-file`, `KCACHE_KEY_FILE`, or none.
    key_source: Option<&'static str>,
    env_cap: Option<u64>,
    env_max_files: Option<u64>,
    /// The cap the processes using the directory apply (unless one sets its own in code).
    pub cap: u64,
    /// The file-count cap they apply; `None`: no limit.
    pub max_files: Option<u64>,
    /// Why the processes ignore the directory's settings file, or some of its lines.
    directory_problem: Option<String>,
}

impl Settings {
    /// Completes the caps with the settings of the directory at `dir`, as the library does
    /// when a process opens it: the environment's values first, then the directory's.
    fn with_directory(&mut self, dir: &Path) {
        let (file, problems) = match kcache::disk::settings::load(dir) {
            Ok(file) => file.unwrap_or_default().settings(),
            Err(e) => {
                self.directory_problem = Some(format!("ignored: {}", error_message(&e)));
                return;
            }
        };
        if !problems.is_empty() {
            self.directory_problem = Some(format!("lines ignored: {}", problems.join("; ")));
        }
        self.cap = self.env_cap.or(file.max_size).unwrap_or(DEFAULT_MAX_SIZE);
        self.max_files = self.env_max_files.or(file.max_files).filter(|&f| f > 0);
    }
}

/// `e` with `what` before its message, same kind.
fn with_context(e: Error, what: &str) -> Error {
    match e {
        Error::Untrusted(m) => Error::Untrusted(format!("{what}: {m}")),
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        Error::Io(m) => Error::Io(format!("{what}: {m}")),
        Error::Unavailable(m) => Error::Unavailable(format!("{what}: {m}")),
        other => other,
    }
}

/// The error's own message, without the variant's prefix where the variant is named apart.
fn error_message(e: &Error) -> String {
    match e {
        Error::Unavailable(m) | Error::Io(m) | Error::InvalidArgument(m) => m.clone(),
        Error::Untrusted(m) => format!("untrusted: {m}"),
        other => other.to_string(),
    }
}

fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Unavailable(_) => "unavailable",
        Error::Untrusted(_) => "untrusted",
        Error::InvalidArgument(_) => "invalid-argument",
        Error::Io(_) => "io",
        _ => "other",
    }
}

// --- config -------------------------------------------------------------------------------

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
                    let opened = DiskCache::open(config);
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

fn print_config(out: &ConfigJson, cache: Option<&DiskCache>) {
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
    if out.directory_settings.is_empty() {
        out!("settings:     none in the directory's {SETTINGS_FILE}");
    } else {
        out!("settings in the directory's {SETTINGS_FILE}:");
        for (name, value) in &out.directory_settings {
            out!("  {name} = {}", printable(value));
        }
    }
    if out.environment.is_empty() {
        out!("environment:  no KCACHE_* variable set");
    } else {
        out!("environment:");
        for (name, value) in &out.environment {
            out!("  {name}={}", printable(value));
        }
    }
    for note in &out.notes {
        out!("note: {}", printable(note));
    }
}

// --- stats --------------------------------------------------------------------------------

#[derive(Serialize)]
pub struct StatsJson {
    schema: u32,
    dir: String,
    pub cap_bytes: u64,
    /// The file-count cap; `null` without one.
    pub max_files: Option<u64>,
    pub entries: u64,
    pub bytes: u64,
    pub generations: Vec<GenerationJson>,
    pub backends: Vec<BackendJson>,
    oldest_used_unix_ns: Option<u64>,
    newest_used_unix_ns: Option<u64>,
    pub counters: CountersJson,
    memory_hit_rate: Option<f64>,
    disk_hit_rate: Option<f64>,
    remote_hit_rate: Option<f64>,
    counters_zeroed_unix_ns: Option<u64>,
    counter_shards: u32,
    counter_shards_ignored: u32,
}

/// `DirectoryCounters`, field for field.
#[derive(Serialize)]
pub struct CountersJson {
    pub memory_hits: u64,
    pub memory_misses: u64,
    pub disk_hits: u64,
    pub disk_misses: u64,
    pub builds: u64,
    pub disk_writes: u64,
    pub integrity_rejects: u64,
    pub evictions: u64,
    pub lock_waits: u64,
    pub lock_timeouts: u64,
    pub lock_takeovers: u64,
    pub failed_writes: u64,
    pub remote_hits: u64,
    pub remote_misses: u64,
    pub remote_rejects: u64,
    pub remote_errors: u64,
    pub remote_timeouts: u64,
    pub remote_skipped: u64,
    pub remote_breaker_trips: u64,
    pub remote_leases: u64,
    pub remote_lease_waits: u64,
    pub remote_lease_timeouts: u64,
    pub remote_puts: u64,
    pub remote_bytes_read: u64,
    pub remote_bytes_written: u64,
}

impl From<DirectoryCounters> for CountersJson {
    fn from(c: DirectoryCounters) -> CountersJson {
        CountersJson {
            memory_hits: c.memory_hits,
            memory_misses: c.memory_misses,
            disk_hits: c.disk_hits,
            disk_misses: c.disk_misses,
            builds: c.builds,
            disk_writes: c.disk_writes,
            integrity_rejects: c.integrity_rejects,
            evictions: c.evictions,
            lock_waits: c.lock_waits,
            lock_timeouts: c.lock_timeouts,
            lock_takeovers: c.lock_takeovers,
            failed_writes: c.failed_writes,
            remote_hits: c.remote_hits,
            remote_misses: c.remote_misses,
            remote_rejects: c.remote_rejects,
            remote_errors: c.remote_errors,
            remote_timeouts: c.remote_timeouts,
            remote_skipped: c.remote_skipped,
            remote_breaker_trips: c.remote_breaker_trips,
            remote_leases: c.remote_leases,
            remote_lease_waits: c.remote_lease_waits,
            remote_lease_timeouts: c.remote_lease_timeouts,
            remote_puts: c.remote_puts,
            remote_bytes_read: c.remote_bytes_read,
            remote_bytes_written: c.remote_bytes_written,
        }
    }
}

#[derive(Serialize)]
pub struct BackendJson {
    pub backend: String,
    pub entries: u64,
    pub bytes: u64,
}

#[derive(Serialize)]
pub struct GenerationJson {
    fingerprint: String,
    pub current: bool,
    pub entries: u64,
    pub bytes: u64,
}

/// What `stats` (and `metrics`) report of the directory, with the least and most recent use.
pub fn directory_stats(
    target: &Target,
) -> Result<(StatsJson, Option<SystemTime>, Option<SystemTime>), Failure> {
    let (cache, settings) = target.open()?;
    let entries: Vec<EntryInfo> = cache.entries()?.into_iter().filter(|e| e.regular).collect();
    let current = cache.fingerprint();
    let mut generations: BTreeMap<(bool, Fingerprint), (u64, u64)> = BTreeMap::new();
    for e in &entries {
        let g = generations
            .entry((e.fingerprint != current, e.fingerprint))
            .or_default();
        g.0 += 1;
        g.1 += e.size;
    }
    // Per backend as each entry's verified descriptor says: every entry is read whole.
    let mut backends: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for e in &entries {
        let check = cache.check(e);
        if check == Check::Gone {
            continue;
        }
        let b = backends.entry(backend_of(&check).to_owned()).or_default();
        b.0 += 1;
        b.1 += e.size;
    }
    let oldest = entries.iter().map(|e| e.modified).min();
    let newest = entries.iter().map(|e| e.modified).max();
    let persisted = cache.directory_stats()?;
    let out = StatsJson {
        schema: SCHEMA,
        dir: cache.path().display().to_string(),
        cap_bytes: settings.cap,
        max_files: settings.max_files,
        entries: entries.len() as u64,
        bytes: entries.iter().map(|e| e.size).sum(),
        generations: generations
            .iter()
            .map(|(&(other, fp), &(entries, bytes))| GenerationJson {
                fingerprint: hex(&fp),
                current: !other,
                entries,
                bytes,
            })
            .collect(),
        backends: backends
            .into_iter()
            .map(|(backend, (entries, bytes))| BackendJson {
                backend,
                entries,
                bytes,
            })
            .collect(),
        oldest_used_unix_ns: oldest.map(report::unix_nanos),
        newest_used_unix_ns: newest.map(report::unix_nanos),
        counters: persisted.counters.into(),
        memory_hit_rate: persisted.counters.memory_hit_rate(),
        disk_hit_rate: persisted.counters.disk_hit_rate(),
        remote_hit_rate: persisted.counters.remote_hit_rate(),
        counters_zeroed_unix_ns: persisted.last_zeroed.map(report::unix_nanos),
        counter_shards: persisted.shards,
        counter_shards_ignored: persisted.shards_ignored,
    };
    Ok((out, oldest, newest))
}

pub fn stats(target: &Target, json: bool) -> Result<u8, Failure> {
    let (out, oldest, newest) = directory_stats(target)?;
    if json {
        report::json(&out);
        return Ok(0);
    }
    let now = SystemTime::now();
    out!("directory:  {}", out.dir);
    out!(
        "entries:    {} ({}), cap {} ({:.1} % used)",
        out.entries,
        report::size(out.bytes),
        report::size(out.cap_bytes),
        out.bytes as f64 * 100.0 / out.cap_bytes as f64
    );
    if let (Some(oldest), Some(newest)) = (oldest, newest) {
        out!("least recently used: {}", report::time(oldest, now));
        out!("most recently used:  {}", report::time(newest, now));
    }
    if !out.generations.is_empty() {
        out!("key generations:");
        let mut table = Table::new(&[
            ("  FINGERPRINT", false),
            ("ENTRIES", true),
            ("SIZE", true),
            ("", false),
        ]);
        for g in &out.generations {
            table.row(vec![
                format!("  {}", g.fingerprint),
                g.entries.to_string(),
                report::size(g.bytes),
                generation_note(g.current, &g.fingerprint),
            ]);
        }
        table.print();
    }
    if !out.backends.is_empty() {
        out!("backends:");
        let mut table = Table::new(&[("  BACKEND", false), ("ENTRIES", true), ("SIZE", true)]);
        for b in &out.backends {
            table.row(vec![
                format!("  {}", report::printable(&b.backend)),
                b.entries.to_string(),
                report::size(b.bytes),
            ]);
        }
        table.print();
    }
    let zeroed = out
        .counters_zeroed_unix_ns
        .map(|ns| std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns));
    print_counters(&out, zeroed, now);
    Ok(0)
}

/// The directory's counters, for people.
fn print_counters(out: &StatsJson, zeroed: Option<SystemTime>, now: SystemTime) {
    let c = &out.counters;
    let since = zeroed.map_or("since the directory was first used".into(), |t| {
        format!("since zeroed {}", report::time(t, now))
    });
    let rate =
        |r: Option<f64>| r.map_or("no lookups".into(), |r| format!("{:.1} % hits", r * 100.0));
    out!("counters of every process ({since}):");
    out!(
        "  memory lookups  {} hits, {} misses ({})",
        c.memory_hits,
        c.memory_misses,
        rate(out.memory_hit_rate)
    );
    out!(
        "  disk reads      {} hits, {} misses ({})",
        c.disk_hits,
        c.disk_misses,
        rate(out.disk_hit_rate)
    );
    out!(
        "  builds {}, disk writes {}, failed writes {}",
        c.builds,
        c.disk_writes,
        c.failed_writes
    );
    out!(
        "  integrity rejects {}, evictions {}",
        c.integrity_rejects,
        c.evictions
    );
    out!(
        "  waits for another process {}, timed out {}, taken over {}",
        c.lock_waits,
        c.lock_timeouts,
        c.lock_takeovers
    );
    out!(
        "  remote reads    {} hits, {} misses ({}), {} rejects",
        c.remote_hits,
        c.remote_misses,
        rate(out.remote_hit_rate),
        c.remote_rejects
    );
    out!(
        "  remote errors {}, timeouts {}, skipped {}, breaker trips {}",
        c.remote_errors,
        c.remote_timeouts,
        c.remote_skipped,
        c.remote_breaker_trips
    );
    out!(
        "  remote writes {} ({} written, {} read), leases {}, lease waits {}, timed out {}",
        c.remote_puts,
        report::size(c.remote_bytes_written),
        report::size(c.remote_bytes_read),
        c.remote_leases,
        c.remote_lease_waits,
        c.remote_lease_timeouts
    );
    if out.counter_shards_ignored > 0 {
        out!(
            "  counter files damaged or foreign, counted as zero: {}",
            out.counter_shards_ignored
        );
    }
}

// --- zero-stats ---------------------------------------------------------------------------

#[derive(Serialize)]
struct ZeroJson {
    schema: u32,
    dir: String,
    zeroed_unix_ns: u64,
    /// Counter files that could not be zeroed, each with why.
    not_zeroed: Vec<NotDoneJson>,
}

/// A name a command could not remove or zero, and why.
#[derive(Serialize)]
struct NotDoneJson {
    name: String,
    error: String,
}

/// The exit status of a command that went through everything but could not remove or zero
/// some of it (`clear`, `zero-stats`, `gc`): each such name is on stderr.
const PARTIAL: u8 = 3;

/// Says on stderr what could not be done, one line per name, and returns the exit status.
fn partial_status(what: &str, left: &[NotDoneJson]) -> u8 {
    for n in left {
        eprintln!("kcache: cannot {what} {}: {}", n.name, n.error);
    }
    if left.is_empty() { 0 } else { PARTIAL }
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

fn generation_note(current: bool, fingerprint: &str) -> String {
    match (current, fingerprint.bytes().all(|b| b == b'0')) {
        (true, true) => "this configuration (unkeyed)".into(),
        (true, false) => "this key".into(),
        (false, true) => "unkeyed: gc removes it".into(),
        (false, false) => "another key: gc removes it unless --retain-key".into(),
    }
}

// --- ls -----------------------------------------------------------------------------------

#[derive(Serialize)]
struct LsJson {
    schema: u32,
    dir: String,
    entries: Vec<EntryJson>,
}

#[derive(Serialize)]
struct EntryJson {
    name: String,
    key: String,
    fingerprint: String,
    current: bool,
    /// The descriptor's backend, `unknown` without a verified descriptor.
    backend: String,
    device: Option<String>,
    entry_name: Option<String>,
    size: u64,
    status: &'static str,
    reason: Option<&'static str>,
    build_time_ns: Option<u64>,
    last_used_unix_ns: u64,
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

fn entry_json(cache: &DiskCache, entry: &EntryInfo, check: &Check) -> EntryJson {
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

// --- inspect ------------------------------------------------------------------------------

#[derive(Serialize)]
struct InspectJson {
    schema: u32,
    #[serde(flatten)]
    entry: EntryJson,
    header: Option<HeaderJson>,
}

#[derive(Serialize)]
struct HeaderJson {
    format_version: u16,
    tag: &'static str,
    key_schema: u32,
    fingerprint: String,
    key: String,
    payload_len: u64,
    build_time_ns: u64,
}

/// Finds the entry `spec` names: an entry file name, or a key (or a unique prefix of one) in
/// hex, of any key generation.
fn find_entry(cache: &DiskCache, spec: &str) -> Result<EntryInfo, Failure> {
    if spec.ends_with(".kce") {
        return cache.entry(spec)?.ok_or_else(|| {
            Failure::usage(format!("no entry {spec} in {}", cache.path().display()))
        });
    }
    let prefix = spec.to_ascii_lowercase();
    if prefix.is_empty() || prefix.len() > 64 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Failure::usage(format!(
            "{spec:?} is neither an entry file name nor a key in hex"
        )));
    }
    let mut found: Vec<EntryInfo> = cache
        .entries()?
        .into_iter()
        .filter(|e| e.key.to_hex().starts_with(&prefix))
        .collect();
    match found.len() {
        0 => Err(Failure::usage(format!(
            "no entry whose key starts with {prefix} in {}",
            cache.path().display()
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(Failure::usage(format!(
            "{prefix} names {} entries; give more of the key or a file name: {}",
            found.len(),
            found
                .iter()
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `kcache inspect`: exit status 1 when the entry is corrupt.
pub fn inspect(target: &Target, spec: &str, json: bool) -> Result<u8, Failure> {
    let (cache, _) = target.open()?;
    let entry = find_entry(&cache, spec)?;
    let check = cache.check(&entry);
    if check == Check::Gone {
        return Err(Failure::usage(format!(
            "{} was removed or replaced while read",
            entry.name
        )));
    }
    let header = match &check {
        Check::Verified(h) | Check::StaleSchema(h) | Check::OtherKey(h) => Some(HeaderJson {
            format_version: h.version,
            tag: if h.algorithm == ALG_BLAKE3 {
                "blake3"
            } else {
                "hmac-sha256"
            },
            key_schema: h.schema,
            fingerprint: hex(&h.fingerprint),
            key: h.key.to_hex(),
            payload_len: h.payload_len,
            build_time_ns: h.build_nanos,
        }),
        Check::Corrupt(_) | Check::Gone => None,
    };
    let status = u8::from(matches!(check, Check::Corrupt(_)));
    let out = InspectJson {
        schema: SCHEMA,
        entry: entry_json(&cache, &entry, &check),
        header,
    };
    if json {
        report::json(&out);
        return Ok(status);
    }
    let verdict = match &check {
        Check::Verified(_) => "verified: tag checked with this process's key".to_owned(),
        Check::StaleSchema(_) => {
            "verified, but written under another key schema: unreachable, gc removes it".into()
        }
        Check::OtherKey(_) => {
            "another key generation: structure checked, tag not (this process lacks its key)".into()
        }
        Check::Corrupt(reason) => format!("corrupt: {reason}"),
        Check::Gone => unreachable!("returned above"),
    };
    use report::printable;
    out!("file:           {}", printable(&entry.name));
    out!("size:           {}", report::size_and_bytes(entry.size));
    out!(
        "last used:      {} (written or read)",
        report::time(entry.modified, SystemTime::now())
    );
    out!("status:         {verdict}");
    out!("backend:        {}", printable(&out.entry.backend));
    if let (Some(device), Some(name)) = (&out.entry.device, &out.entry.entry_name) {
        out!("device:         {}", printable(device));
        out!("name:           {}", printable(name));
    }
    if let Some(h) = &out.header {
        out!("format version: {}", h.format_version);
        out!("tag:            {}", h.tag);
        out!("key schema:     {}", h.key_schema);
        out!("fingerprint:    {}", h.fingerprint);
        out!("key:            {}", h.key);
        out!("payload:        {}", report::size_and_bytes(h.payload_len));
        out!(
            "build time:     {}",
            report::duration(Duration::from_nanos(h.build_time_ns))
        );
    }
    Ok(status)
}

// --- verify -------------------------------------------------------------------------------

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

// --- gc -----------------------------------------------------------------------------------

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

// --- clear --------------------------------------------------------------------------------

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
