//! The Prometheus text exposition format (version 0.0.4), written in one place for every
//! service's `GET /metrics`: families with their `# HELP` and `# TYPE` lines, samples with
//! their labels, values as the format writes them. Label values are escaped (backslash,
//! double quote, newline) and so is help text (backslash, newline), so a label echoing a
//! client's input (a cache salt, a publisher endpoint) cannot break the document.
//!
//! Values read at scrape time (atomics, a model's counters) are written here directly; a
//! service that keeps a `prometheus` registry appends it through [`Exposition::registry`],
//! which runs the crate's own encoder into the same document. Owns no metric and no name:
//! each service keeps its names and help texts in its own `metrics.rs`.

use std::fmt::{Display, Write};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's type, as `# TYPE` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets at restart).
    Counter,
    /// Goes up and down.
    Gauge,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// A sample's value: integers as they are, floats as the format writes them (`NaN`, `+Inf`,
/// `-Inf`), flags as 0 or 1.
pub trait SampleValue {
    /// Appends the value's text.
    fn write_to(&self, out: &mut String);
}

macro_rules! integer_values {
    ($($t:ty),*) => {$(
        impl SampleValue for $t {
            fn write_to(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_values!(u64, u32, usize, i64);

impl SampleValue for f64 {
    fn write_to(&self, out: &mut String) {
        if self.is_nan() {
            out.push_str("NaN");
        } else if self.is_infinite() {
            out.push_str(if *self > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(out, "{self}");
        }
    }
}

impl SampleValue for bool {
    fn write_to(&self, out: &mut String) {
        out.push(if *self { '1' } else { '0' });
    }
}

/// One `/metrics` document being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty document.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the family `name`: its `# HELP` and `# TYPE` lines. Its samples follow through
    /// the returned [`Family`] (none is fine: the family is then declared and empty).
    pub fn family(&mut self, name: impl Display, kind: Kind, help: &str) -> Family<'_> {
        let name = name.to_string();
        debug_assert!(valid_name(&name), "metric name {name:?}");
        let out = &mut self.out;
        let _ = write!(out, "# HELP {name} ");
        escape(out, help, false);
        let _ = writeln!(out, "\n# TYPE {name} {}", kind.as_str());
        Family { doc: self, name }
    }

    /// A family of one sample without labels.
    pub fn one(&mut self, name: impl Display, kind: Kind, help: &str, value: impl SampleValue) {
        self.family(name, kind, help).sample(&[], value);
    }

    /// Appends every family of a `prometheus` registry, encoded by the crate's own encoder.
    pub fn registry(&mut self, registry: &prometheus::Registry) {
        self.encoded(&registry.gather());
    }

    /// Appends families collected from the `prometheus` crate's metrics, encoded by its own
    /// encoder (families without a sample are left out, as the crate's registry does).
    pub fn encoded(&mut self, families: &[prometheus::proto::MetricFamily]) {
        let kept: Vec<_>;
        let families = if families.iter().all(|f| !f.get_metric().is_empty()) {
            families
        } else {
            kept = families
                .iter()
                .filter(|f| !f.get_metric().is_empty())
                .cloned()
                .collect();
            &kept
        };
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(families, &mut self.out) {
            tracing::warn!("cannot encode metrics: {e}");
        }
    }

    /// The document.
    #[must_use]
    pub fn finish(self) -> String {
        self.out
    }

    /// The document as a `GET /metrics` answer.
    #[must_use]
    pub fn response(self) -> axum::response::Response {
        use axum::response::IntoResponse;
        ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], self.out).into_response()
    }
}

/// The samples of one family, after its `# HELP` and `# TYPE` lines.
pub struct Family<'a> {
    doc: &'a mut Exposition,
    name: String,
}

impl Family<'_> {
    /// One sample: `name{k="v",…} value`, each label value escaped.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl SampleValue) -> &mut Self {
        let out = &mut self.doc.out;
        out.push_str(&self.name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                debug_assert!(valid_name(k) && !k.contains(':'), "label name {k:?}");
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push_str("=\"");
                escape(out, v, true);
                out.push('"');
            }
            out.push('}');
        }
        out.push(' ');
        value.write_to(out);
        out.push('\n');
        self
    }
}

/// Appends `text` escaped: backslash and newline always, the double quote in a label value.
fn escape(out: &mut String, text: &str, label_value: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if label_value => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, the format's metric names (label names: the same without `:`).
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{IntCounterVec, Opts, Registry};

    #[test]
    fn families_samples_and_values_are_written_as_the_format_says() {
        let mut out = Exposition::new();
        out.one("a_total", Kind::Counter, "Things counted.", 3_u64);
        out.family("b", Kind::Gauge, "Per salt.")
            .sample(&[("salt", "x"), ("tier", "l1")], 0.5)
            .sample(&[("salt", "y"), ("tier", "l2")], f64::NAN);
        out.family("c", Kind::Gauge, "Empty for now.");
        out.one("d", Kind::Gauge, "Infinite.", f64::INFINITY);
        out.one("e", Kind::Gauge, "Below.", f64::NEG_INFINITY);
        out.one("f", Kind::Gauge, "A flag.", true);
        out.one("g", Kind::Gauge, "Whole float.", 3.0_f64);
        assert_eq!(
            out.finish(),
            "# HELP a_total Things counted.\n# TYPE a_total counter\na_total 3\n\
             # HELP b Per salt.\n# TYPE b gauge\nb{salt=\"x\",tier=\"l1\"} 0.5\n\
             b{salt=\"y\",tier=\"l2\"} NaN\n\
             # HELP c Empty for now.\n# TYPE c gauge\n\
             # HELP d Infinite.\n# TYPE d gauge\nd +Inf\n\
             # HELP e Below.\n# TYPE e gauge\ne -Inf\n\
             # HELP f A flag.\n# TYPE f gauge\nf 1\n\
             # HELP g Whole float.\n# TYPE g gauge\ng 3\n"
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut out = Exposition::new();
        out.family("m", Kind::Gauge, "back\\slash \"quoted\"\nnext")
            .sample(&[("v", "a\"b\\c\nd")], 1_u64);
        assert_eq!(
            out.finish(),
            "# HELP m back\\\\slash \"quoted\"\\nnext\n# TYPE m gauge\n\
             m{v=\"a\\\"b\\\\c\\nd\"} 1\n"
        );
    }

    #[test]
    fn a_registry_is_appended_by_the_crates_encoder() {
        let registry = Registry::new();
        let c = IntCounterVec::new(Opts::new("r_total", "Registered."), &["k"]).expect("metric");
        registry.register(Box::new(c.clone())).expect("register");
        c.with_label_values(&["q\"uote"]).inc();
        let mut out = Exposition::new();
        out.one("own", Kind::Gauge, "Own.", 2_u64);
        out.registry(&registry);
        assert_eq!(
            out.finish(),
            "# HELP own Own.\n# TYPE own gauge\nown 2\n\
             # HELP r_total Registered.\n# TYPE r_total counter\nr_total{k=\"q\\\"uote\"} 1\n"
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("kvplane_x:y_total"));
        assert!(!valid_name("9x"));
        assert!(!valid_name("a-b"));
        assert!(!valid_name(""));
    }
}
