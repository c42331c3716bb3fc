//! Measurement: the memory timeline, per-request records, latency histograms.
//!
//! Design note: memory is seen two ways. A sampler thread reads the allocator's stats at a
//! fixed rate (the shape of the run), and an allocator [`Observer`] sees every event (the
//! exact peaks, which a sampler would miss between ticks). The observer runs under the
//! allocator's lock, so it must not call the allocator: it keeps its own [`DeviceStats`]
//! mirror, fed the same events the allocator's stats are fed, and so knows allocated,
//! reserved, active and inactive-split bytes after every event for free. It may read the
//! runtime's category tracker (that lock is never held while the allocator lock is taken).
//!
//! A new peak is recorded when it ends — at the first event after the maximum that is not
//! another allocation — so a forward pass that climbs through a thousand allocations yields
//! one peak sample, not a thousand; at most one peak sample per millisecond is kept, and
//! the exact run-wide peak is kept apart in any case.
//!
//! The timeline is capped ([`MAX_SAMPLES`]), and events (peaks, OOMs) may fill only part
//! of it ([`MAX_EVENT_SAMPLES`]): an OOM storm records a sample per OOM, and without the
//! split it filled the timeline mid-load, so the sampler's readings after that (the one at
//! rest above all, which the leak rule reads) were dropped and in-flight memory read as
//! memory held at rest. The reading at rest after the load ([`Timeline::sample_at_rest`])
//! is always kept.
//!
//! Latency goes into HDR histograms (microseconds, 3 significant digits) built after the
//! run from the per-request records, so any grouping (stage, concurrency) is exact.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

use vramroom_alloc::{AllocEvent, DeviceStats, Observer, PoolKind};
use vramroom_tensor::{CategoryBreakdown, Device, MemoryCategory};

use crate::memsource::MemoryReading;
use crate::results::{CategoryBytes, LatencyStats, MemorySample, SampleKind};

/// Hard cap on timeline length, so a long run at a high sample rate stays plottable.
pub const MAX_SAMPLES: usize = 50_000;
/// Of which event samples (peaks, OOMs) may take at most this many; the rest is the
/// sampler's.
pub const MAX_EVENT_SAMPLES: usize = MAX_SAMPLES * 4 / 5;

pub fn category_bytes(b: &CategoryBreakdown) -> CategoryBytes {
    CategoryBytes {
        parameter: b.get(MemoryCategory::Parameter),
        gradient: b.get(MemoryCategory::Gradient),
        optimizer_state: b.get(MemoryCategory::OptimizerState),
        activation: b.get(MemoryCategory::Activation),
        temporary: b.get(MemoryCategory::Temporary),
        input: b.get(MemoryCategory::Input),
    }
}

/// What the load controller tells the measurement side: the stage and concurrency now.
#[derive(Default)]
pub struct Phase {
    pub stage: AtomicUsize,
    pub concurrency: AtomicUsize,
}

/// Per-stage peaks as seen by the observer.
#[derive(Debug, Clone, Copy, Default)]
pub struct StagePeak {
    pub allocated: u64,
    pub reserved: u64,
}

/// State shared by the observer, the sampler and the run.
pub struct Timeline {
    pub start: Instant,
    pub phase: Arc<Phase>,
    pub samples: Mutex<Vec<MemorySample>>,
    pub stage_peaks: Mutex<Vec<StagePeak>>,
    /// Run-wide peak as the observer saw it: (allocated, t_s).
    pub peak: Mutex<(u64, f64)>,
    /// Segments reserved while the pool had enough free cache: (count, bytes).
    pub fragmented: Mutex<(u64, u64)>,
}

impl Timeline {
    pub fn new(start: Instant, phase: Arc<Phase>) -> Arc<Timeline> {
        Arc::new(Timeline {
            start,
            phase,
            samples: Mutex::new(Vec::new()),
            stage_peaks: Mutex::new(Vec::new()),
            peak: Mutex::new((0, 0.0)),
            fragmented: Mutex::new((0, 0)),
        })
    }
    pub fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
    pub fn push(&self, s: MemorySample) {
        let cap = if s.kind == SampleKind::Periodic {
            MAX_SAMPLES
        } else {
            MAX_EVENT_SAMPLES
        };
        let mut v = self.samples.lock();
        if v.len() < cap {
            v.push(s);
        }
    }
    /// A periodic sample from the allocator's own stats (takes the allocator lock).
    pub fn sample_now(&self, stats: &DeviceStats, device: &Device, used: Option<u64>) {
        self.sample_now_with(stats, device, used, None);
    }
    /// A periodic sample with a reading of an outside memory source (NVML) joined to it:
    /// the process's bytes on the device and, from them, the context + library overhead.
    pub fn sample_now_with(
        &self,
        stats: &DeviceStats,
        device: &Device,
        used: Option<u64>,
        ext: Option<&MemoryReading>,
    ) {
        self.push(self.reading(stats, device, used, ext));
    }
    /// The periodic sample at rest, after the load: kept even on a full timeline (the leak
    /// rule reads it; see the module note).
    pub fn sample_at_rest(
        &self,
        stats: &DeviceStats,
        device: &Device,
        used: Option<u64>,
        ext: Option<&MemoryReading>,
    ) {
        let s = self.reading(stats, device, used, ext);
        self.samples.lock().push(s);
    }
    fn reading(
        &self,
        stats: &DeviceStats,
        device: &Device,
        used: Option<u64>,
        ext: Option<&MemoryReading>,
    ) -> MemorySample {
        let mut s = sample_from(
            stats,
            self.t(),
            SampleKind::Periodic,
            &self.phase,
            category_bytes(&device.memory_by_category()),
            used,
        );
        if let Some(e) = ext {
            join_reading(&mut s, e);
        }
        s
    }
    /// Samples sorted by time (observer and sampler interleave).
    pub fn sorted_samples(&self) -> Vec<MemorySample> {
        let mut v = self.samples.lock().clone();
        v.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
        v
    }
}

/// Joins an outside reading to an allocator sample: the process figure, the overhead over
/// the allocator's reserved bytes, and device used where the device itself said nothing.
pub fn join_reading(s: &mut MemorySample, e: &MemoryReading) {
    s.process_used_bytes = e.process_used;
    s.overhead_bytes = e.process_used.map(|p| p.saturating_sub(s.reserved_bytes));
    if s.device_used_bytes.is_none() {
        s.device_used_bytes = e.device_used;
    }
}

fn sample_from(
    st: &DeviceStats,
    t_s: f64,
    kind: SampleKind,
    phase: &Phase,
    categories: CategoryBytes,
    device_used_bytes: Option<u64>,
) -> MemorySample {
    let g = |s: &vramroom_alloc::StatArray| s.all().current.max(0) as u64;
    MemorySample {
        t_s,
        kind,
        stage: phase.stage.load(Ordering::Relaxed),
        concurrency: phase.concurrency.load(Ordering::Relaxed),
        allocated_bytes: g(&st.allocated_bytes),
        reserved_bytes: g(&st.reserved_bytes),
        active_bytes: g(&st.active_bytes),
        inactive_split_bytes: g(&st.inactive_split_bytes),
        device_used_bytes,
        process_used_bytes: None,
        overhead_bytes: None,
        categories,
    }
}

/// The allocator observer: mirrors the stats, records peaks and OOM moments.
pub struct PeakObserver {
    stats: DeviceStats,
    timeline: Arc<Timeline>,
    device: Device,
    pending_peak: bool,
    run_peak: u64,
    last_peak_push: f64,
    /// A segment just reserved, waiting for the allocation it was made for:
    /// (pool, segment bytes, free cached bytes in the pool before it).
    pending_segment: Option<(PoolKind, u64, u64)>,
}

impl PeakObserver {
    /// `stats`: the allocator's stats at install time (the mirror starts from them).
    pub fn new(stats: DeviceStats, timeline: Arc<Timeline>, device: Device) -> PeakObserver {
        let run_peak = stats.allocated_bytes.all().current.max(0) as u64;
        PeakObserver {
            stats,
            timeline,
            device,
            pending_peak: false,
            run_peak,
            last_peak_push: f64::NEG_INFINITY,
            pending_segment: None,
        }
    }
    fn sample(&self, kind: SampleKind) -> MemorySample {
        sample_from(
            &self.stats,
            self.timeline.t(),
            kind,
            &self.timeline.phase,
            category_bytes(&self.device.memory_by_category()),
            None,
        )
    }
}

impl Observer for PeakObserver {
    fn on_event(&mut self, ev: &AllocEvent) {
        // Peak allocated before this event: a free right after a maximum ends that peak.
        let before = self.stats.allocated_bytes.all().current.max(0) as u64;
        if self.pending_peak && !matches!(ev, AllocEvent::Alloc { .. }) {
            self.pending_peak = false;
            let t = self.timeline.t();
            if t - self.last_peak_push >= 1e-3 {
                self.last_peak_push = t;
                let s = self.sample(SampleKind::Peak);
                self.timeline.push(s);
            }
            let mut p = self.timeline.peak.lock();
            if before >= p.0 {
                *p = (before, t);
            }
        }
        match *ev {
            AllocEvent::SegmentAlloc { pool, size, .. }
            | AllocEvent::SegmentMap { pool, size, .. } => {
                let t = pool.stat_type();
                let free = self.stats.reserved_bytes.get(t).current
                    - self.stats.allocated_bytes.get(t).current;
                self.pending_segment = Some((pool, size, free.max(0) as u64));
            }
            AllocEvent::Alloc {
                pool, block_size, ..
            } => {
                if let Some((p, size, free)) = self.pending_segment.take() {
                    if p == pool && free >= block_size {
                        let mut f = self.timeline.fragmented.lock();
                        f.0 += 1;
                        f.1 += size;
                    }
                }
            }
            _ => {}
        }
        self.stats.observe(ev);
        let alloc = self.stats.allocated_bytes.all().current.max(0) as u64;
        let reserved = self.stats.reserved_bytes.all().current.max(0) as u64;
        if alloc > self.run_peak {
            self.run_peak = alloc;
            self.pending_peak = true;
        }
        let stage = self.timeline.phase.stage.load(Ordering::Relaxed);
        {
            let mut sp = self.timeline.stage_peaks.lock();
            if sp.len() <= stage {
                sp.resize(stage + 1, StagePeak::default());
            }
            if let Some(p) = sp.get_mut(stage) {
                p.allocated = p.allocated.max(alloc);
                p.reserved = p.reserved.max(reserved);
            }
        }
        if matches!(ev, AllocEvent::Oom { .. }) {
            let s = self.sample(SampleKind::Oom);
            self.timeline.push(s);
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Oom,
    /// Another error, by kind.
    Error(&'static str),
    /// Cut off in flight when the load ended (its duration was over, or Ctrl-C): neither
    /// a success nor a failure of the service, counted apart.
    Stopped,
}

/// One request as it ran.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub request: u64,
    pub worker: usize,
    pub stage: usize,
    pub concurrency: usize,
    pub start_s: f64,
    pub latency_us: u64,
    pub items: u64,
    pub outcome: Outcome,
}

/// Latency percentiles of a set of microsecond values.
pub fn latency_stats<'a>(latencies_us: impl Iterator<Item = &'a u64>) -> LatencyStats {
    let Ok(mut h) = Histogram::<u64>::new_with_bounds(1, 24 * 3_600_000_000, 3) else {
        return LatencyStats::default();
    };
    for &v in latencies_us {
        // saturating_record clamps to the bounds instead of failing on 0 µs or > 24 h.
        h.saturating_record(v.max(1));
    }
    let n = h.len();
    histogram_stats(Some(&h), n)
}

/// Percentiles of a histogram of microseconds, with `count` the number of real requests (a
/// coordinated-omission-corrected histogram also holds synthetic ones): the one place
/// latency percentiles are read, for in-process and HTTP runs.
pub fn histogram_stats(h: Option<&Histogram<u64>>, count: u64) -> LatencyStats {
    let Some(h) = h.filter(|h| !h.is_empty()) else {
        return LatencyStats::default();
    };
    let ms = |us: u64| us as f64 / 1000.0;
    LatencyStats {
        count,
        min_ms: ms(h.min()),
        mean_ms: h.mean() / 1000.0,
        p50_ms: ms(h.value_at_quantile(0.50)),
        p90_ms: ms(h.value_at_quantile(0.90)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        p999_ms: ms(h.value_at_quantile(0.999)),
        max_ms: ms(h.max()),
    }
}

/// Least-squares `y ≈ a + b·x`, with R². `None` with fewer than two distinct x.
pub fn linear_fit(points: &[(f64, f64)]) -> Option<crate::results::LinearFit> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = sxy / sxx;
    let a = my - b * mx;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let ss_res: f64 = points.iter().map(|p| (p.1 - (a + b * p.0)).powi(2)).sum();
    let r2 = if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else {
        1.0
    };
    Some(crate::results::LinearFit { a, b, r2 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OOM storm's event samples cannot crowd out the sampler's, and the reading at
    /// rest is kept even on a full timeline.
    #[test]
    fn events_leave_room_for_the_sampler_and_the_reading_at_rest() {
        let t = Timeline::new(Instant::now(), Arc::new(Phase::default()));
        let d = Device::meta_caching(1 << 30, Default::default());
        let sample = |kind| MemorySample {
            kind,
            ..t.reading(&DeviceStats::default(), &d, None, None)
        };
        for _ in 0..MAX_SAMPLES {
            t.push(sample(SampleKind::Oom));
        }
        assert_eq!(t.samples.lock().len(), MAX_EVENT_SAMPLES);
        for _ in 0..MAX_SAMPLES {
            t.push(sample(SampleKind::Periodic));
        }
        assert_eq!(t.samples.lock().len(), MAX_SAMPLES);
        t.sample_at_rest(&DeviceStats::default(), &d, None, None);
        let v = t.samples.lock();
        assert_eq!(v.len(), MAX_SAMPLES + 1);
        assert_eq!(v.last().map(|s| s.kind), Some(SampleKind::Periodic));
    }

    #[test]
    fn fit_recovers_a_line() {
        let pts: Vec<(f64, f64)> = (1..=4).map(|x| (x as f64, 10.0 + 3.0 * x as f64)).collect();
        let f = linear_fit(&pts).unwrap();
        assert!((f.a - 10.0).abs() < 1e-9 && (f.b - 3.0).abs() < 1e-9 && f.r2 > 0.999);
        assert!(linear_fit(&[(1.0, 2.0)]).is_none());
        assert!(linear_fit(&[(1.0, 2.0), (1.0, 3.0)]).is_none());
    }

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let s = latency_stats(v.iter());
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 500.0).abs() < 1.0, "{}", s.p50_ms);
        assert!((s.p99_ms - 990.0).abs() < 2.0, "{}", s.p99_ms);
        assert!((s.max_ms - 1000.0).abs() < 1.0);
        assert_eq!(latency_stats([].iter()).count, 0);
    }
}
