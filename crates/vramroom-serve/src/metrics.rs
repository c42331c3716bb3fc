//! Counters and histograms, and their Prometheus text exposition (`GET /metrics`).
//!
//! Design note: the memory figures are read from the allocator at scrape time, not
//! mirrored, so `/metrics` shows exactly what `memory_stats()` says at that moment, with
//! PyTorch's names (`vramroom_memory_stats{key="allocated_bytes.all.current"}` is
//! `torch.cuda.memory_stats()["allocated_bytes.all.current"]`). Everything the server
//! counts itself lives here behind atomics or one short lock; a scrape never waits on a
//! running batch. Histograms are Prometheus-style (cumulative `_bucket{le}`, `_sum`,
//! `_count`) with fixed buckets, so a scraper can compute quantiles over any window.
//!
//! Replicas (`--device cuda:0,cuda:1`): each replica has its own [`Metrics`] and allocator,
//! and with more than one every series below gains a `device` label naming its replica
//! ([`merge_labelled`]); the names stay, so a dashboard sums or filters by `device`
//! (`vramroom http` sums them). Requests refused before they reach a replica (unreadable,
//! unsupported) are counted on the first. Connection counts are the server's, unlabelled.
//!
//! The exported names (the `vramroom http` client maps them, so they are part of the API):
//!
//! | name | type | what |
//! | --- | --- | --- |
//! | `vramroom_memory_allocated_bytes` | gauge | `memory_allocated()` |
//! | `vramroom_memory_reserved_bytes` | gauge | `memory_reserved()` |
//! | `vramroom_memory_capacity_bytes` | gauge | the device's capacity (simulated on cpu) |
//! | `vramroom_max_memory_allocated_bytes` | gauge | `max_memory_allocated()` |
//! | `vramroom_max_memory_reserved_bytes` | gauge | `max_memory_reserved()` |
//! | `vramroom_num_ooms_total` | counter | the allocator's `num_ooms` |
//! | `vramroom_memory_stats{key}` | gauge | every `memory_stats()` key |
//! | `vramroom_admission_limit_bytes` | gauge | capacity − margin |
//! | `vramroom_admission_committed_bytes` | gauge | what the memory ledger holds now |
//! | `vramroom_requests_total{code}` | counter | `/v1/infer` answers by HTTP status |
//! | `vramroom_admission_rejections_total{reason}` | counter | 503s by reason |
//! | `vramroom_requests_cancelled_total` | counter | clients gone before their batch ran |
//! | `vramroom_queue_depth` | gauge | requests waiting |
//! | `vramroom_queue_samples` | gauge | samples waiting |
//! | `vramroom_batches_running` | gauge | batches on the compute threads |
//! | `vramroom_batches_total` | counter | batches run |
//! | `vramroom_batch_size` | histogram | samples per batch |
//! | `vramroom_request_queue_seconds` | histogram | arrival to batch start |
//! | `vramroom_request_compute_seconds` | histogram | the batch's compute |
//! | `vramroom_request_duration_seconds` | histogram | arrival to answer, 200s only |
//! | `vramroom_batch_predicted_peak_bytes{slot}` | gauge | last batches (slot 0 newest) |
//! | `vramroom_batch_actual_peak_bytes{slot}` | gauge | the same batches, measured (NaN when it overlapped another batch) |
//! | `vramroom_batch_samples{slot}` | gauge | the same batches' sizes |
//! | `vramroom_prediction_underestimates_total` | counter | batches that peaked above their prediction |
//! | `vramroom_prediction_cache_entries` | gauge | predictions cached |
//! | `vramroom_prediction_cache_evictions_total` | counter | predictions evicted |
//! | `vramroom_replica_requests_total{device}` | counter | requests the router placed on each replica |
//! | `vramroom_compute_model_seconds{fit,term}` | gauge | fitted compute time (`fit`: `live`, or `quiet` = while nothing was shed), `fixed` per batch, `per_unit` per token/pixel/row |

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::Reject;
use crate::model::BatchKey;

/// How many recent batches `vramroom_batch_*_peak_bytes` show.
pub const RECENT_BATCHES: usize = 8;

/// Latency buckets, seconds.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Batch-size buckets, samples.
pub const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }
    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }
    pub fn count(&self) -> u64 {
        self.count
    }
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cum}", fmt_f(*b));
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", fmt_f(self.sum));
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// One finished batch, for the predicted-vs-actual gauges.
#[derive(Debug, Clone)]
pub struct BatchRecord {
    pub seq: u64,
    pub key: BatchKey,
    pub samples: usize,
    pub requests: usize,
    pub predicted_bytes: u64,
    /// Peak allocated above the batch's start, when no other batch overlapped it.
    pub actual_bytes: Option<u64>,
    pub compute_s: f64,
    pub ok: bool,
}

struct Hists {
    batch_size: Histogram,
    queue: Histogram,
    compute: Histogram,
    duration: Histogram,
}

/// What the server counts.
pub struct Metrics {
    pub cancelled: AtomicU64,
    by_code: Mutex<BTreeMap<u16, u64>>,
    rejections: [AtomicU64; Reject::ALL.len()],
    hists: Mutex<Hists>,
    recent: Mutex<VecDeque<BatchRecord>>,
    batches: AtomicU64,
    underestimates: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The allocator's figures at scrape time.
#[derive(Debug, Clone, Default)]
pub struct MemoryView {
    pub allocated: u64,
    pub reserved: u64,
    pub capacity: u64,
    pub stats: BTreeMap<String, i64>,
}

/// The scheduler's figures at scrape time.
#[derive(Debug, Clone, Default)]
pub struct SchedView {
    pub queue_depth: usize,
    pub queue_samples: usize,
    pub running: usize,
    pub committed: u64,
    pub limit: u64,
    pub cost_fixed_s: f64,
    pub cost_per_unit_s: f64,
    pub quiet_cost_fixed_s: f64,
    pub quiet_cost_per_unit_s: f64,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            cancelled: AtomicU64::new(0),
            by_code: Mutex::new(BTreeMap::new()),
            rejections: Default::default(),
            hists: Mutex::new(Hists {
                batch_size: Histogram::new(&BATCH_BUCKETS),
                queue: Histogram::new(&LATENCY_BUCKETS),
                compute: Histogram::new(&LATENCY_BUCKETS),
                duration: Histogram::new(&LATENCY_BUCKETS),
            }),
            recent: Mutex::new(VecDeque::new()),
            batches: AtomicU64::new(0),
            underestimates: AtomicU64::new(0),
        }
    }
    /// A `/v1/infer` answer with this status.
    pub fn count_response(&self, code: u16) {
        *self.by_code.lock().entry(code).or_default() += 1;
    }
    pub fn reject(&self, r: Reject) {
        if let Some(i) = Reject::ALL.iter().position(|&x| x == r) {
            self.rejections[i].fetch_add(1, Ordering::Relaxed);
        }
    }
    /// Every 503 so far, whatever the reason.
    pub fn rejections_total(&self) -> u64 {
        self.rejections
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .sum()
    }
    pub fn rejections(&self, r: Reject) -> u64 {
        Reject::ALL
            .iter()
            .position(|&x| x == r)
            .map_or(0, |i| self.rejections[i].load(Ordering::Relaxed))
    }
    pub fn responses(&self, code: u16) -> u64 {
        self.by_code.lock().get(&code).copied().unwrap_or(0)
    }
    pub fn observe_request(&self, queue_s: f64, compute_s: f64) {
        let mut h = self.hists.lock();
        h.queue.observe(queue_s);
        h.compute.observe(compute_s);
    }
    pub fn observe_duration(&self, s: f64) {
        self.hists.lock().duration.observe(s);
    }
    pub fn record_batch(&self, b: BatchRecord) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.hists.lock().batch_size.observe(b.samples as f64);
        if b.actual_bytes.is_some_and(|a| a > b.predicted_bytes) {
            self.underestimates.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                predicted = b.predicted_bytes,
                actual = b.actual_bytes,
                key = %b.key,
                samples = b.samples,
                "a batch peaked above its predicted memory"
            );
        }
        let mut r = self.recent.lock();
        r.push_front(b);
        r.truncate(RECENT_BATCHES);
    }
    /// The last batches, newest first.
    pub fn recent_batches(&self) -> Vec<BatchRecord> {
        self.recent.lock().iter().cloned().collect()
    }
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, mem: &MemoryView, sched: &SchedView) -> String {
        let mut o = String::with_capacity(16 * 1024);
        let stat = |k: &str| mem.stats.get(k).copied().unwrap_or(0).max(0) as u64;
        gauge(
            &mut o,
            "vramroom_memory_allocated_bytes",
            "Bytes in allocated blocks now (torch.cuda.memory_allocated).",
            mem.allocated,
        );
        gauge(
            &mut o,
            "vramroom_memory_reserved_bytes",
            "Bytes the caching allocator holds from the device now (torch.cuda.memory_reserved).",
            mem.reserved,
        );
        gauge(
            &mut o,
            "vramroom_memory_capacity_bytes",
            "The device's memory capacity (simulated on cpu).",
            mem.capacity,
        );
        gauge(
            &mut o,
            "vramroom_max_memory_allocated_bytes",
            "Peak allocated bytes since start (torch.cuda.max_memory_allocated).",
            stat("allocated_bytes.all.peak"),
        );
        gauge(
            &mut o,
            "vramroom_max_memory_reserved_bytes",
            "Peak reserved bytes since start (torch.cuda.max_memory_reserved).",
            stat("reserved_bytes.all.peak"),
        );
        let _ = writeln!(
            o,
            "# HELP vramroom_num_ooms_total Out-of-memory errors the allocator raised (memory_stats num_ooms).\n\
             # TYPE vramroom_num_ooms_total counter\nvramroom_num_ooms_total {}",
            stat("num_ooms")
        );
        let _ = writeln!(
            o,
            "# HELP vramroom_memory_stats The allocator's memory_stats(), one series per key.\n\
             # TYPE vramroom_memory_stats gauge"
        );
        for (k, v) in &mem.stats {
            let _ = writeln!(o, "vramroom_memory_stats{{key=\"{}\"}} {v}", escape(k));
        }
        gauge(
            &mut o,
            "vramroom_admission_limit_bytes",
            "Capacity minus margin: what admitted work may add up to.",
            sched.limit,
        );
        gauge(
            &mut o,
            "vramroom_admission_committed_bytes",
            "max(allocated, idle base + running predictions) + queued predictions.",
            sched.committed,
        );
        let _ = writeln!(
            o,
            "# HELP vramroom_requests_total Answers to POST /v1/infer by HTTP status.\n\
             # TYPE vramroom_requests_total counter"
        );
        {
            let by_code = self.by_code.lock();
            if by_code.is_empty() {
                let _ = writeln!(o, "vramroom_requests_total{{code=\"200\"}} 0");
            }
            for (c, n) in by_code.iter() {
                let _ = writeln!(o, "vramroom_requests_total{{code=\"{c}\"}} {n}");
            }
        }
        let _ = writeln!(
            o,
            "# HELP vramroom_admission_rejections_total Requests answered 503 by reason.\n\
             # TYPE vramroom_admission_rejections_total counter"
        );
        for (i, r) in Reject::ALL.iter().enumerate() {
            let _ = writeln!(
                o,
                "vramroom_admission_rejections_total{{reason=\"{}\"}} {}",
                r.label(),
                self.rejections[i].load(Ordering::Relaxed)
            );
        }
        counter(
            &mut o,
            "vramroom_requests_cancelled_total",
            "Requests whose client went away before their batch ran (never computed).",
            self.cancelled.load(Ordering::Relaxed),
        );
        gauge(
            &mut o,
            "vramroom_queue_depth",
            "Requests waiting for a batch.",
            sched.queue_depth as u64,
        );
        gauge(
            &mut o,
            "vramroom_queue_samples",
            "Samples waiting for a batch.",
            sched.queue_samples as u64,
        );
        gauge(
            &mut o,
            "vramroom_batches_running",
            "Batches on the compute threads now.",
            sched.running as u64,
        );
        counter(
            &mut o,
            "vramroom_batches_total",
            "Batches run.",
            self.batches(),
        );
        {
            let h = self.hists.lock();
            h.batch_size
                .render(&mut o, "vramroom_batch_size", "Samples per batch.");
            h.queue.render(
                &mut o,
                "vramroom_request_queue_seconds",
                "Time from arrival to the start of the request's batch.",
            );
            h.compute.render(
                &mut o,
                "vramroom_request_compute_seconds",
                "Compute time of the request's batch.",
            );
            h.duration.render(
                &mut o,
                "vramroom_request_duration_seconds",
                "Time from arrival to answer inside the server, successful requests.",
            );
        }
        let recent = self.recent_batches();
        let _ = writeln!(
            o,
            "# HELP vramroom_batch_predicted_peak_bytes Predicted peak above base of the last batches (slot 0 newest).\n\
             # TYPE vramroom_batch_predicted_peak_bytes gauge"
        );
        for (i, b) in recent.iter().enumerate() {
            let _ = writeln!(
                o,
                "vramroom_batch_predicted_peak_bytes{{slot=\"{i}\"}} {}",
                b.predicted_bytes
            );
        }
        let _ = writeln!(
            o,
            "# HELP vramroom_batch_actual_peak_bytes Measured peak above base of the same batches (NaN: overlapped another batch).\n\
             # TYPE vramroom_batch_actual_peak_bytes gauge"
        );
        for (i, b) in recent.iter().enumerate() {
            let v = b.actual_bytes.map_or("NaN".to_string(), |a| a.to_string());
            let _ = writeln!(o, "vramroom_batch_actual_peak_bytes{{slot=\"{i}\"}} {v}");
        }
        let _ = writeln!(
            o,
            "# HELP vramroom_batch_samples Samples in the same batches.\n# TYPE vramroom_batch_samples gauge"
        );
        for (i, b) in recent.iter().enumerate() {
            let _ = writeln!(o, "vramroom_batch_samples{{slot=\"{i}\"}} {}", b.samples);
        }
        counter(
            &mut o,
            "vramroom_prediction_underestimates_total",
            "Batches that peaked above their predicted memory.",
            self.underestimates.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            o,
            "# HELP vramroom_compute_model_seconds Fitted batch compute time, fixed per batch and per unit (token, pixel or row): fit=\"live\" all batches, fit=\"quiet\" batches while nothing was shed (anchors the auto latency target).\n\
             # TYPE vramroom_compute_model_seconds gauge"
        );
        for (fit, fixed, per) in [
            ("live", sched.cost_fixed_s, sched.cost_per_unit_s),
            (
                "quiet",
                sched.quiet_cost_fixed_s,
                sched.quiet_cost_per_unit_s,
            ),
        ] {
            let _ = writeln!(
                o,
                "vramroom_compute_model_seconds{{fit=\"{fit}\",term=\"fixed\"}} {}\n\
                 vramroom_compute_model_seconds{{fit=\"{fit}\",term=\"per_unit\"}} {}",
                fmt_f(fixed),
                fmt_f(per)
            );
        }
        o
    }
}

/// One counter family with a series per `(label value, count)`.
pub(crate) fn labelled_counter(
    o: &mut String,
    name: &str,
    help: &str,
    label: &str,
    series: &[(String, u64)],
) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
    for (v, n) in series {
        let _ = writeln!(o, "{name}{{{label}=\"{}\"}} {n}", escape(v));
    }
}

/// Several expositions of the same families (one per replica) as one: each family's
/// `# HELP`/`# TYPE` once, then the samples of every part, each with `label="name"` of
/// its part added first. The text format wants a family's samples together, so the
/// parts cannot simply be concatenated.
pub fn merge_labelled(label: &str, parts: &[(String, String)]) -> String {
    // family name -> (header lines, sample lines), in first-seen order
    let mut order: Vec<String> = Vec::new();
    let mut fams: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for (k, (value, text)) in parts.iter().enumerate() {
        let add = format!("{label}=\"{}\"", escape(value));
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
            {
                current = rest.split(' ').next().unwrap_or("").to_string();
                let f = fams.entry(current.clone()).or_insert_with(|| {
                    order.push(current.clone());
                    Default::default()
                });
                if k == 0 {
                    f.0.push(line.to_string());
                }
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let labelled = match line.find(['{', ' ']) {
                Some(i) if line.as_bytes()[i] == b'{' => {
                    let rest = &line[i + 1..];
                    let sep = if rest.starts_with('}') { "" } else { "," };
                    format!("{}{{{add}{sep}{rest}", &line[..i])
                }
                Some(i) => format!("{}{{{add}}}{}", &line[..i], &line[i..]),
                None => continue,
            };
            fams.entry(current.clone())
                .or_insert_with(|| {
                    order.push(current.clone());
                    Default::default()
                })
                .1
                .push(labelled);
        }
    }
    let mut o = String::with_capacity(parts.iter().map(|p| p.1.len() + p.1.len() / 4).sum());
    for name in &order {
        if let Some((head, samples)) = fams.get(name) {
            for l in head.iter().chain(samples) {
                o.push_str(l);
                o.push('\n');
            }
        }
    }
    o
}

pub(crate) fn gauge(o: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

pub(crate) fn counter(o: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

/// A float as Prometheus writes it (shortest round-trip form).
fn fmt_f(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Label-value escaping of the text format.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_with_inf() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.5, 1.5, 3.0] {
            h.observe(v);
        }
        let mut o = String::new();
        h.render(&mut o, "x", "help");
        assert!(o.contains("x_bucket{le=\"1\"} 1\n"), "{o}");
        assert!(o.contains("x_bucket{le=\"2\"} 3\n"), "{o}");
        assert!(o.contains("x_bucket{le=\"+Inf\"} 4\n"), "{o}");
        assert!(
            o.contains("x_sum 6.5\n") && o.contains("x_count 4\n"),
            "{o}"
        );
    }

    #[test]
    fn replicas_merge_into_one_family_each_with_a_device_label() {
        let a = "# HELP x_total help\n# TYPE x_total counter\nx_total 1\n\
                 # HELP h hist\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_sum 3\nh_count 2\n";
        let b = a.replace("x_total 1", "x_total 5");
        let m = merge_labelled(
            "device",
            &[("cuda:0".into(), a.into()), ("cuda:1".into(), b)],
        );
        assert_eq!(m.matches("# TYPE x_total counter").count(), 1, "{m}");
        assert_eq!(m.matches("# HELP h hist").count(), 1, "{m}");
        assert!(
            m.contains("x_total{device=\"cuda:0\"} 1\nx_total{device=\"cuda:1\"} 5\n"),
            "{m}"
        );
        assert!(
            m.contains("h_bucket{device=\"cuda:1\",le=\"1\"} 2\n"),
            "{m}"
        );
        assert!(m.contains("h_count{device=\"cuda:0\"} 2\n"), "{m}");
        // a family's samples stay together: the second family starts after both x_total
        let x1 = m.find("x_total{device=\"cuda:1\"}").unwrap();
        assert!(m.find("# HELP h").unwrap() > x1, "{m}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
