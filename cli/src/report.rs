//! Human output: sizes, durations, dates and aligned tables; text from files and entries made
//! safe for a terminal; the JSON output; and the duration arguments.

use std::borrow::Cow;
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::ser::{Formatter, PrettyFormatter};

/// Whether `c` must not reach a terminal as it is: a control character (C0, DEL, C1: escape
/// sequences, carriage returns that overwrite a line) or an invisible mark that reorders the
/// text around it (the bidirectional controls).
fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text`, which came from a file or an entry (or the environment), fit to print: each
/// character that [`unprintable`] names is written as its Rust escape (`\n`, `\r`, `\t`,
/// `\u{1b}`, `\u{202e}`). Every such field of the text output goes through here; the JSON
/// output escapes the same characters ([`json`]).
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unprintable) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unprintable(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `512 B`, `12.3 KiB`, `1.0 GiB`: binary multiples, which `parse_size` reads back (`KiB` as
/// `Ki`; `K` alone is decimal).
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `61.9 KiB (63397 bytes)`: the exact figure beside the readable one.
pub fn size_and_bytes(bytes: u64) -> String {
    format!("{} ({bytes} bytes)", size(bytes))
}

/// `350 ms`, `2.4 s`, `3m 5s`, `4h 10m`, `2d 3h`: two units at most.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 if d.as_millis() == 0 => format!("{} µs", d.as_micros()),
        0 => format!("{} ms", d.as_millis()),
        1..60 => format!("{:.1} s", d.as_secs_f64()),
        60..3600 => format!("{}m {}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h {}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d {}h", secs / 86400, secs % 86400 / 3600),
    }
}

/// Nanoseconds since the Unix epoch (0 before it), the unit of every time in the JSON output.
pub fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `2026-12-02 19:50:48 UTC (3m 5s ago)`.
pub fn time(time: SystemTime, now: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86400, secs % 86400);
    let (year, month, day) = civil_from_days(days);
    let ago = match now.duration_since(time) {
        Ok(age) => format!("{} ago", duration(Duration::from_secs(age.as_secs()))),
        Err(_) => "in the future".to_owned(),
    };
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC ({ago})",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Parses `30s`, `30m`, `12h`, `7d`, `2w`, and sums such as `1d12h`. A bare number is refused:
/// which unit was meant cannot be guessed, and a wrong guess removes entries.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || {
        format!("invalid duration {text:?}: a number and a unit (s, m, h, d, w), e.g. 12h or 7d")
    };
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            'w' => 7 * 86400,
            _ => return Err(invalid()),
        };
        let n: u64 = digits.parse().map_err(|_| invalid())?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(invalid)?;
    }
    if !digits.is_empty() || text.trim().is_empty() {
        return Err(invalid());
    }
    Ok(Duration::from_secs(total))
}

/// Columns aligned on their widest cell: text columns to the left, the ones `right` names to
/// the right (numbers).
pub struct Table {
    header: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            header: columns.iter().map(|(h, _)| *h).collect(),
            right: columns.iter().map(|(_, r)| *r).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        let header: Vec<String> = self.header.iter().map(|h| (*h).to_owned()).collect();
        let lines = std::iter::once(&header).chain(&self.rows);
        let widths: Vec<usize> = (0..self.header.len())
            .map(|i| {
                lines
                    .clone()
                    .map(|r| r[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for line in lines {
            let cells: Vec<String> = line
                .iter()
                .enumerate()
                .map(|(i, cell)| {
                    if self.right[i] {
                        format!("{cell:>w$}", w = widths[i])
                    } else {
                        format!("{cell:<w$}", w = widths[i])
                    }
                })
                .collect();
            out!("{}", cells.join("  ").trim_end());
        }
    }
}

/// Writes `value` as pretty JSON on stdout. JSON itself requires only C0 controls to be
/// escaped; DEL, C1 controls and bidirectional marks are escaped too (`\u007f`), so that the
/// output is as safe to show on a terminal as the text output, and reads back the same.
pub fn json(value: &impl serde::Serialize) {
    out!("{}", json_text(value));
}

fn json_text(value: &impl serde::Serialize) -> String {
    let mut bytes = Vec::new();
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut bytes, Escaping(PrettyFormatter::new()));
    value
        .serialize(&mut serializer)
        .expect("the output structs serialize");
    String::from_utf8(bytes).expect("serde_json writes UTF-8")
}

/// serde_json's pretty formatter, escaping every [`unprintable`] character of a string.
struct Escaping<'a>(PrettyFormatter<'a>);

/// Formatter methods handed to the pretty formatter as they are.
macro_rules! pretty_layout {
    ($($method:ident($($arg:ident: $ty:ty)?)),+ $(,)?) => {
        $(fn $method<W: ?Sized + io::Write>(&mut self, w: &mut W $(, $arg: $ty)?) -> io::Result<()> {
            self.0.$method(w $(, $arg)?)
        })+
    };
}

impl Formatter for Escaping<'_> {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (at, c) in fragment.char_indices().filter(|(_, c)| unprintable(*c)) {
            writer.write_all(&fragment.as_bytes()[start..at])?;
            write!(writer, "\\u{:04x}", u32::from(c))?;
            start = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    // The layout is the pretty formatter's.
    pretty_layout!(
        begin_array(),
        end_array(),
        begin_array_value(first: bool),
        end_array_value(),
        begin_object(),
        end_object(),
        begin_object_key(first: bool),
        begin_object_value(),
        end_object_value(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1024), "1.0 KiB");
        assert_eq!(size(12_897_485), "12.3 MiB");
        assert_eq!(size(1 << 30), "1.0 GiB");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("1w2d"), Ok(Duration::from_secs(9 * 86400)));
        assert!(parse_duration("7").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        assert_eq!(duration(Duration::from_millis(350)), "350 ms");
        assert_eq!(duration(Duration::from_secs(185)), "3m 5s");
    }

    #[test]
    fn control_characters_are_escaped_in_text_and_json() {
        let hostile = "a\u{1b}]0;owned\u{7}b\u{1b}[2J\rc\u{9b}d\u{7f}e\u{202e}f\tg\nh";
        let shown = printable(hostile);
        assert_eq!(
            shown,
            "a\\u{1b}]0;owned\\u{7}b\\u{1b}[2J\\rc\\u{9b}d\\u{7f}e\\u{202e}f\\tg\\nh"
        );
        assert!(!shown.chars().any(unprintable));
        assert!(matches!(printable("plain é 名前"), Cow::Borrowed(_)));

        let text = json_text(&serde_json::json!({ "name": hostile, "list": [hostile] }));
        assert!(!text.chars().any(|c| unprintable(c) && c != '\n'), "{text}");
        assert!(text.contains("\\u001b]0;owned\\u0007b"), "{text}");
        assert!(text.contains("\\u009bd\\u007fe\\u202ef"), "{text}");
        // It reads back as it was, laid out as the pretty formatter lays it out.
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["name"], hostile);
        assert_eq!(back["list"][0], hostile);
        assert_eq!(
            json_text(&serde_json::json!({"a": [1]})),
            "{\n  \"a\": [\n    1\n  ]\n}"
        );
    }

    #[test]
    fn dates() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_241_048);
        let now = t + Duration::from_secs(185);
        assert_eq!(time(t, now), "2026-12-02 19:50:48 UTC (3m 5s ago)");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
