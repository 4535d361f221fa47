//! Which directory and key a subcommand works on, opened and configured as the library does.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use kcache::Error;
use kcache::disk::{DEFAULT_MAX_SIZE, OperatorKey};
use kcache::{Persistence, PersistenceConfig, persistence::DirSource};

use super::{error_message, with_context};
use crate::Failure;

/// Which directory and key the command works on: `--dir` and `--key-file`, else the
/// environment as the library reads it.
pub struct Target {
    pub dir: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

pub(super) fn source_name(source: DirSource) -> &'static str {
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
    pub(super) fn base_config(&self) -> Result<PersistenceConfig, Failure> {
        match &self.dir {
            Some(dir) => {
                let dir = std::path::absolute(dir)
                    .map_err(|e| Failure::usage(format!("--dir {}: {e}", dir.display())))?;
                Ok(PersistenceConfig::in_dir(dir))
            }
            None => Ok(PersistenceConfig::from_env()),
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
    pub(super) fn add_settings(&self, config: &mut PersistenceConfig) -> Result<Settings, Error> {
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
    pub fn open(&self) -> Result<(Persistence, Settings), Failure> {
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
        let cache = Persistence::open(config).map_err(refused)?;
        settings.with_directory(cache.path());
        Ok((cache, settings))
    }
}

/// What [`Target::add_settings`] resolved besides the configuration.
pub struct Settings {
    /// Where the key came from: `--key-file`, `KCACHE_KEY_FILE`, or none.
    pub(super) key_source: Option<&'static str>,
    env_cap: Option<u64>,
    env_max_files: Option<u64>,
    /// The cap the processes using the directory apply (unless one sets its own in code).
    pub cap: u64,
    /// The file-count cap they apply; `None`: no limit.
    pub max_files: Option<u64>,
    /// Why the processes ignore the directory's settings file, or some of its lines.
    pub(super) directory_problem: Option<String>,
}

impl Settings {
    /// Completes the caps with the settings of the directory at `dir`, as the library does
    /// when a process opens it: the environment's values first, then the directory's.
    pub(super) fn with_directory(&mut self, dir: &Path) {
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
