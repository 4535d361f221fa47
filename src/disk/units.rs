//! The sizes and waits kcache reads from text (the environment, settings files): parsed as
//! ccache writes sizes, and waits kept up to a century.

use std::time::Duration;

use crate::error::{Error, Result};

/// The longest wait or timeout kcache keeps: a century. A longer one, from the environment or
/// from code (`Duration::MAX` included), is taken as this: "as long as possible", far past any
/// process's life, yet small enough that a deadline computed from it never overflows.
pub const LONGEST_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `wait`, or [`LONGEST_WAIT`] when longer.
pub(crate) fn saturate(wait: Duration) -> Duration {
    wait.min(LONGEST_WAIT)
}

/// A duration from the environment, a non-negative number of `unit`s (decimals and exponents
/// allowed; `inf` too): `None` for anything else, which the caller warns about and replaces by
/// its default. However large, the value is kept, up to [`LONGEST_WAIT`].
pub(crate) fn parse_wait(text: &str, unit: Duration) -> Option<Duration> {
    let text = text.trim();
    // Whole numbers exactly, whatever their size; others through a float.
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let Ok(units) = text.parse::<u64>() else {
            return Some(LONGEST_WAIT); // more digits than a u64 holds
        };
        let nanos = unit.as_nanos().saturating_mul(u128::from(units));
        return Some(match u64::try_from(nanos) {
            Ok(nanos) => saturate(Duration::from_nanos(nanos)),
            Err(_) => LONGEST_WAIT,
        });
    }
    let value = text.parse::<f64>().ok().filter(|v| *v >= 0.0)?;
    let secs = value * unit.as_secs_f64();
    Some(match Duration::try_from_secs_f64(secs) {
        Ok(wait) => saturate(wait),
        Err(_) => LONGEST_WAIT, // over Duration's range, or infinite
    })
}

/// Parses a size as ccache writes them: a number of bytes, decimals allowed, with an optional
/// unit: `k`, `M`, `G`, `T` are decimal (1000, 1000², …), `Ki`, `Mi`, `Gi`, `Ti` binary (1024,
/// 1024², …). The unit's case does not matter (`K` is `k`, `gi` is `Gi`), a trailing `B`
/// (`5GB`, `1GiB`) and blanks around the number are allowed. A fraction of a byte is dropped:
/// `1.5G` is 1,500,000,000 bytes, `0.5Ki` 512.
pub fn parse_size(text: &str) -> Result<u64> {
    let invalid = || Error::InvalidArgument(format!("invalid size {text:?}"));
    let upper = text.trim().to_ascii_uppercase();
    let t = upper.strip_suffix('B').unwrap_or(&upper);
    let (t, base) = match t.strip_suffix('I') {
        Some(rest) => (rest, 1024u128),
        None => (t, 1000u128),
    };
    let (number, power) = match t.as_bytes().last() {
        Some(b'K') => (&t[..t.len() - 1], 1),
        Some(b'M') => (&t[..t.len() - 1], 2),
        Some(b'G') => (&t[..t.len() - 1], 3),
        Some(b'T') => (&t[..t.len() - 1], 4),
        // `Ki` without its letter, or `B` after an `i` alone, is no unit.
        _ if base == 1024 => return Err(invalid()),
        _ => (t, 0),
    };
    let number = number.trim_end();
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    // 20 digits hold any u64; more fraction digits than that cannot change the whole bytes.
    if whole.is_empty() && fraction.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || whole.len() > 20
    {
        return Err(invalid());
    }
    let fraction = &fraction[..fraction.len().min(20)];
    let scale = 10u128.pow(fraction.len() as u32);
    let parse = |s: &str| {
        if s.is_empty() {
            Ok(0)
        } else {
            s.parse::<u128>()
        }
    };
    let (whole, fraction) = (
        parse(whole).map_err(|_| invalid())?,
        parse(fraction).map_err(|_| invalid())?,
    );
    let unit = base.pow(power);
    // Exact: at most 10^20 × 1024^4 × 10^20, far below u128's 3.4 × 10^38 … checked anyway.
    let bytes = whole
        .checked_mul(unit)
        .and_then(|w| Some(w + fraction.checked_mul(unit)? / scale))
        .ok_or_else(invalid)?;
    u64::try_from(bytes).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let size = |t: &str| parse_size(t).unwrap();
        assert_eq!(size("123"), 123);
        // Decimal units, as ccache reads them: `62K` is 62,000 bytes (63,488 before).
        assert_eq!(size("62K"), 62_000);
        assert_eq!(size("64k"), 64_000);
        assert_eq!(size("512M"), 512_000_000);
        assert_eq!(size("5G"), 5_000_000_000);
        assert_eq!(size("5GB"), 5_000_000_000);
        assert_eq!(size("2T"), 2_000_000_000_000);
        // Binary units.
        assert_eq!(size("62Ki"), 63_488);
        assert_eq!(size("512Mi"), 512 << 20);
        assert_eq!(size("1Gi"), 1 << 30);
        assert_eq!(size("1GiB"), 1 << 30);
        assert_eq!(size("1gib"), 1 << 30);
        assert_eq!(size("2Ti"), 2 << 40);
        // Decimals, and blanks.
        assert_eq!(size("1.5G"), 1_500_000_000);
        assert_eq!(size(" 1.5 Gi "), 3 << 29);
        assert_eq!(size("0.5Ki"), 512);
        assert_eq!(size(".25k"), 250);
        assert_eq!(size("7."), 7);
        assert_eq!(size("1.9"), 1, "a fraction of a byte is dropped");
        assert_eq!(size("0.000000000000000000000001T"), 0);
        assert_eq!(size("18446744073709551615"), u64::MAX);
        for bad in [
            "",
            "G",
            "Gi",
            "i",
            "5i",
            "-1",
            "1X",
            "1.5.5G",
            ".",
            "1e9",
            "1 000",
            "+5",
            "18446744073709551616",
            "99999999999T",
            "1,5G",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn waits_in_other_units_saturate_too() {
        let ms = Duration::from_millis(1);
        assert_eq!(parse_wait("250", ms), Some(Duration::from_millis(250)));
        assert_eq!(parse_wait("0.5", ms), Some(Duration::from_micros(500)));
        assert_eq!(parse_wait("18446744073709551615", ms), Some(LONGEST_WAIT));
        assert_eq!(
            parse_wait("4294967296", ms),
            Some(Duration::from_millis(4_294_967_296))
        );
        assert_eq!(saturate(Duration::MAX), LONGEST_WAIT);
        assert_eq!(saturate(Duration::from_secs(5)), Duration::from_secs(5));
    }
}
