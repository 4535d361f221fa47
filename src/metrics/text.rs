//! The Prometheus text exposition format, version 0.0.4: `# HELP` and `# TYPE` lines, then one
//! line per sample, `name{label="value",...} value`. Written by hand because the format is a
//! few lines of rules and the Rust clients that encode it either emit OpenMetrics instead
//! (`prometheus-client`: `_total` only on samples, a `# EOF` line) or bring a global registry
//! and protobuf with them (`prometheus`); the tests parse every output with a real parser.

use std::fmt::{Display, Write};

/// What a metric family is, as its `# TYPE` line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A histogram's figures: the count of observations at or below each upper bound (cumulative,
/// as the format wants them, in increasing order of the bounds), their number and their sum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets {
    /// `(upper bound, observations <= bound)`; the `+Inf` bucket is `count`.
    pub cumulative: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

/// Labels of one sample: names and values. Names are the caller's constants; values are
/// escaped here.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// A text exposition being written: families one after the other, each announced by
/// [`Exposition::family`] before its samples.
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the family `name`: its help text and type.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {}", kind.name());
        self
    }

    /// One sample of the family started last (or of its `_bucket`, `_sum`, `_count` series).
    pub fn sample(&mut self, name: &str, labels: Labels<'_>, value: impl Display) -> &mut Self {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{label}=\"");
                for c in value.chars() {
                    match c {
                        '\\' => self.text.push_str("\\\\"),
                        '"' => self.text.push_str("\\\""),
                        '\n' => self.text.push_str("\\n"),
                        c => self.text.push(c),
                    }
                }
                self.text.push('"');
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
        self
    }

    /// One sample of `name` per `(value of label, number)`, each with `labels` first.
    pub fn series<'v, T: Display>(
        &mut self,
        name: &str,
        labels: Labels<'_>,
        label: &str,
        values: impl IntoIterator<Item = (&'v str, T)>,
    ) -> &mut Self {
        for (value, number) in values {
            let mut all = labels.to_vec();
            all.push((label, value));
            self.sample(name, &all, number);
        }
        self
    }

    /// The samples of histogram `name` with `labels`: a `_bucket` per bound and `+Inf`,
    /// `_sum` and `_count`.
    pub fn histogram(&mut self, name: &str, labels: Labels<'_>, buckets: &Buckets) -> &mut Self {
        let bucket = format!("{name}_bucket");
        let bounds: Vec<String> = buckets
            .cumulative
            .iter()
            .map(|(b, _)| b.to_string())
            .collect();
        let les = bounds.iter().map(String::as_str).chain(["+Inf"]);
        let counts = buckets
            .cumulative
            .iter()
            .map(|&(_, n)| n)
            .chain([buckets.count]);
        for (le, count) in les.zip(counts) {
            let mut with_le = labels.to_vec();
            with_le.push(("le", le));
            self.sample(&bucket, &with_le, count);
        }
        self.sample(&format!("{name}_sum"), labels, buckets.sum);
        self.sample(&format!("{name}_count"), labels, buckets.count)
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escapes() {
        let mut out = Exposition::new();
        out.family("kcache_x_total", Kind::Counter, "line\\one\ntwo")
            .sample("kcache_x_total", &[("a", "q\"b\\c\nd")], 3)
            .sample("kcache_x_total", &[], 0.5);
        assert_eq!(
            out.finish(),
            "# HELP kcache_x_total line\\\\one\\ntwo\n# TYPE kcache_x_total counter\n\
             kcache_x_total{a=\"q\\\"b\\\\c\\nd\"} 3\nkcache_x_total 0.5\n"
        );
    }

    #[test]
    fn histograms_end_with_inf_sum_and_count() {
        let mut out = Exposition::new();
        let buckets = Buckets {
            cumulative: vec![(0.001, 1), (2.5, 3)],
            count: 4,
            sum: 7.25,
        };
        out.histogram("h", &[("backend", "c")], &buckets);
        assert_eq!(
            out.finish(),
            "h_bucket{backend=\"c\",le=\"0.001\"} 1\nh_bucket{backend=\"c\",le=\"2.5\"} 3\n\
             h_bucket{backend=\"c\",le=\"+Inf\"} 4\nh_sum{backend=\"c\"} 7.25\n\
             h_count{backend=\"c\"} 4\n"
        );
    }
}
