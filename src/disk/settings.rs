//! Settings kept in the cache directory, in `kcache.conf`, as ccache keeps its own in
//! `ccache.conf`: an operator sets the size cap once (`kcache config set max-size 5G`) and
//! every process that opens the directory applies it. Values set in code win over the
//! environment, which wins over this file, which wins over the defaults.
//!
//! The format is ccache's: one `name = value` per line, blank lines and lines starting with
//! `#` ignored, names with `-` or `_` alike (`max-size`, `max_size`). It is split at the first
//! `=` of each line, which needs no parser crate; TOML (the common crate-parsed choice) would
//! make operators quote sizes (`max-size = "5G"`), unlike ccache, and bring a parser and serde
//! into every process that links the library.
//!
//! The file is trusted as the directory's other files are: read through the directory
//! descriptor checked at open, with `O_NOFOLLOW` and `O_NONBLOCK`; it must be a regular file
//! owned by the effective user and not writable by group or others, of at most
//! [`MAX_SETTINGS_LEN`] bytes. A file that fails those checks, or a line that cannot be used,
//! is ignored with one warning per process: the directory's settings never keep a process
//! from using its cache. Edits ([`edit`]) are written to a
//! temporary file and renamed over it, under an `flock` of the directory, so a reader sees
//! the old file or the new one and two edits never lose one another.

use std::fmt;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use super::config::parse_wait;
use crate::error::{Error, Result};
use crate::log::{Warning, warn_once};

/// The file's name in the cache directory.
pub const SETTINGS_FILE: &str = "kcache.conf";

/// The longest settings file read: a few lines are expected; this bounds what a process reads.
pub const MAX_SETTINGS_LEN: u64 = 64 << 10;

/// A setting an operator keeps in the directory.
///
/// Those are the ones that describe the cache rather than one process: its size and file
/// caps, how long processes sharing it wait for one another's builds, and whether its entries
/// must be keyed. The directory itself (`KCACHE_DIR`) cannot be, the operator key
/// (`KCACHE_KEY_FILE`) is a per-process secret that is rotated process by process, the
/// libraries' paths would make a file in the directory choose code to load, and a shared
/// store's URL may hold a password.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// The size cap, a size ([`super::parse_size`]); `KCACHE_MAX_SIZE`.
    MaxSize,
    /// The most entry files the directory holds; 0 for no limit; `KCACHE_MAX_FILES`.
    MaxFiles,
    /// How long a miss waits for another process building the same entry, in seconds;
    /// `KCACHE_LOCK_TIMEOUT`.
    LockTimeout,
    /// Whether an operator key is required (`true`/`false`); `KCACHE_REQUIRE_KEY`. A process
    /// requires one when its code, its environment or the directory does.
    RequireKey,
}

impl Setting {
    pub const ALL: [Setting; 4] = [
        Setting::MaxSize,
        Setting::MaxFiles,
        Setting::LockTimeout,
        Setting::RequireKey,
    ];

    /// The setting's name in the file and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Setting::MaxSize => "max-size",
            Setting::MaxFiles => "max-files",
            Setting::LockTimeout => "lock-timeout",
            Setting::RequireKey => "require-key",
        }
    }

    /// The environment variable that overrides it.
    pub fn variable(self) -> &'static str {
        match self {
            Setting::MaxSize => "KCACHE_MAX_SIZE",
            Setting::MaxFiles => "KCACHE_MAX_FILES",
            Setting::LockTimeout => "KCACHE_LOCK_TIMEOUT",
            Setting::RequireKey => "KCACHE_REQUIRE_KEY",
        }
    }

    /// The setting `name` names, `_` taken as `-` (ccache's spelling), any case.
    pub fn from_name(name: &str) -> Option<Setting> {
        let name = name.trim().to_ascii_lowercase().replace('_', "-");
        Setting::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Checks `value` and adds it to `settings`; the error says what the setting takes.
    fn apply(self, value: &str, settings: &mut Settings) -> std::result::Result<(), String> {
        let value = value.trim();
        let refused = |takes: &str| format!("{} = {value:?}: {takes}", self.name());
        match self {
            Setting::MaxSize => match super::parse_size(value) {
                Ok(size) if size > 0 => settings.max_size = Some(size),
                _ => {
                    return Err(refused(
                        "not a positive size (bytes, or with a unit: k, M, G, T, Ki, Mi, Gi, Ti)",
                    ));
                }
            },
            Setting::MaxFiles => match value.parse::<u64>() {
                Ok(files) => settings.max_files = Some(files),
                Err(_) => return Err(refused("not a number of files (0: no limit)")),
            },
            Setting::LockTimeout => match parse_wait(value, Duration::from_secs(1)) {
                Some(wait) => settings.lock_timeout = Some(wait),
                None => return Err(refused("not a number of seconds")),
            },
            Setting::RequireKey => match parse_bool(value) {
                Some(required) => settings.require_key = Some(required),
                None => return Err(refused("neither true nor false")),
            },
        }
        Ok(())
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `true`, `false`, and the other spellings people write (`1`, `yes`, `on`, …), any case.
fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// The values a directory's file sets; `None` for those it leaves to the defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub max_size: Option<u64>,
    /// `Some(0)`: no limit.
    pub max_files: Option<u64>,
    pub lock_timeout: Option<Duration>,
    pub require_key: Option<bool>,
}

/// A settings file as written, comments and unknown lines kept, so that editing one setting
/// leaves the rest of what the operator wrote as it was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettingsFile {
    lines: Vec<String>,
}

/// A line's setting name and value, if it is a `name = value` line.
fn split(line: &str) -> Option<(&str, &str)> {
    let trimmed = line.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return None;
    }
    Some(
        trimmed
            .split_once('=')
            .map_or((trimmed, ""), |(n, v)| (n.trim(), v.trim())),
    )
}

impl SettingsFile {
    pub fn parse(text: &str) -> SettingsFile {
        SettingsFile {
            lines: text.lines().map(str::to_owned).collect(),
        }
    }

    /// The settings the file makes, later lines winning, and what was wrong with the lines
    /// that were ignored (one message each, with its line number).
    pub fn settings(&self) -> (Settings, Vec<String>) {
        let mut settings = Settings::default();
        let mut problems = Vec::new();
        for (number, line) in self.lines.iter().enumerate() {
            let Some((name, value)) = split(line) else {
                continue;
            };
            let problem = match Setting::from_name(name) {
                None if !line.contains('=') => format!("{line:?} is not `name = value`"),
                None => format!("{name:?} is no setting"),
                Some(setting) => match setting.apply(value, &mut settings) {
                    Ok(()) => continue,
                    Err(problem) => problem,
                },
            };
            problems.push(format!("line {}: {problem}", number + 1));
        }
        (settings, problems)
    }

    /// The value the file gives `setting` (its last line), as written.
    pub fn get(&self, setting: Setting) -> Option<&str> {
        self.lines
            .iter()
            .rev()
            .filter_map(|line| split(line))
            .find(|(name, _)| Setting::from_name(name) == Some(setting))
            .map(|(_, value)| value)
    }

    /// Sets `setting` to `value`, which is checked first (`InvalidArgument` says what it
    /// takes): the first line of the setting is replaced, later ones are removed, and a
    /// setting the file did not have is added at the end.
    pub fn set(&mut self, setting: Setting, value: &str) -> Result<()> {
        setting
            .apply(value, &mut Settings::default())
            .map_err(Error::InvalidArgument)?;
        let line = format!("{} = {}", setting.name(), value.trim());
        match self.position(setting) {
            Some(first) => {
                self.remove_from(setting, first + 1);
                self.lines[first] = line;
            }
            None => self.lines.push(line),
        }
        Ok(())
    }

    /// Removes every line of `setting`; whether there was one.
    pub fn unset(&mut self, setting: Setting) -> bool {
        let had = self.position(setting).is_some();
        self.remove_from(setting, 0);
        had
    }

    fn is_line_of(line: &str, setting: Setting) -> bool {
        split(line).is_some_and(|(name, _)| Setting::from_name(name) == Some(setting))
    }

    fn position(&self, setting: Setting) -> Option<usize> {
        self.lines.iter().position(|l| Self::is_line_of(l, setting))
    }

    fn remove_from(&mut self, setting: Setting, start: usize) {
        let mut index = 0;
        self.lines.retain(|line| {
            index += 1;
            index <= start || !Self::is_line_of(line, setting)
        });
    }

    /// The file's text, one line each, newline-terminated.
    pub fn text(&self) -> String {
        self.lines.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// The directory's settings file, or `None` when it has none. Errors: `Untrusted` (not a
/// regular file, a symbolic link, another owner, writable by group or others), `Io`,
/// `InvalidArgument` (too long, not UTF-8).
pub(crate) fn read(dir: &OwnedFd, dir_path: &Path) -> Result<Option<SettingsFile>> {
    let shown = dir_path.join(SETTINGS_FILE);
    let shown = shown.display();
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, SETTINGS_FILE, flags | OFlags::NOCTTY, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::LOOP) => {
            return Err(Error::Untrusted(format!("{shown} is a symbolic link")));
        }
        Err(e) => return Err(Error::Io(format!("cannot open {shown}: {e}"))),
    };
    let mut file = std::fs::File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| Error::Io(format!("cannot read {shown}: {e}")))?;
    let euid = rustix::process::geteuid().as_raw();
    if !meta.is_file() {
        return Err(Error::Untrusted(format!("{shown} is not a regular file")));
    }
    if meta.uid() != euid {
        return Err(Error::Untrusted(format!(
            "{shown} is owned by uid {}, not by the effective user {euid}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Error::Untrusted(format!(
            "{shown} is writable by group or others (mode {:o})",
            meta.mode() & 0o7777
        )));
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_SETTINGS_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::Io(format!("cannot read {shown}: {e}")))?;
    if bytes.len() as u64 > MAX_SETTINGS_LEN {
        return Err(Error::InvalidArgument(format!(
            "{shown} is longer than {MAX_SETTINGS_LEN} bytes"
        )));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| Error::InvalidArgument(format!("{shown} is not UTF-8 text")))?;
    Ok(Some(SettingsFile::parse(&text)))
}

/// What a process opening the directory applies from its file: what [`read`] finds, with
/// one warning per process for a file it cannot use (then nothing applies) or for the lines
/// it ignores.
pub(crate) fn applied(dir: &OwnedFd, dir_path: &Path) -> Settings {
    match read(dir, dir_path) {
        Ok(None) => Settings::default(),
        Ok(Some(file)) => {
            let (settings, problems) = file.settings();
            if !problems.is_empty() {
                warn_once(Warning::Settings, || {
                    format!(
                        "{}: ignored {}",
                        dir_path.join(SETTINGS_FILE).display(),
                        problems.join("; ")
                    )
                });
            }
            settings
        }
        Err(e) => {
            warn_once(Warning::Settings, || {
                format!("the directory's settings are ignored: {e}")
            });
            Settings::default()
        }
    }
}

/// The settings file of the cache directory `dir_path` as written (`None` when it has none),
/// for operators' tools. The directory is opened with the trust checks of every opening
/// (and created, private, when missing); an untrusted file is an error here, for the operator
/// to fix.
pub fn load(dir_path: &Path) -> Result<Option<SettingsFile>> {
    read(&super::dir::open_trusted(dir_path)?, dir_path)
}

/// Changes the settings file of the cache directory `dir_path` (opened as by [`load`]):
/// `edit` gets it as written (empty when absent) and, when it succeeds, the file is replaced
/// atomically. Edits from any process are serialized by an exclusive `flock` of the directory
/// that only they take: readers never wait, and see the whole old file or the whole new one.
/// Processes that open the directory afterwards apply the new settings; open ones keep theirs.
pub fn edit<T>(dir_path: &Path, edit: impl FnOnce(&mut SettingsFile) -> Result<T>) -> Result<T> {
    let dir = super::dir::open_trusted(dir_path)?;
    let dir = &dir;
    let io = |what: &str, e: std::io::Error| {
        Error::Io(format!("cannot {what} {}: {e}", dir_path.display()))
    };
    rustix::fs::flock(dir, FlockOperation::LockExclusive).map_err(|e| io("lock", e.into()))?;
    let mut file = read(dir, dir_path)?.unwrap_or_default();
    let outcome = edit(&mut file)?;
    write(dir, &file.text()).map_err(|e| io("write the settings of", e))?;
    // Closing the descriptor would release the lock too; the directory's stays open.
    rustix::fs::flock(dir, FlockOperation::Unlock).map_err(|e| io("unlock", e.into()))?;
    Ok(outcome)
}

/// Writes `text` to a new private temporary file in the directory, flushes it, renames it
/// over the settings file and flushes the directory.
fn write(dir: &OwnedFd, text: &str) -> std::io::Result<()> {
    let temp = format!(".{SETTINGS_FILE}.{}.tmp", std::process::id());
    let fd = rustix::fs::openat(
        dir,
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let written = (|| {
        let mut file = std::fs::File::from(fd);
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        rustix::fs::renameat(dir, temp.as_str(), dir, SETTINGS_FILE)?;
        rustix::fs::fsync(dir)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, temp.as_str(), rustix::fs::AtFlags::empty());
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_sets_what_its_lines_say_and_reports_the_rest() {
        let file = SettingsFile::parse(
            "# the team's cache\n\
             max_size = 5G\n\
             \n\
             max-files=1000\n\
             lock-timeout = 0.5\n\
             require-key = yes\n\
             colour = blue\n\
             max-size = lots\n\
             nonsense\n",
        );
        let (settings, problems) = file.settings();
        assert_eq!(
            settings,
            Settings {
                max_size: Some(5_000_000_000),
                max_files: Some(1000),
                lock_timeout: Some(Duration::from_millis(500)),
                require_key: Some(true),
            }
        );
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems[0].starts_with("line 7: \"colour\""),
            "{problems:?}"
        );
        assert!(problems[1].starts_with("line 8: max-size"), "{problems:?}");
        assert!(problems[2].starts_with("line 9:"), "{problems:?}");
        assert_eq!(file.get(Setting::MaxSize), Some("lots"));
        assert_eq!(file.get(Setting::MaxFiles), Some("1000"));
    }

    #[test]
    fn editing_keeps_the_other_lines() {
        let mut file =
            SettingsFile::parse("# keep me\nmax_size = 5G\nmax-files = 3\nmax-size = 6G\n");
        file.set(Setting::MaxSize, " 1.5Gi ").unwrap();
        assert_eq!(file.text(), "# keep me\nmax-size = 1.5Gi\nmax-files = 3\n");
        assert!(file.set(Setting::MaxSize, "0").is_err());
        assert!(file.set(Setting::MaxFiles, "many").is_err());
        assert!(file.unset(Setting::MaxFiles));
        assert!(!file.unset(Setting::MaxFiles));
        file.set(Setting::RequireKey, "true").unwrap();
        assert_eq!(
            file.text(),
            "# keep me\nmax-size = 1.5Gi\nrequire-key = true\n"
        );
        assert_eq!(
            Setting::from_name("LOCK_TIMEOUT"),
            Some(Setting::LockTimeout)
        );
        assert_eq!(Setting::from_name("max-sizes"), None);
    }
}
