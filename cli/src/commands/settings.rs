//! `kcache config get|set|unset`: the directory's settings file (`kcache.conf`), as
//! `ccache --get-config`, `--set-config` and `-M` change `ccache.conf`. The library reads,
//! checks and writes it (`kcache::disk::settings`), so the command and every process agree on
//! what it says.

use kcache::disk::settings::{self, SETTINGS_FILE, Setting, SettingsFile};

use super::Target;
use crate::Failure;

fn setting(name: &str) -> Setting {
    Setting::from_name(name).expect("clap accepts only the settings' names")
}

/// `config get`: the value as written, exit status 1 when the file does not set it.
pub fn get(target: &Target, name: &str) -> Result<u8, Failure> {
    let dir = target.existing_dir()?;
    let file = settings::load(&dir)?.unwrap_or_default();
    match file.get(setting(name)) {
        Some(value) => {
            out!("{value}");
            Ok(0)
        }
        None => Ok(1),
    }
}

/// `config set`: checks the value, then writes it; the directory is created when missing, as
/// the first process using it would.
pub fn set(target: &Target, name: &str, value: &str) -> Result<u8, Failure> {
    let dir = target.dir()?;
    let setting = setting(name);
    // Checked before the directory is created: a refused value leaves nothing behind.
    SettingsFile::default().set(setting, value)?;
    settings::edit(&dir, |file| file.set(setting, value))?;
    warn_if_overridden(setting);
    Ok(0)
}

/// `config unset`: exit status 0 whether or not the file set it.
pub fn unset(target: &Target, name: &str) -> Result<u8, Failure> {
    let dir = target.existing_dir()?;
    let setting = setting(name);
    settings::edit(&dir, |file| Ok(file.unset(setting)))?;
    warn_if_overridden(setting);
    Ok(0)
}

/// The environment wins over the directory's settings: says so when this shell sets it.
fn warn_if_overridden(setting: Setting) {
    if let Some(value) = kcache::env::var_os(setting.variable()).filter(|v| !v.is_empty()) {
        eprintln!(
            "kcache: note: {}={value:?} is set here, and overrides the directory's {} \
             (in {SETTINGS_FILE}) for the processes that have it",
            setting.variable(),
            setting.name()
        );
    }
}
