//! Metrics text read back by a real Prometheus parser: the `prometheus_client` Python package
//! (Debian's `python3-prometheus-client`, run with the system's `/usr/bin/python3` so that its
//! package is the one used), not a parser of our own that would share our mistakes.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::needs;

/// The interpreter whose system packages hold the parser.
const PYTHON: &str = "/usr/bin/python3";

/// Prints one line per sample, `name{label="value",...} value` with the labels sorted, and one
/// `#TYPE family type` line per family.
const SCRIPT: &str = r##"
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    print("#TYPE", family.name, family.type)
    for s in family.samples:
        labels = ",".join('%s="%s"' % kv for kv in sorted(s.labels.items()))
        print("%s{%s} %r" % (s.name, labels, s.value))
"##;

/// What the parser made of an exposition.
#[derive(Debug, Default)]
pub struct Parsed {
    /// `name{sorted labels}` (`name{}` without labels) to value.
    pub samples: BTreeMap<String, f64>,
    /// Family name, as the parser names it, to its type.
    pub types: BTreeMap<String, String>,
}

impl Parsed {
    /// The value of `series` (`name{labels sorted by name}`); panics naming it when absent.
    pub fn value(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("no sample {series} in {:#?}", self.samples))
    }
}

/// The parser, found: only a test that has one parses.
pub struct Parser(());

impl Parser {
    /// `None` when the interpreter or its package is missing, the test skipped
    /// ([`needs::met`]).
    pub fn for_test() -> Option<Parser> {
        needs::met(needs::python(
            PYTHON,
            "prometheus_client.parser",
            "apt install python3-prometheus-client; scripts/test installs it",
        ))?;
        Some(Parser(()))
    }

    /// Parses `text` with `prometheus_client`; panics with the parser's error when it refuses
    /// the text.
    pub fn parse(&self, text: &str) -> Parsed {
        let mut child = Command::new(PYTHON)
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {PYTHON}: {e}"));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "the Prometheus parser refused the text:\n{stderr}\n--- text ---\n{text}"
        );
        let mut parsed = Parsed::default();
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            if let Some(family) = line.strip_prefix("#TYPE ") {
                let (name, kind) = family.split_once(' ').unwrap();
                parsed.types.insert(name.to_owned(), kind.to_owned());
            } else {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let value = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
                parsed.samples.insert(series.to_owned(), value);
            }
        }
        parsed
    }
}
