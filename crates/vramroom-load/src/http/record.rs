//! Recording answers: HDR histograms and counters per stage, and answers by class over
//! time, kept per runtime thread.
//!
//! Design note: at tens of thousands of requests per second a shared lock or a shared
//! counter would be the client's bottleneck, and a histogram per worker would cost
//! hundreds of kilobytes per worker (thousands of workers in an open run). So each runtime
//! thread records into its own accumulator, found through a thread-local and registered
//! with the run's [`Recorder`] the first time that thread records; recording is a sync
//! section with no `.await`, so a task that moves between threads never splits one record
//! across two accumulators. The accumulator's mutex is only ever contended at the end,
//! when [`Recorder::finish`] merges them (stage by stage, histogram by histogram). Per
//! request this costs a thread-local lookup, an uncontended lock and an HDR record.
//!
//! Latency is recorded in microseconds (1 µs to 1 h, 3 significant digits). In the open
//! model a record carries two values: from the intended send time (the corrected latency)
//! and from the actual send (uncorrected). In the closed model only the measured value is
//! recorded and the correction is applied per stage at the end ([`corrected`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

use crate::http::client::ErrorKind;
use crate::results::LatencyStats;

/// Highest latency a histogram holds (µs); longer ones are clamped to it.
pub const HIST_MAX_US: u64 = 3_600_000_000;

pub fn new_hist() -> Histogram<u64> {
    // Constant, valid bounds: 1 ≤ low, high ≥ 2·low, 3 significant digits.
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("constant histogram bounds")
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `oom`: a 5xx whose body names a CUDA OOM.
    Answer {
        status: u16,
        body_bytes: u64,
        oom: bool,
    },
    Error(ErrorKind),
}

/// One finished request.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    pub stage: usize,
    /// As the run measures latency: from the intended send time (open) or the send (closed).
    pub latency_us: u64,
    /// From the actual send (open model; equal to `latency_us` in the closed model).
    pub raw_us: u64,
    /// Completion time, seconds since the run started.
    pub t_done_s: f64,
    pub outcome: Outcome,
    /// Request bytes (head and body).
    pub bytes_out: u64,
}

/// Per-stage counters and histograms.
#[derive(Clone)]
pub struct StageAcc {
    /// Ok answers (1xx–3xx), as measured.
    pub ok: Option<Histogram<u64>>,
    /// Ok answers from the actual send (open model only).
    pub ok_raw: Option<Histogram<u64>>,
    /// 503 answers, as measured.
    pub shed: Option<Histogram<u64>>,
    pub statuses: Vec<(u16, u64)>,
    pub errors: [u64; ErrorKind::ALL.len()],
    pub total: u64,
    pub ok_n: u64,
    pub shed_n: u64,
    /// 4xx and 5xx answers other than 503.
    pub failed_status_n: u64,
    /// Of those, 5xx answers whose body names a CUDA OOM.
    pub oom_n: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl Default for StageAcc {
    fn default() -> Self {
        StageAcc {
            ok: None,
            ok_raw: None,
            shed: None,
            statuses: Vec::new(),
            errors: [0; ErrorKind::ALL.len()],
            total: 0,
            ok_n: 0,
            shed_n: 0,
            failed_status_n: 0,
            oom_n: 0,
            bytes_in: 0,
            bytes_out: 0,
        }
    }
}

fn rec(h: &mut Option<Histogram<u64>>, us: u64) {
    h.get_or_insert_with(new_hist).saturating_record(us.max(1));
}

fn merge_hist(into: &mut Option<Histogram<u64>>, from: &Option<Histogram<u64>>) {
    if let Some(f) = from {
        match into {
            Some(i) => {
                // Same bounds on both sides: `add` cannot fail.
                let _ = i.add(f);
            }
            None => *into = Some(f.clone()),
        }
    }
}

impl StageAcc {
    pub fn errors_total(&self) -> u64 {
        self.errors.iter().sum()
    }
    pub fn merge(&mut self, o: &StageAcc) {
        merge_hist(&mut self.ok, &o.ok);
        merge_hist(&mut self.ok_raw, &o.ok_raw);
        merge_hist(&mut self.shed, &o.shed);
        for &(s, n) in &o.statuses {
            add_status(&mut self.statuses, s, n);
        }
        for (a, b) in self.errors.iter_mut().zip(o.errors.iter()) {
            *a += b;
        }
        self.total += o.total;
        self.ok_n += o.ok_n;
        self.shed_n += o.shed_n;
        self.failed_status_n += o.failed_status_n;
        self.oom_n += o.oom_n;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
    }
    pub fn status_map(&self) -> BTreeMap<String, u64> {
        self.statuses
            .iter()
            .map(|(s, n)| (s.to_string(), *n))
            .collect()
    }
    pub fn error_map(&self) -> BTreeMap<String, u64> {
        ErrorKind::ALL
            .iter()
            .filter(|k| self.errors[k.index()] > 0)
            .map(|k| (k.as_str().to_string(), self.errors[k.index()]))
            .collect()
    }
}

fn add_status(v: &mut Vec<(u16, u64)>, s: u16, n: u64) {
    match v.iter_mut().find(|x| x.0 == s) {
        Some(x) => x.1 += n,
        None => {
            v.push((s, n));
            v.sort_unstable();
        }
    }
}

/// Answers by class in one time bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketAcc {
    pub ok: u64,
    pub shed: u64,
    pub client_error: u64,
    pub server_error: u64,
    pub transport_error: u64,
    pub ok_latency_sum_us: u64,
}

impl BucketAcc {
    fn merge(&mut self, o: &BucketAcc) {
        self.ok += o.ok;
        self.shed += o.shed;
        self.client_error += o.client_error;
        self.server_error += o.server_error;
        self.transport_error += o.transport_error;
        self.ok_latency_sum_us += o.ok_latency_sum_us;
    }
}

#[derive(Default)]
struct Acc {
    stages: Vec<StageAcc>,
    buckets: Vec<BucketAcc>,
}

impl Acc {
    fn add(&mut self, d: &Done, bucket_s: f64, open: bool) {
        if self.stages.len() <= d.stage {
            self.stages.resize_with(d.stage + 1, StageAcc::default);
        }
        let st = &mut self.stages[d.stage];
        st.total += 1;
        st.bytes_out += d.bytes_out;
        let b = (d.t_done_s.max(0.0) / bucket_s) as usize;
        // A bucket index from a wildly wrong clock must not allocate the machine.
        let b = b.min(10_000_000);
        if self.buckets.len() <= b {
            self.buckets.resize(b + 1, BucketAcc::default());
        }
        let bk = &mut self.buckets[b];
        match d.outcome {
            Outcome::Answer {
                status,
                body_bytes,
                oom,
            } => {
                st.bytes_in += body_bytes;
                add_status(&mut st.statuses, status, 1);
                // A 503 that says CUDA OOM is a failure, not load shedding.
                if status == 503 && !oom {
                    st.shed_n += 1;
                    rec(&mut st.shed, d.latency_us);
                    bk.shed += 1;
                } else if status < 400 {
                    st.ok_n += 1;
                    rec(&mut st.ok, d.latency_us);
                    if open {
                        rec(&mut st.ok_raw, d.raw_us);
                    }
                    bk.ok += 1;
                    bk.ok_latency_sum_us += d.latency_us;
                } else {
                    st.failed_status_n += 1;
                    st.oom_n += u64::from(oom);
                    if status < 500 {
                        bk.client_error += 1;
                    } else {
                        bk.server_error += 1;
                    }
                }
            }
            Outcome::Error(k) => {
                st.errors[k.index()] += 1;
                bk.transport_error += 1;
            }
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static LOCAL: RefCell<Option<(u64, Arc<Mutex<Acc>>)>> = const { RefCell::new(None) };
}

/// The run's recorder: hands each thread its accumulator, merges them at the end.
pub struct Recorder {
    id: u64,
    bucket_s: f64,
    open: bool,
    closed: AtomicBool,
    accs: Mutex<Vec<Arc<Mutex<Acc>>>>,
    /// For a thread whose thread-locals are being torn down.
    orphan: Arc<Mutex<Acc>>,
}

/// Everything recorded, merged.
pub struct Totals {
    /// Indexed by stage.
    pub stages: Vec<StageAcc>,
    pub buckets: Vec<BucketAcc>,
    pub bucket_s: f64,
}

impl Recorder {
    /// `bucket_s`: width of the answers-over-time buckets; `open`: keep the uncorrected
    /// histogram beside the measured one.
    pub fn new(bucket_s: f64, open: bool) -> Recorder {
        let orphan = Arc::new(Mutex::new(Acc::default()));
        Recorder {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            bucket_s: bucket_s.max(1e-3),
            open,
            closed: AtomicBool::new(false),
            accs: Mutex::new(vec![orphan.clone()]),
            orphan,
        }
    }

    pub fn record(&self, d: &Done) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let done = LOCAL.try_with(|l| {
            let mut l = l.borrow_mut();
            let mine = matches!(&*l, Some((id, _)) if *id == self.id);
            if !mine {
                let a = Arc::new(Mutex::new(Acc::default()));
                self.accs.lock().push(a.clone());
                *l = Some((self.id, a));
            }
            if let Some((_, a)) = &*l {
                a.lock().add(d, self.bucket_s, self.open);
            }
        });
        if done.is_err() {
            self.orphan.lock().add(d, self.bucket_s, self.open);
        }
    }

    /// Stops recording (later records are dropped: the run is over) and merges.
    pub fn finish(&self) -> Totals {
        self.closed.store(true, Ordering::SeqCst);
        let accs = self.accs.lock().clone();
        let mut stages: Vec<StageAcc> = Vec::new();
        let mut buckets: Vec<BucketAcc> = Vec::new();
        for a in accs {
            let a = a.lock();
            if stages.len() < a.stages.len() {
                stages.resize_with(a.stages.len(), StageAcc::default);
            }
            for (i, s) in a.stages.iter().enumerate() {
                stages[i].merge(s);
            }
            if buckets.len() < a.buckets.len() {
                buckets.resize(a.buckets.len(), BucketAcc::default());
            }
            for (i, b) in a.buckets.iter().enumerate() {
                buckets[i].merge(b);
            }
        }
        Totals {
            stages,
            buckets,
            bucket_s: self.bucket_s,
        }
    }
}

/// Percentiles of a histogram, with `count` the number of real requests (a corrected
/// histogram also holds the synthetic ones).
pub fn stats(h: Option<&Histogram<u64>>, count: u64) -> LatencyStats {
    crate::timeline::histogram_stats(h, count)
}

/// The closed model's coordinated-omission correction of one stage: HdrHistogram's
/// expected-interval correction with the stage's median as the interval. Returns the
/// corrected histogram and the interval (µs).
pub fn corrected(h: &Histogram<u64>) -> (Histogram<u64>, u64) {
    let interval = h.value_at_quantile(0.5).max(1);
    (h.clone_correct(interval), interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(stage: usize, us: u64, status: u16, t: f64) -> Done {
        Done {
            stage,
            latency_us: us,
            raw_us: us / 2,
            t_done_s: t,
            outcome: Outcome::Answer {
                status,
                oom: false,
                body_bytes: 10,
            },
            bytes_out: 5,
        }
    }

    #[test]
    fn threads_record_apart_and_merge() {
        let r = Arc::new(Recorder::new(0.1, true));
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..1000u64 {
                        let status = if i % 10 == 0 { 503 } else { 200 };
                        r.record(&done((i % 2) as usize, 1000 + i, status, t as f64 * 0.1));
                    }
                    r.record(&Done {
                        outcome: Outcome::Error(ErrorKind::Timeout),
                        ..done(0, 5, 0, 0.0)
                    });
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let t = r.finish();
        assert_eq!(t.stages.len(), 2);
        let total: u64 = t.stages.iter().map(|s| s.total).sum();
        assert_eq!(total, 4004);
        assert_eq!(t.stages.iter().map(|s| s.shed_n).sum::<u64>(), 400);
        assert_eq!(t.stages[0].errors[ErrorKind::Timeout.index()], 4);
        assert_eq!(t.stages[0].status_map()["503"], 400);
        assert_eq!(t.stages[0].ok.as_ref().unwrap().len(), 1600);
        assert_eq!(t.stages[0].ok_raw.as_ref().unwrap().len(), 1600);
        assert_eq!(t.buckets.len(), 4);
        assert!(t.buckets.iter().all(|b| b.ok == 900 && b.shed == 100));
        // After finish, records are dropped.
        r.record(&done(0, 1, 200, 0.0));
        assert_eq!(r.finish().stages[0].total, t.stages[0].total);
    }

    #[test]
    fn closed_correction_counts_the_requests_a_stall_hid() {
        // 1000 answers of 1 ms and one of 500 ms: a worker stalled for 500 ms would have
        // sent ~499 more requests meanwhile.
        let mut h = new_hist();
        for _ in 0..1000 {
            h.record(1000).unwrap();
        }
        h.record(500_000).unwrap();
        assert!(stats(Some(&h), 1001).p99_ms < 2.0);
        let (c, interval) = corrected(&h);
        assert!((999..=1001).contains(&interval));
        assert!(c.len() > 1400, "{}", c.len());
        let s = stats(Some(&c), 1001);
        assert_eq!(s.count, 1001);
        assert!(
            s.p99_ms > 100.0,
            "the corrected p99 shows the stall: {}",
            s.p99_ms
        );
    }
}
