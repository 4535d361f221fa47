//! How a store reads its settings from the environment: a flag is `0` or `1`, a duration a
//! number of units; what cannot be used turns the store off, or leaves a duration's default,
//! with one warning of the store's own kind.

use std::ffi::OsString;
use std::time::Duration;

use crate::disk::config::{parse_wait, saturate};
use crate::log::Warning;

/// A store's name in messages and its two warnings.
pub(crate) struct Settings {
    /// `remote tier`, `object-store tier`.
    pub tier: &'static str,
    /// A setting that cannot be used: the store is off.
    pub off: Warning,
    /// A duration that is not a number: its default is used.
    pub wait: Warning,
}

impl Settings {
    /// `None`, with the warning that the store is off and why.
    pub(crate) fn refuse<T>(&self, why: &str) -> Option<T> {
        crate::log::warn_once(self.off, || format!("{} off: {why}", self.tier));
        None
    }

    /// `0` or `1` (unset: `false`); anything else refuses the configuration.
    pub(crate) fn flag(&self, value: Option<OsString>, name: &str) -> Option<bool> {
        match value {
            None => Some(false),
            Some(v) if v == "0" => Some(false),
            Some(v) if v == "1" => Some(true),
            Some(v) => self.refuse(&format!("{name}={v:?} is neither 0 nor 1")),
        }
    }

    /// A duration: the one set in code, else the environment's `name` (a number of `unit`s),
    /// else `default`. However large, as long as possible
    /// ([`LONGEST_WAIT`](crate::disk::config::LONGEST_WAIT)); a value that is not a number is
    /// warned about once and the default is used.
    pub(crate) fn wait(
        &self,
        set: Option<Duration>,
        env: impl Fn(&str) -> Option<OsString>,
        name: &str,
        unit: Duration,
        default: Duration,
    ) -> Duration {
        if let Some(set) = set {
            return saturate(set);
        }
        let Some(text) = env(name) else {
            return default;
        };
        parse_wait(&text.to_string_lossy(), unit).unwrap_or_else(|| {
            crate::log::warn_once(self.wait, || {
                format!("{name}={text:?} is not a number: the default {default:?} is used")
            });
            default
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::config::LONGEST_WAIT;

    const TEST: Settings = Settings {
        tier: "test tier",
        off: Warning::RemoteConfig,
        wait: Warning::RemoteWait,
    };

    #[test]
    fn flags_are_0_or_1() {
        assert_eq!(TEST.flag(None, "X"), Some(false));
        assert_eq!(TEST.flag(Some("0".into()), "X"), Some(false));
        assert_eq!(TEST.flag(Some("1".into()), "X"), Some(true));
        assert_eq!(TEST.flag(Some("yes".into()), "X"), None);
    }

    #[test]
    fn durations_saturate_and_nonsense_means_the_default() {
        let env = |value: &'static str| move |_: &str| Some(OsString::from(value));
        let (s, default) = (Duration::from_secs(1), Duration::from_secs(7));
        let w = |value: &'static str| TEST.wait(None, env(value), "X", s, default);
        assert_eq!(w("42"), Duration::from_secs(42));
        assert_eq!(w("0.5"), Duration::from_millis(500));
        assert_eq!(w("1e19"), LONGEST_WAIT);
        assert_eq!(w("100000000000000000000"), LONGEST_WAIT);
        assert_eq!(w("soon"), default);
        assert_eq!(w("-1"), default);
        let set = TEST.wait(Some(Duration::MAX), env("1"), "X", s, default);
        assert_eq!(set, LONGEST_WAIT);
        assert_eq!(TEST.wait(None, |_: &str| None, "X", s, default), default);
    }
}
