//! The Prometheus text exposition format (version 0.0.4), and the mapping of known metric
//! names to memory.
//!
//! Design note: the parser follows the format as Prometheus' own `expfmt` reads it, so an
//! endpoint Prometheus scrapes, Vramroom scrapes, and one Prometheus rejects is rejected
//! here with the line number and the reason:
//! - blank lines and `#` comments are skipped; `# HELP name text` (escapes `\\`, `\n`) and
//!   `# TYPE name type` are kept; OpenMetrics' `# EOF` and its types are accepted;
//! - a sample is `name{label="value",...} value [timestamp]`, with blanks and tabs between
//!   tokens, an optional trailing comma in the label set, label values escaped with `\\`,
//!   `\"` and `\n` (any other escape is an error), and duplicate label names an error;
//!   Prometheus 3's quoted UTF-8 names (`{"my.metric", "a.b"="x"}`) are read too;
//! - a value is a float as Go writes it, including `NaN`, `+Inf` and `-Inf`; a timestamp
//!   is an integer of milliseconds; an OpenMetrics exemplar (`# {...} 1`) after them is
//!   ignored.
//!
//! [`encode`] writes the same format back (used by tests, and the reason the parser can be
//! checked by round trips).
//!
//! Mapping: [`MetricMap`] turns an [`Exposition`] into a [`MemoryReading`] by rules
//! `target ← selector`, tried in order, the first selector with a matching sample winning
//! for its target. Series of one selector are *summed* (a service on two GPUs exports one
//! series per device; its allocated memory is their sum); pick one device with a label
//! matcher. User rules (`--metric allocated=name{label="x"}`) come before the known ones:
//! `vramroom serve`'s, the probe's (`python/vramroom/probe.py`), DCGM exporter's (MiB) and
//! Triton's.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::memsource::MemoryReading;

/// A metric family's type, from `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
    /// OpenMetrics' `info`, `stateset`, `gaugehistogram`, `unknown`.
    Other,
}

impl MetricType {
    fn parse(s: &str) -> Option<MetricType> {
        Some(match s {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            "summary" => MetricType::Summary,
            "untyped" => MetricType::Untyped,
            "info" | "stateset" | "gaugehistogram" | "unknown" => MetricType::Other,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::Summary => "summary",
            MetricType::Untyped => "untyped",
            MetricType::Other => "unknown",
        }
    }
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// In the order written.
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// Milliseconds since the epoch, when the exporter gave one.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A parsed scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    /// `# TYPE` lines, in order.
    pub types: Vec<(String, MetricType)>,
    /// `# HELP` lines (unescaped), in order.
    pub help: Vec<(String, String)>,
}

impl Exposition {
    /// Samples named `name`.
    pub fn get<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

/// Why a scrape did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metrics line {line}: {msg}")]
pub struct ParseError {
    /// 1-based.
    pub line: usize,
    pub msg: String,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}
fn is_label_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}
fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}
fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// A cursor over one line.
struct Cur<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cur<'a> {
    fn peek(&self) -> Option<char> {
        self.s[self.i..].chars().next()
    }
    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.i += c.len_utf8();
        Some(c)
    }
    fn blanks(&mut self) -> usize {
        let start = self.i;
        while self.peek().is_some_and(is_blank) {
            self.i += 1;
        }
        self.i - start
    }
    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.i += c.len_utf8();
            true
        } else {
            false
        }
    }
    /// A token of `start`/`cont` characters.
    fn ident(&mut self, start: fn(char) -> bool, cont: fn(char) -> bool) -> Option<&'a str> {
        let b = self.i;
        match self.peek() {
            Some(c) if start(c) => self.i += 1,
            _ => return None,
        }
        while self.peek().is_some_and(cont) {
            self.i += 1;
        }
        Some(&self.s[b..self.i])
    }
    /// A run of non-blank characters.
    fn token(&mut self) -> &'a str {
        let b = self.i;
        while self.peek().is_some_and(|c| !is_blank(c)) {
            self.bump();
        }
        &self.s[b..self.i]
    }
    /// A `"..."` string with `\\`, `\"`, `\n` escapes; the opening quote is next.
    fn quoted(&mut self) -> Result<String, String> {
        if !self.eat('"') {
            return Err("expected '\"'".into());
        }
        let mut out = String::new();
        loop {
            match self.bump() {
                None => return Err("unterminated quoted string".into()),
                Some('"') => return Ok(out),
                Some('\\') => match self.bump() {
                    Some('\\') => out.push('\\'),
                    Some('"') => out.push('"'),
                    Some('n') => out.push('\n'),
                    Some(c) => return Err(format!("invalid escape sequence '\\{c}'")),
                    None => return Err("unterminated quoted string".into()),
                },
                Some(c) => out.push(c),
            }
        }
    }
}

/// Parses a whole scrape. The first malformed line is the error.
pub fn parse(text: &str) -> Result<Exposition, ParseError> {
    let mut e = Exposition::default();
    for (n, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let err = |msg: String| ParseError { line: n + 1, msg };
        let mut c = Cur { s: line, i: 0 };
        c.blanks();
        match c.peek() {
            None => continue,
            Some('#') => {
                c.bump();
                comment(&mut c, &mut e).map_err(err)?;
            }
            Some(_) => e.samples.push(sample(&mut c).map_err(err)?),
        }
    }
    Ok(e)
}

fn comment(c: &mut Cur<'_>, e: &mut Exposition) -> Result<(), String> {
    if c.blanks() == 0 {
        return Ok(()); // `#HELP` is a plain comment, as in expfmt
    }
    let kw = c.token();
    if kw != "HELP" && kw != "TYPE" {
        return Ok(());
    }
    if c.blanks() == 0 {
        return Err(format!("{kw} needs a metric name"));
    }
    let name = if c.peek() == Some('"') {
        c.quoted()?
    } else {
        c.ident(is_name_start, is_name_char)
            .ok_or_else(|| format!("{kw}: {:?} is not a metric name", c.rest()))?
            .to_string()
    };
    if kw == "HELP" {
        let text = match c.peek() {
            None => String::new(),
            Some(ch) if is_blank(ch) => {
                c.bump();
                unescape_help(c.rest())
            }
            Some(_) => return Err(format!("HELP: {name:?} is not a metric name")),
        };
        e.help.push((name, text));
    } else {
        if c.blanks() == 0 {
            return Err(format!("TYPE {name} needs a type"));
        }
        let t = c.token();
        let ty = MetricType::parse(t).ok_or_else(|| {
            format!("unknown metric type {t:?} (expected counter, gauge, histogram, summary or untyped)")
        })?;
        c.blanks();
        if !c.rest().is_empty() {
            return Err(format!("unexpected {:?} after TYPE {name} {t}", c.rest()));
        }
        e.types.push((name, ty));
    }
    Ok(())
}

/// HELP text: `\\` and `\n`; any other backslash is kept as written (HELP is for humans,
/// and a scrape is not worth losing over it).
fn unescape_help(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(ch) = it.next() {
        if ch == '\\' {
            match it.peek() {
                Some('\\') => {
                    it.next();
                    out.push('\\');
                }
                Some('n') => {
                    it.next();
                    out.push('\n');
                }
                _ => out.push('\\'),
            }
        } else {
            out.push(ch);
        }
    }
    out
}

fn sample(c: &mut Cur<'_>) -> Result<Sample, String> {
    let mut name = match c.peek() {
        Some('{') => None,
        _ => Some(
            c.ident(is_name_start, is_name_char)
                .ok_or_else(|| format!("{:?} does not start with a metric name", c.rest()))?
                .to_string(),
        ),
    };
    let mut labels: Vec<(String, String)> = Vec::new();
    let mut gap = c.blanks();
    if c.eat('{') {
        loop {
            c.blanks();
            if c.eat('}') {
                break;
            }
            let key = if c.peek() == Some('"') {
                let q = c.quoted()?;
                c.blanks();
                if c.peek() != Some('=') {
                    // A bare quoted string: the metric's UTF-8 name (Prometheus 3).
                    if name.is_some() {
                        return Err(format!("second metric name {q:?} in the label set"));
                    }
                    name = Some(q);
                    c.blanks();
                    if !c.eat(',') && c.peek() != Some('}') {
                        return Err("expected ',' or '}' after the metric name".into());
                    }
                    continue;
                }
                q
            } else {
                c.ident(is_label_start, is_label_char)
                    .ok_or_else(|| format!("{:?} is not a label name", c.rest()))?
                    .to_string()
            };
            c.blanks();
            if !c.eat('=') {
                return Err(format!("expected '=' after label {key}"));
            }
            c.blanks();
            let val = c.quoted().map_err(|m| format!("label {key}: {m}"))?;
            if labels.iter().any(|(k, _)| *k == key) {
                return Err(format!("duplicate label {key}"));
            }
            labels.push((key, val));
            c.blanks();
            if c.eat(',') {
                continue;
            }
            if c.eat('}') {
                break;
            }
            return Err(format!(
                "expected ',' or '}}' after label {}",
                labels.last().map(|l| l.0.as_str()).unwrap_or("")
            ));
        }
        gap = c.blanks();
    }
    let name = name.ok_or("a label set without a metric name")?;
    if gap == 0 {
        return Err(format!("{name}: expected a blank before the value"));
    }
    let vt = c.token();
    let value = parse_value(vt).ok_or_else(|| format!("{name}: {vt:?} is not a number"))?;
    let mut timestamp_ms = None;
    if c.blanks() > 0 {
        match c.peek() {
            None | Some('#') => {}
            Some(_) => {
                let tt = c.token();
                timestamp_ms = Some(tt.parse::<i64>().map_err(|_| {
                    format!("{name}: timestamp {tt:?} is not an integer of milliseconds")
                })?);
                c.blanks();
            }
        }
    }
    // An OpenMetrics exemplar may follow; anything else is garbage.
    if !(c.rest().is_empty() || c.rest().starts_with('#')) {
        return Err(format!("{name}: unexpected {:?} after the value", c.rest()));
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

/// A float as Go's `strconv.ParseFloat` reads the values exporters write.
fn parse_value(t: &str) -> Option<f64> {
    match t {
        "+Inf" | "Inf" | "+inf" | "inf" => return Some(f64::INFINITY),
        "-Inf" | "-inf" => return Some(f64::NEG_INFINITY),
        "NaN" | "nan" => return Some(f64::NAN),
        _ => {}
    }
    // Rust also reads "infinity" and "nan" spelled any way; Go does too.
    t.parse::<f64>().ok()
}

fn escape_label(s: &str, out: &mut String) {
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A value as Prometheus writes it: `NaN`, `+Inf`, `-Inf`, or the shortest decimal that
/// reads back to the same float.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v:?}")
    }
}

fn plain_name(n: &str) -> bool {
    let mut it = n.chars();
    it.next().is_some_and(is_name_start) && it.all(is_name_char)
}

fn plain_label(n: &str) -> bool {
    let mut it = n.chars();
    it.next().is_some_and(is_label_start) && it.all(is_label_char)
}

/// Writes `e` in the text format: HELP and TYPE lines, then the samples.
pub fn encode(e: &Exposition) -> String {
    let mut o = String::new();
    let name_txt = |n: &str| {
        if plain_name(n) {
            n.to_string()
        } else {
            let mut s = String::from("\"");
            escape_label(n, &mut s);
            s.push('"');
            s
        }
    };
    for (n, h) in &e.help {
        let _ = write!(o, "# HELP {} ", name_txt(n));
        for ch in h.chars() {
            match ch {
                '\\' => o.push_str("\\\\"),
                '\n' => o.push_str("\\n"),
                c => o.push(c),
            }
        }
        o.push('\n');
    }
    for (n, t) in &e.types {
        let _ = writeln!(o, "# TYPE {} {}", name_txt(n), t.as_str());
    }
    for s in &e.samples {
        let quoted_name = !plain_name(&s.name);
        if quoted_name {
            o.push('{');
            o.push_str(&name_txt(&s.name));
        } else {
            o.push_str(&s.name);
        }
        if !s.labels.is_empty() || quoted_name {
            if !quoted_name {
                o.push('{');
            }
            for (i, (k, v)) in s.labels.iter().enumerate() {
                if i > 0 || quoted_name {
                    o.push(',');
                }
                if plain_label(k) {
                    o.push_str(k);
                } else {
                    o.push('"');
                    escape_label(k, &mut o);
                    o.push('"');
                }
                o.push_str("=\"");
                escape_label(v, &mut o);
                o.push('"');
            }
            o.push('}');
        }
        o.push(' ');
        o.push_str(&format_value(s.value));
        if let Some(t) = s.timestamp_ms {
            let _ = write!(o, " {t}");
        }
        o.push('\n');
    }
    o
}

// ---------------------------------------------------------------------------------------
// Mapping to memory.

/// What a rule fills in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Allocated,
    Reserved,
    Active,
    InactiveSplit,
    MaxAllocated,
    MaxReserved,
    ProcessUsed,
    DeviceUsed,
    Capacity,
    NumOoms,
    /// Free device memory: capacity = used + free (+ reserved by the driver) when no
    /// exporter says the total.
    DeviceFree,
    /// Memory the driver reserves (DCGM's `FB_RESERVED`), part of the total.
    DriverReserved,
}

impl Target {
    pub const ALL: [(&'static str, Target); 12] = [
        ("allocated", Target::Allocated),
        ("reserved", Target::Reserved),
        ("active", Target::Active),
        ("inactive_split", Target::InactiveSplit),
        ("max_allocated", Target::MaxAllocated),
        ("max_reserved", Target::MaxReserved),
        ("process_used", Target::ProcessUsed),
        ("device_used", Target::DeviceUsed),
        ("capacity", Target::Capacity),
        ("num_ooms", Target::NumOoms),
        ("device_free", Target::DeviceFree),
        ("driver_reserved", Target::DriverReserved),
    ];
    pub fn name(self) -> &'static str {
        Target::ALL
            .iter()
            .find(|(_, t)| *t == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
    fn parse(s: &str) -> Option<Target> {
        Target::ALL.iter().find(|(n, _)| *n == s).map(|(_, t)| *t)
    }
}

/// `name{label="v",other!="w"}*SCALE`: which samples, and the factor to bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    pub name: String,
    /// (label, must equal (`=`) or must differ (`!=`), value).
    pub matchers: Vec<(String, bool, String)>,
    /// Multiplier to bytes (DCGM reports MiB: 1048576).
    pub scale: f64,
}

impl Selector {
    fn known(name: &str) -> Selector {
        Selector {
            name: name.into(),
            matchers: Vec::new(),
            scale: 1.0,
        }
    }
    fn with(mut self, label: &str, value: &str) -> Selector {
        self.matchers.push((label.into(), true, value.into()));
        self
    }
    fn scaled(mut self, f: f64) -> Selector {
        self.scale = f;
        self
    }
    pub fn matches(&self, s: &Sample) -> bool {
        s.name == self.name
            && self
                .matchers
                .iter()
                .all(|(k, eq, v)| (s.label(k).unwrap_or("") == v) == *eq)
    }
    /// The sum of the matching samples' values (NaN ones skipped) × scale; `None` when no
    /// sample matches.
    pub fn value(&self, e: &Exposition) -> Option<f64> {
        let mut sum = 0.0;
        let mut any = false;
        for s in e.samples.iter().filter(|s| self.matches(s)) {
            if s.value.is_finite() {
                sum += s.value;
                any = true;
            }
        }
        any.then_some(sum * self.scale)
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if !self.matchers.is_empty() {
            f.write_str("{")?;
            for (i, (k, eq, v)) in self.matchers.iter().enumerate() {
                let mut ev = String::new();
                escape_label(v, &mut ev);
                write!(
                    f,
                    "{}{k}{}\"{ev}\"",
                    if i > 0 { "," } else { "" },
                    if *eq { "=" } else { "!=" }
                )?;
            }
            f.write_str("}")?;
        }
        if self.scale != 1.0 {
            write!(f, "*{}", self.scale)?;
        }
        Ok(())
    }
}

/// Parses `--metric TARGET=SELECTOR`, e.g. `allocated=vllm_gpu_bytes{gpu="0"}` or
/// `device_used=DCGM_FI_DEV_FB_USED*MiB`.
pub fn parse_metric_rule(s: &str) -> Result<(Target, Selector), String> {
    let (t, sel) = s.split_once('=').ok_or_else(|| {
        format!("--metric {s:?}: expected TARGET=METRIC, e.g. allocated=my_allocated_bytes")
    })?;
    let target = Target::parse(t.trim()).ok_or_else(|| {
        format!(
            "--metric {s:?}: unknown target {:?} (expected one of {})",
            t.trim(),
            Target::ALL.map(|x| x.0).join(", ")
        )
    })?;
    let sel = parse_selector(sel.trim()).map_err(|m| format!("--metric {s:?}: {m}"))?;
    Ok((target, sel))
}

/// `name{label="v",l!="w"}*SCALE`.
pub fn parse_selector(s: &str) -> Result<Selector, String> {
    let mut c = Cur { s, i: 0 };
    let name = c
        .ident(is_name_start, is_name_char)
        .ok_or_else(|| format!("{s:?} does not start with a metric name"))?
        .to_string();
    let mut matchers = Vec::new();
    c.blanks();
    if c.eat('{') {
        loop {
            c.blanks();
            if c.eat('}') {
                break;
            }
            let k = c
                .ident(is_label_start, is_label_char)
                .ok_or_else(|| format!("{:?} is not a label name", c.rest()))?
                .to_string();
            c.blanks();
            let eq = if c.eat('=') {
                true
            } else if c.rest().starts_with("!=") {
                c.i += 2;
                false
            } else {
                return Err(format!("expected = or != after label {k}"));
            };
            c.blanks();
            let v = c.quoted().map_err(|m| format!("label {k}: {m}"))?;
            matchers.push((k, eq, v));
            c.blanks();
            if c.eat(',') {
                continue;
            }
            if c.eat('}') {
                break;
            }
            return Err("expected ',' or '}' in the label matchers".into());
        }
    }
    c.blanks();
    let mut scale = 1.0;
    if c.eat('*') {
        let t = c.rest().trim();
        scale = match t {
            "B" => 1.0,
            "KiB" => 1024.0,
            "MiB" => 1048576.0,
            "GiB" => 1073741824.0,
            "KB" | "kB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            _ => t
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| {
                    format!("scale {t:?} is not a positive number or a unit (KiB, MiB, GiB)")
                })?,
        };
    } else if !c.rest().is_empty() {
        return Err(format!("unexpected {:?} after the selector", c.rest()));
    }
    Ok(Selector {
        name,
        matchers,
        scale,
    })
}

/// The metric a `vramroom.probe` endpoint always exports: it marks the endpoint as a
/// probe (snapshots can be fetched from it).
pub const PROBE_INFO_METRIC: &str = "vramroom_probe_info";
/// The probe's per-device capacity: what the process may reserve (fraction × total).
pub const PROBE_CAPACITY_METRIC: &str = "torch_cuda_device_capacity_bytes";
/// The probe's per-device `get_per_process_memory_fraction`.
pub const PROBE_FRACTION_METRIC: &str = "torch_cuda_memory_fraction";
/// The probe's per-key `torch.cuda.memory_stats()` family.
pub const PROBE_STATS_METRIC: &str = "torch_cuda_memory_stats";
/// `vramroom serve`'s per-key `memory_stats()` family.
pub const SERVE_STATS_METRIC: &str = "vramroom_memory_stats";

/// Rules from metric names to memory.
#[derive(Debug, Clone)]
pub struct MetricMap {
    rules: Vec<(Target, Selector, Origin)>,
}

/// Where a rule came from, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    User,
    VramroomServe,
    Probe,
    Dcgm,
    Triton,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::User => "--metric",
            Origin::VramroomServe => "vramroom serve",
            Origin::Probe => "vramroom.probe",
            Origin::Dcgm => "DCGM exporter",
            Origin::Triton => "Triton",
        }
    }
}

const MIB: f64 = 1048576.0;

/// What an exposition says about memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mapped {
    pub reading: MemoryReading,
    /// `target ← selector (origin)` for every target that was filled.
    pub matched: Vec<String>,
    /// The endpoint is a `vramroom.probe` probe.
    pub is_probe: bool,
    /// `torch.cuda.memory_stats()` keys as the probe or `vramroom serve` export them,
    /// summed over devices.
    pub memory_stats: BTreeMap<String, i64>,
    /// `vramroom serve`'s admission rejections so far, by reason (`queue_delay`, `memory`,
    /// `queue_full`, `shutdown`): why it answered 503.
    pub rejections: BTreeMap<String, u64>,
}

/// `vramroom serve`'s counter of requests answered 503, by `reason`.
pub const SERVE_REJECTIONS_METRIC: &str = "vramroom_admission_rejections_total";

impl MetricMap {
    /// The known names only.
    pub fn known() -> MetricMap {
        use Origin::*;
        use Target::*;
        let s = Selector::known;
        let rules = vec![
            (
                Allocated,
                s("vramroom_memory_allocated_bytes"),
                VramroomServe,
            ),
            (Reserved, s("vramroom_memory_reserved_bytes"), VramroomServe),
            (Capacity, s("vramroom_memory_capacity_bytes"), VramroomServe),
            (
                MaxAllocated,
                s("vramroom_max_memory_allocated_bytes"),
                VramroomServe,
            ),
            (NumOoms, s("vramroom_num_ooms_total"), VramroomServe),
            (
                MaxReserved,
                s("vramroom_max_memory_reserved_bytes"),
                VramroomServe,
            ),
            (
                Active,
                s(SERVE_STATS_METRIC).with("key", "active_bytes.all.current"),
                VramroomServe,
            ),
            (
                InactiveSplit,
                s(SERVE_STATS_METRIC).with("key", "inactive_split_bytes.all.current"),
                VramroomServe,
            ),
            (Allocated, s("torch_cuda_memory_allocated_bytes"), Probe),
            (Reserved, s("torch_cuda_memory_reserved_bytes"), Probe),
            (
                MaxAllocated,
                s("torch_cuda_max_memory_allocated_bytes"),
                Probe,
            ),
            (
                MaxReserved,
                s("torch_cuda_max_memory_reserved_bytes"),
                Probe,
            ),
            (
                Active,
                s(PROBE_STATS_METRIC).with("key", "active_bytes.all.current"),
                Probe,
            ),
            (
                InactiveSplit,
                s(PROBE_STATS_METRIC).with("key", "inactive_split_bytes.all.current"),
                Probe,
            ),
            (DeviceUsed, s("torch_cuda_device_used_bytes"), Probe),
            // What the process may reserve (fraction x total, per device) comes before the
            // card's size: a service capped with set_per_process_memory_fraction runs out
            // there. Older probes export only the total.
            (Capacity, s(PROBE_CAPACITY_METRIC), Probe),
            (Capacity, s("torch_cuda_device_total_bytes"), Probe),
            (NumOoms, s("vramroom_probe_ooms_total"), Probe),
            (DeviceUsed, s("DCGM_FI_DEV_FB_USED").scaled(MIB), Dcgm),
            (DeviceFree, s("DCGM_FI_DEV_FB_FREE").scaled(MIB), Dcgm),
            (
                DriverReserved,
                s("DCGM_FI_DEV_FB_RESERVED").scaled(MIB),
                Dcgm,
            ),
            (Capacity, s("DCGM_FI_DEV_FB_TOTAL").scaled(MIB), Dcgm),
            (DeviceUsed, s("nv_gpu_memory_used_bytes"), Triton),
            (Capacity, s("nv_gpu_memory_total_bytes"), Triton),
        ];
        MetricMap { rules }
    }

    /// The user's rules first, then the known names.
    pub fn with_user(user: Vec<(Target, Selector)>) -> MetricMap {
        let mut m = MetricMap {
            rules: user
                .into_iter()
                .map(|(t, s)| (t, s, Origin::User))
                .collect(),
        };
        m.rules.extend(MetricMap::known().rules);
        m
    }

    /// Maps one scrape.
    pub fn apply(&self, e: &Exposition) -> Mapped {
        let mut got: BTreeMap<Target, f64> = BTreeMap::new();
        let mut matched = Vec::new();
        for (t, sel, origin) in &self.rules {
            if got.contains_key(t) {
                continue;
            }
            if let Some(v) = sel.value(e) {
                got.insert(*t, v);
                matched.push(format!("{} ← {sel} ({})", t.name(), origin.as_str()));
            }
        }
        let b = |t: Target| got.get(&t).map(|v| v.max(0.0).round() as u64);
        let capacity = b(Target::Capacity).or_else(|| {
            let used = b(Target::DeviceUsed)?;
            let free = b(Target::DeviceFree)?;
            Some(used + free + b(Target::DriverReserved).unwrap_or(0))
        });
        let reading = MemoryReading {
            allocated: b(Target::Allocated),
            reserved: b(Target::Reserved),
            active: b(Target::Active),
            inactive_split: b(Target::InactiveSplit),
            max_allocated: b(Target::MaxAllocated),
            max_reserved: b(Target::MaxReserved),
            process_used: b(Target::ProcessUsed),
            device_used: b(Target::DeviceUsed),
            capacity,
            num_ooms: b(Target::NumOoms),
        };
        let mut memory_stats = BTreeMap::new();
        let family = if e.has(PROBE_STATS_METRIC) {
            PROBE_STATS_METRIC
        } else {
            SERVE_STATS_METRIC
        };
        for s in e.get(family) {
            if let Some(k) = s.label("key") {
                if s.value.is_finite() {
                    *memory_stats.entry(k.to_string()).or_insert(0i64) += s.value as i64;
                }
            }
        }
        let mut rejections = BTreeMap::new();
        for s in e.get(SERVE_REJECTIONS_METRIC) {
            if let Some(r) = s.label("reason") {
                if s.value.is_finite() && s.value >= 0.0 {
                    *rejections.entry(r.to_string()).or_insert(0u64) += s.value.round() as u64;
                }
            }
        }
        Mapped {
            reading,
            matched,
            is_probe: e.has(PROBE_INFO_METRIC),
            memory_stats,
            rejections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = r#"# HELP http_requests_total The total number of HTTP requests.
# TYPE http_requests_total counter
http_requests_total{method="post",code="200"} 1027 1395066363000
http_requests_total{method="post",code="400"}    3 1395066363000

# Escaping in label values:
msdos_file_access_time_seconds{path="C:\\DIR\\FILE.TXT",error="Cannot find file:\n\"FILE.TXT\""} 1.458255915e9

# Minimalistic line:
metric_without_timestamp_and_labels 12.47

# A weird metric from before the epoch:
something_weird{problem="division by zero"} +Inf -3982045

# A histogram, which has a pretty complex representation in the text format:
# HELP http_request_duration_seconds A histogram of the request duration.
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{le="0.05"} 24054
http_request_duration_seconds_bucket{le="+Inf"} 144320
http_request_duration_seconds_sum 53423
http_request_duration_seconds_count 144320

# Finally a summary, which has a complex representation, too:
# HELP rpc_duration_seconds A summary of the RPC duration in seconds.
# TYPE rpc_duration_seconds summary
rpc_duration_seconds{quantile="0.01"} 3102
rpc_duration_seconds{quantile="0.5"} 4773
rpc_duration_seconds_sum 1.7560473e+07
rpc_duration_seconds_count 2693
"#;

    #[test]
    fn the_documentations_example() {
        // The example of Prometheus' exposition_formats.md, verbatim.
        let e = parse(EXAMPLE).unwrap();
        assert_eq!(e.samples.len(), 13);
        let s = &e.samples[0];
        assert_eq!(s.name, "http_requests_total");
        assert_eq!(s.label("method"), Some("post"));
        assert_eq!(s.value, 1027.0);
        assert_eq!(s.timestamp_ms, Some(1395066363000));
        assert_eq!(e.samples[1].value, 3.0);
        let ms = &e.samples[2];
        assert_eq!(ms.label("path"), Some(r"C:\DIR\FILE.TXT"));
        assert_eq!(ms.label("error"), Some("Cannot find file:\n\"FILE.TXT\""));
        assert_eq!(ms.value, 1.458255915e9);
        assert_eq!(e.samples[3].labels.len(), 0);
        assert_eq!(e.samples[4].value, f64::INFINITY);
        assert_eq!(e.samples[4].timestamp_ms, Some(-3982045));
        assert_eq!(e.samples[6].label("le"), Some("+Inf"));
        assert_eq!(e.samples[11].value, 1.7560473e7);
        assert_eq!(
            e.types,
            vec![
                ("http_requests_total".into(), MetricType::Counter),
                (
                    "http_request_duration_seconds".into(),
                    MetricType::Histogram
                ),
                ("rpc_duration_seconds".into(), MetricType::Summary),
            ]
        );
        assert_eq!(e.help[0].1, "The total number of HTTP requests.");
    }

    #[test]
    fn edge_cases_that_parse() {
        let e = parse(
            "a 1\r\n\tb{} NaN\n  c{x=\"1\",} -Inf\nd{ x = \"y\" , z=\"\" } 2e-3 7 # {trace_id=\"a\"} 1\n\
             # HELP e line\\nbreak \\\\ and \\q kept\n#HELP not a help line\n# TYPE e gauge\n\
             {\"my.metric\", \"a.b\"=\"v\"} 5\n# EOF\n",
        )
        .unwrap();
        assert_eq!(e.samples[0].value, 1.0);
        assert!(e.samples[1].value.is_nan());
        assert_eq!(e.samples[2].label("x"), Some("1"));
        assert_eq!(e.samples[2].value, f64::NEG_INFINITY);
        assert_eq!(e.samples[3].label("z"), Some(""));
        assert_eq!(e.samples[3].timestamp_ms, Some(7));
        assert_eq!(
            e.help,
            vec![("e".into(), "line\nbreak \\ and \\q kept".into())]
        );
        let last = e.samples.last().unwrap();
        assert_eq!(last.name, "my.metric");
        assert_eq!(last.label("a.b"), Some("v"));
    }

    #[test]
    fn malformed_lines_are_errors_with_their_line() {
        for (bad, line, what) in [
            ("ok 1\nbad{x=\"1\" 2\n", 2, "expected ','"),
            ("m{x=\"a\\qb\"} 1", 1, "invalid escape"),
            ("m{x=\"1\",x=\"2\"} 1", 1, "duplicate label"),
            ("m 1 2 3", 1, "unexpected"),
            ("m one", 1, "not a number"),
            ("m 1 1.5", 1, "timestamp"),
            ("m{x=1} 1", 1, "expected '\"'"),
            ("m{x=\"1} 1", 1, "unterminated"),
            ("9m 1", 1, "metric name"),
            ("m{9=\"x\"} 1", 1, "label name"),
            ("\n\n# TYPE m gaugey", 3, "unknown metric type"),
            ("m", 1, "blank before the value"),
            ("{x=\"1\"} 2", 1, "without a metric name"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert_eq!(e.line, line, "{bad}: {e}");
            assert!(e.msg.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn known_names_map_to_memory() {
        let text = "\
# TYPE vramroom_memory_allocated_bytes gauge
vramroom_memory_allocated_bytes{device=\"0\"} 100
vramroom_memory_reserved_bytes{device=\"0\"} 200
vramroom_memory_capacity_bytes{device=\"0\"} 1000
vramroom_max_memory_allocated_bytes{device=\"0\"} 150
vramroom_num_ooms_total 0
DCGM_FI_DEV_FB_USED{gpu=\"0\"} 3
DCGM_FI_DEV_FB_USED{gpu=\"1\"} 1
DCGM_FI_DEV_FB_FREE{gpu=\"0\"} 10
DCGM_FI_DEV_FB_FREE{gpu=\"1\"} 12
";
        let m = MetricMap::known().apply(&parse(text).unwrap());
        let r = m.reading;
        assert_eq!(r.allocated, Some(100));
        assert_eq!(r.reserved, Some(200));
        assert_eq!(r.capacity, Some(1000));
        assert_eq!(r.max_allocated, Some(150));
        assert_eq!(r.num_ooms, Some(0));
        // DCGM's MiB, summed over both GPUs.
        assert_eq!(r.device_used, Some(4 << 20));
        assert!(!m.is_probe);
        assert!(m.matched.iter().any(|x| x.contains("DCGM exporter")));

        // DCGM alone: capacity is used + free.
        let d = MetricMap::known().apply(
            &parse("DCGM_FI_DEV_FB_USED{gpu=\"0\"} 3\nDCGM_FI_DEV_FB_FREE{gpu=\"0\"} 10\n")
                .unwrap(),
        );
        assert_eq!(d.reading.capacity, Some(13 << 20));
        // Triton.
        let t = MetricMap::known().apply(
            &parse(
                "nv_gpu_memory_used_bytes{gpu_uuid=\"GPU-1\"} 5e9\n\
                 nv_gpu_memory_total_bytes{gpu_uuid=\"GPU-1\"} 8e10\n",
            )
            .unwrap(),
        );
        assert_eq!(t.reading.device_used, Some(5_000_000_000));
        assert_eq!(t.reading.capacity, Some(80_000_000_000));
    }

    #[test]
    fn user_rules_come_first_and_select_by_label() {
        let e = parse(
            "my_bytes{kind=\"alloc\",gpu=\"0\"} 7\nmy_bytes{kind=\"alloc\",gpu=\"1\"} 9\n\
             my_bytes{kind=\"cache\",gpu=\"0\"} 11\nvramroom_memory_allocated_bytes 1\n\
             fb_mib 2\n",
        )
        .unwrap();
        let rules = vec![
            parse_metric_rule("allocated=my_bytes{kind=\"alloc\",gpu=\"1\"}").unwrap(),
            parse_metric_rule("reserved=my_bytes{kind!=\"alloc\"}").unwrap(),
            parse_metric_rule("device_used=fb_mib*MiB").unwrap(),
        ];
        let r = MetricMap::with_user(rules).apply(&e).reading;
        assert_eq!(r.allocated, Some(9));
        assert_eq!(r.reserved, Some(11));
        assert_eq!(r.device_used, Some(2 << 20));
        for bad in [
            "allocated",
            "bogus=x",
            "allocated=9x",
            "allocated=x{a=b}",
            "allocated=x*0",
            "allocated=x{a=\"b\"} junk",
        ] {
            assert!(parse_metric_rule(bad).is_err(), "{bad}");
        }
        let sel = parse_selector("x{a=\"q\\\"\",b!=\"\"}*2").unwrap();
        assert_eq!(parse_selector(&sel.to_string()).unwrap(), sel);
    }

    fn arb_name() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-zA-Z_:][a-zA-Z0-9_:]{0,12}",
            1 => "[a-z][a-z0-9.é -]{0,8}",
        ]
    }

    fn arb_value() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            (-1e6f64..1e6),
            (0u64..1 << 50).prop_map(|v| v as f64),
        ]
    }

    fn arb_sample() -> impl Strategy<Value = Sample> {
        (
            arb_name(),
            proptest::collection::btree_map("[a-zA-Z_][a-zA-Z0-9_]{0,6}", ".{0,10}", 0..4),
            arb_value(),
            proptest::option::of(any::<i64>()),
        )
            .prop_map(|(name, labels, value, timestamp_ms)| Sample {
                name,
                labels: labels.into_iter().collect(),
                value,
                timestamp_ms,
            })
    }

    fn same(a: &Exposition, b: &Exposition) -> bool {
        a.types == b.types
            && a.help == b.help
            && a.samples.len() == b.samples.len()
            && a.samples.iter().zip(&b.samples).all(|(x, y)| {
                x.name == y.name
                    && x.labels == y.labels
                    && x.timestamp_ms == y.timestamp_ms
                    && (x.value == y.value || (x.value.is_nan() && y.value.is_nan()))
            })
    }

    proptest! {
        #[test]
        fn encode_then_parse_is_identity(
            samples in proptest::collection::vec(arb_sample(), 0..12),
            help in proptest::collection::vec(("[a-z_]{1,8}", "[^\r]{0,20}"), 0..3),
            types in proptest::collection::vec(("[a-z_]{1,8}", 0usize..5), 0..3),
        ) {
            // HELP text: a leading blank is not preserved by the format, nor is a trailing CR.
            let help: Vec<(String, String)> = help
                .into_iter()
                .map(|(n, h)| (n, h.trim_start_matches([' ', '\t']).to_string()))
                .collect();
            let kinds = [MetricType::Counter, MetricType::Gauge, MetricType::Histogram,
                         MetricType::Summary, MetricType::Untyped];
            let e = Exposition {
                samples,
                types: types.into_iter().map(|(n, k)| (n, kinds[k])).collect(),
                help,
            };
            let text = encode(&e);
            let back = parse(&text).map_err(|err| TestCaseError::fail(format!("{err}\n{text}")))?;
            prop_assert!(same(&e, &back), "{text}");
        }

        #[test]
        fn arbitrary_text_never_panics(s in "(?s).{0,200}") {
            let _ = parse(&s);
        }

        #[test]
        fn arbitrary_lines_of_metric_alphabet_never_panic(
            s in "[a-z_{}=\",.\\\\ #\tnE+0-9I-]{0,80}"
        ) {
            let _ = parse(&s);
            let _ = parse_selector(&s);
        }
    }
}
