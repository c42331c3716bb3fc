//! Allocator microbenchmarks: the cases behind PyTorch's own `raw_alloc`/`raw_delete` figures
//! (results__default.json, key `microbench`), measured on any [`Device`], plus the same
//! workloads on the system allocator as a peer.
//!
//! Design note: every case measures malloc+free *pairs* in steady state, after a warm-up, so
//! what is timed is the cache-hit path (lock, rounding, best-fit search, split, merge, stats),
//! not the device. A case is run `repeats` times; the report keeps the median and the spread.
//! Random choices come from a fixed-seed SplitMix64 and are drawn *before* the clock starts, so
//! the RNG costs nothing and every run sees the same sequence. The library reads no files:
//! PyTorch's figures are attached by the caller with [`attach_pytorch_reference`].
//!
//! ```
//! use vramroom_alloc::bench::{run_alloc_bench, BenchOptions};
//! use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};
//! let cases = run_alloc_bench(
//!     || CachingAllocator::new(SimDevice::new(150 << 30), AllocatorConfig::default()),
//!     &BenchOptions::tiny(),
//! )
//! .unwrap();
//! assert_eq!(cases.len(), 8);
//! assert!(cases.iter().all(|c| c.ns_per_pair_median > 0.0));
//! ```

use std::hint::black_box;
use std::time::Instant;

use crate::allocator::CachingAllocator;
use crate::device::Device;
use crate::oom::AllocError;
use crate::snapshot::{Snapshot, TraceAction, TraceEntry};

/// Single-size cases: PyTorch's `cpp_pair_ns_<bytes>`.
pub const SINGLE_SIZES: [u64; 5] = [512, 4096, 1 << 20, 8 << 20, 64 << 20];
/// Mixed working sets: PyTorch's `cpp_mixed_ns_live<n>`.
pub const MIXED_LIVE: [usize; 3] = [16, 256, 4096];
/// Base sizes of the mixed cases; each draw adds U[0, 4096).
pub const MIXED_SIZES: [u64; 7] = [512, 4096, 64 << 10, 1 << 20, 3 << 20, 12 << 20, 40 << 20];
/// Seed of every random sequence here.
pub const SEED: u64 = 0x4845_4144_524f_4f4d; // "VRAMROOM"

/// One measured case.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BenchCase {
    /// `single_512B`, `single_4KiB`, … `mixed_live4096`.
    pub name: String,
    /// The key of PyTorch's figure under `microbench` in results__default.json.
    pub pytorch_key: String,
    /// malloc+free pairs per repeat.
    pub pairs: u64,
    pub repeats: usize,
    /// Median over repeats of (elapsed / pairs).
    pub ns_per_pair_median: f64,
    pub ns_min: f64,
    pub ns_max: f64,
    /// PyTorch's figure for the case (C++ `raw_alloc`/`raw_delete` on the H200 host).
    pub pytorch_ns: Option<f64>,
    /// `pytorch_ns / ns_per_pair_median`: above 1 means faster than PyTorch.
    pub speedup_vs_pytorch: Option<f64>,
    /// Every repeat's ns per pair, in the order they ran (see [`paired_ratio`]).
    #[serde(skip)]
    pub samples_in_order: Vec<f64>,
}

/// How long to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub pairs: u64,
    pub repeats: usize,
    /// Untimed pairs before the first repeat (mixed cases: at least 4 × live).
    pub warmup: u64,
}

impl BenchOptions {
    /// 200,000 pairs × 9 repeats per case (about 2 s for all cases at 100 ns a pair).
    pub fn full() -> Self {
        BenchOptions {
            pairs: 200_000,
            repeats: 9,
            warmup: 20_000,
        }
    }
    /// 20,000 pairs × 5 repeats.
    pub fn quick() -> Self {
        BenchOptions {
            pairs: 20_000,
            repeats: 5,
            warmup: 5_000,
        }
    }
    /// For doctests and smoke tests.
    pub fn tiny() -> Self {
        BenchOptions {
            pairs: 200,
            repeats: 3,
            warmup: 100,
        }
    }
    pub fn new(quick: bool) -> Self {
        if quick {
            Self::quick()
        } else {
            Self::full()
        }
    }
}

/// Something that hands out and takes back memory by size: the caching allocator, or the
/// system allocator as a peer.
pub trait PairAlloc {
    fn alloc(&mut self, size: u64) -> Result<u64, AllocError>;
    /// `size` is the size given to `alloc` (the system allocator needs it).
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), AllocError>;
}

/// `raw_alloc`/`raw_delete` on stream 0.
impl<D: Device> PairAlloc for &CachingAllocator<D> {
    #[inline]
    fn alloc(&mut self, size: u64) -> Result<u64, AllocError> {
        Ok(self.malloc(size, 0)?.ptr)
    }
    #[inline]
    fn free(&mut self, ptr: u64, _size: u64) -> Result<(), AllocError> {
        CachingAllocator::free(self, ptr)
    }
}

/// `std::alloc::alloc`/`dealloc` (16-byte aligned, like `malloc`) of the same sizes.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemAlloc;

impl SystemAlloc {
    fn layout(size: u64) -> Result<std::alloc::Layout, AllocError> {
        std::alloc::Layout::from_size_align(size.max(1) as usize, 16)
            .map_err(|e| AllocError::Device(e.to_string()))
    }
}

impl PairAlloc for SystemAlloc {
    #[inline]
    fn alloc(&mut self, size: u64) -> Result<u64, AllocError> {
        let l = Self::layout(size)?;
        // SAFETY: the layout has non-zero size.
        let p = unsafe { std::alloc::alloc(l) };
        if p.is_null() {
            return Err(AllocError::Device("system allocator returned null".into()));
        }
        Ok(p as u64)
    }
    #[inline]
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), AllocError> {
        let l = Self::layout(size)?;
        // SAFETY: `ptr` came from `alloc` above with the same layout.
        unsafe { std::alloc::dealloc(ptr as *mut u8, l) };
        Ok(())
    }
}

pub use crate::rng::Rng;

/// A mixed-case size: one of [`MIXED_SIZES`] plus U[0, 4096).
#[inline]
fn mixed_size(rng: &mut Rng) -> u64 {
    MIXED_SIZES[rng.below_fast(MIXED_SIZES.len() as u64) as usize] + rng.below_fast(4096)
}

/// Human name of a single-size case.
pub fn single_name(size: u64) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("single_{}MiB", size >> 20)
    } else if size >= 1 << 10 && size.is_multiple_of(1 << 10) {
        format!("single_{}KiB", size >> 10)
    } else {
        format!("single_{size}B")
    }
}

/// The median of sorted values (NaN for none).
fn median_of_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn summarise(name: String, key: String, opts: &BenchOptions, samples: Vec<f64>) -> BenchCase {
    let samples_in_order = samples.clone();
    let mut samples = samples;
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let median = median_of_sorted(&samples);
    BenchCase {
        name,
        pytorch_key: key,
        pairs: opts.pairs,
        repeats: n,
        ns_per_pair_median: median,
        ns_min: samples.first().copied().unwrap_or(f64::NAN),
        ns_max: samples.last().copied().unwrap_or(f64::NAN),
        pytorch_ns: None,
        speedup_vs_pytorch: None,
        samples_in_order,
    }
}

/// One timed run of `pairs` malloc+free pairs of `size`; ns per pair.
#[inline(never)]
pub fn time_single<A: PairAlloc>(a: &mut A, size: u64, pairs: u64) -> Result<f64, AllocError> {
    let t = Instant::now();
    for _ in 0..pairs {
        let p = a.alloc(black_box(size))?;
        a.free(black_box(p), size)?;
    }
    Ok(t.elapsed().as_nanos() as f64 / pairs.max(1) as f64)
}

/// A working set of live blocks; each [`step`](Self::step) frees a random live block and
/// allocates a random size in its place.
pub struct MixedSet {
    live: Vec<(u64, u64)>,
    /// Pre-drawn (slot, size) for each step, replayed cyclically.
    ops: Vec<(u32, u64)>,
    next: usize,
}

impl MixedSet {
    /// Allocate `live` blocks of random sizes; draw `ops` steps in advance.
    pub fn new<A: PairAlloc>(
        a: &mut A,
        live: usize,
        ops: usize,
        seed: u64,
    ) -> Result<Self, AllocError> {
        let mut rng = Rng::new(seed ^ live as u64);
        let mut blocks = Vec::with_capacity(live);
        for _ in 0..live {
            let s = mixed_size(&mut rng);
            blocks.push((a.alloc(s)?, s));
        }
        let ops = (0..ops.max(1))
            .map(|_| (rng.below_fast(live as u64) as u32, mixed_size(&mut rng)))
            .collect();
        Ok(MixedSet {
            live: blocks,
            ops,
            next: 0,
        })
    }

    /// One free + one malloc.
    #[inline]
    pub fn step<A: PairAlloc>(&mut self, a: &mut A) -> Result<(), AllocError> {
        let (slot, size) = self.ops[self.next];
        self.next += 1;
        if self.next == self.ops.len() {
            self.next = 0;
        }
        let b = &mut self.live[slot as usize];
        a.free(black_box(b.0), b.1)?;
        *b = (a.alloc(black_box(size))?, size);
        Ok(())
    }

    /// `pairs` steps, timed; ns per pair.
    #[inline(never)]
    pub fn time<A: PairAlloc>(&mut self, a: &mut A, pairs: u64) -> Result<f64, AllocError> {
        let t = Instant::now();
        for _ in 0..pairs {
            self.step(a)?;
        }
        Ok(t.elapsed().as_nanos() as f64 / pairs.max(1) as f64)
    }

    /// Free every live block.
    pub fn release<A: PairAlloc>(self, a: &mut A) -> Result<(), AllocError> {
        for (p, s) in self.live {
            a.free(p, s)?;
        }
        Ok(())
    }
}

/// Run one single-size case on `a`.
pub fn bench_single<A: PairAlloc>(
    a: &mut A,
    size: u64,
    opts: &BenchOptions,
) -> Result<BenchCase, AllocError> {
    bench_single_paired::<A, A>(a, None, size, opts)
        .map(|(c, _)| c)
        .map_err(|e| e.source)
}

/// Run one mixed working-set case on `a`.
pub fn bench_mixed<A: PairAlloc>(
    a: &mut A,
    live: usize,
    opts: &BenchOptions,
) -> Result<BenchCase, AllocError> {
    bench_mixed_paired::<A, A>(a, None, live, opts)
        .map(|(c, _)| c)
        .map_err(|e| e.source)
}

/// Which allocator of a paired benchmark failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Ours,
    Peer,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Ours => "measured allocator",
            Side::Peer => "peer allocator",
        })
    }
}

/// An error of a paired benchmark, with the side it came from: a caller may go on without a
/// failing peer, never without its own allocator.
#[derive(Debug, thiserror::Error)]
#[error("{side}: {source}")]
pub struct PairedError {
    pub side: Side,
    #[source]
    pub source: AllocError,
}

impl Side {
    /// Tag an allocator error with this side.
    fn tag(self) -> impl FnOnce(AllocError) -> PairedError {
        move |source| PairedError { side: self, source }
    }
}

/// Repeat `time` on `ours` and, when given, on `peer`, alternating which goes first, so
/// that each repeat of one has a repeat of the other beside it in time: on a shared machine
/// (a cloud VM's neighbours, clock changes) drift then lands on both sides alike, and
/// [`paired_ratio`] compares each repeat with its partner.
fn alternate<A, B>(
    ours: &mut A,
    mut peer: Option<&mut B>,
    repeats: usize,
    mut time_ours: impl FnMut(&mut A) -> Result<f64, AllocError>,
    mut time_peer: impl FnMut(&mut B) -> Result<f64, AllocError>,
) -> Result<(Vec<f64>, Vec<f64>), PairedError> {
    let mut a = Vec::with_capacity(repeats);
    let mut b = Vec::with_capacity(repeats);
    for r in 0..repeats {
        if r % 2 == 1 {
            if let Some(p) = peer.as_deref_mut() {
                b.push(time_peer(p).map_err(Side::Peer.tag())?);
            }
        }
        a.push(time_ours(ours).map_err(Side::Ours.tag())?);
        if r % 2 == 0 {
            if let Some(p) = peer.as_deref_mut() {
                b.push(time_peer(p).map_err(Side::Peer.tag())?);
            }
        }
    }
    Ok((a, b))
}

/// [`bench_single`] on `ours` and a `peer`, their repeats interleaved.
pub fn bench_single_paired<A: PairAlloc, B: PairAlloc>(
    ours: &mut A,
    mut peer: Option<&mut B>,
    size: u64,
    opts: &BenchOptions,
) -> Result<(BenchCase, Option<BenchCase>), PairedError> {
    time_single(ours, size, opts.warmup).map_err(Side::Ours.tag())?;
    if let Some(p) = peer.as_deref_mut() {
        time_single(p, size, opts.warmup).map_err(Side::Peer.tag())?;
    }
    let has_peer = peer.is_some();
    let (a, b) = alternate(
        ours,
        peer,
        opts.repeats,
        |x| time_single(x, size, opts.pairs),
        |x| time_single(x, size, opts.pairs),
    )?;
    let case = |v| summarise(single_name(size), format!("cpp_pair_ns_{size}"), opts, v);
    Ok((case(a), has_peer.then(|| case(b))))
}

/// [`bench_mixed`] on `ours` and a `peer` (the same sizes and steps), repeats interleaved.
pub fn bench_mixed_paired<A: PairAlloc, B: PairAlloc>(
    ours: &mut A,
    mut peer: Option<&mut B>,
    live: usize,
    opts: &BenchOptions,
) -> Result<(BenchCase, Option<BenchCase>), PairedError> {
    let warm = opts.warmup.max(4 * live as u64);
    let mut set_a =
        MixedSet::new(ours, live, opts.pairs as usize, SEED).map_err(Side::Ours.tag())?;
    set_a.time(ours, warm).map_err(Side::Ours.tag())?;
    let mut set_b = match peer.as_deref_mut() {
        Some(p) => {
            let mut s =
                MixedSet::new(p, live, opts.pairs as usize, SEED).map_err(Side::Peer.tag())?;
            s.time(p, warm).map_err(Side::Peer.tag())?;
            Some(s)
        }
        None => None,
    };
    let (a, b) = alternate(
        ours,
        peer.as_deref_mut(),
        opts.repeats,
        |x| set_a.time(x, opts.pairs),
        |x| match set_b.as_mut() {
            Some(s) => s.time(x, opts.pairs),
            None => Ok(f64::NAN),
        },
    )?;
    set_a.release(ours).map_err(Side::Ours.tag())?;
    if let (Some(s), Some(p)) = (set_b, peer) {
        s.release(p).map_err(Side::Peer.tag())?;
    }
    let case = |v| {
        summarise(
            format!("mixed_live{live}"),
            format!("cpp_mixed_ns_live{live}"),
            opts,
            v,
        )
    };
    let peer_case = (!b.is_empty()).then(|| case(b));
    Ok((case(a), peer_case))
}

/// The median over repeats of `peer / ours` for a paired case (each repeat against the one
/// beside it in time): how many times faster `ours` is. `None` when the repeats do not pair.
pub fn paired_ratio(ours: &BenchCase, peer: &BenchCase) -> Option<f64> {
    if ours.samples_in_order.len() != peer.samples_in_order.len()
        || ours.samples_in_order.is_empty()
    {
        return None;
    }
    let mut r: Vec<f64> = ours
        .samples_in_order
        .iter()
        .zip(&peer.samples_in_order)
        .map(|(a, b)| b / a)
        .collect();
    r.sort_by(|a, b| a.total_cmp(b));
    Some(median_of_sorted(&r))
}

/// Every case on one `PairAlloc` made fresh per case by `make`.
pub fn run_cases<A: PairAlloc>(
    mut make: impl FnMut() -> A,
    opts: &BenchOptions,
) -> Result<Vec<BenchCase>, AllocError> {
    let mut out = Vec::new();
    for size in SINGLE_SIZES {
        out.push(bench_single(&mut make(), size, opts)?);
    }
    for live in MIXED_LIVE {
        out.push(bench_mixed(&mut make(), live, opts)?);
    }
    Ok(out)
}

/// Every case on a fresh caching allocator per case (give `make` a device of H200 size, e.g.
/// `SimDevice::new(150 << 30)`: the 4096-block mixed set holds about 33 GB).
pub fn run_alloc_bench<D: Device>(
    make: impl Fn() -> CachingAllocator<D>,
    opts: &BenchOptions,
) -> Result<Vec<BenchCase>, AllocError> {
    let mut out = Vec::new();
    for size in SINGLE_SIZES {
        let a = make();
        out.push(bench_single(&mut &a, size, opts)?);
    }
    for live in MIXED_LIVE {
        let a = make();
        out.push(bench_mixed(&mut &a, live, opts)?);
    }
    Ok(out)
}

/// The same cases on the system allocator.
pub fn run_system_bench(opts: &BenchOptions) -> Result<Vec<BenchCase>, AllocError> {
    run_cases(|| SystemAlloc, opts)
}

/// Fill in `pytorch_ns` (and the speedup) from a lookup of PyTorch's `microbench` figures by
/// key, e.g. `|k| json["microbench"][k].as_f64()`.
pub fn attach_pytorch_reference(cases: &mut [BenchCase], lookup: impl Fn(&str) -> Option<f64>) {
    for c in cases {
        c.pytorch_ns = lookup(&c.pytorch_key);
        c.speedup_vs_pytorch = c
            .pytorch_ns
            .filter(|_| c.ns_per_pair_median > 0.0)
            .map(|p| p / c.ns_per_pair_median);
    }
}

/// A plain-text table of cases, with an optional peer (same case order) for a ratio column.
pub fn format_table(cases: &[BenchCase], peer: Option<&[BenchCase]>) -> String {
    let mut s = format!(
        "{:<16} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "case", "median ns", "min", "max", "pytorch", "speedup"
    );
    if peer.is_some() {
        s += &format!(" {:>10} {:>9}", "system ns", "sys/ours");
    }
    s.push('\n');
    for (i, c) in cases.iter().enumerate() {
        let opt = |v: Option<f64>, p: usize| match v {
            Some(x) => format!("{x:.p$}"),
            None => "-".into(),
        };
        s += &format!(
            "{:<16} {:>10.1} {:>10.1} {:>10.1} {:>10} {:>9}",
            c.name,
            c.ns_per_pair_median,
            c.ns_min,
            c.ns_max,
            opt(c.pytorch_ns, 1),
            opt(c.speedup_vs_pytorch.map(|x| (x * 100.0).round() / 100.0), 2),
        );
        if let Some(p) = peer.and_then(|p| p.get(i)) {
            s += &format!(
                " {:>10.1} {:>8.2}x",
                p.ns_per_pair_median,
                p.ns_per_pair_median / c.ns_per_pair_median
            );
        }
        s.push('\n');
    }
    s
}

/// A synthetic training-like trace of exactly `events` entries on stream 0: per step, a
/// forward pass allocates one activation per layer (with a short-lived temporary), and a
/// backward pass frees them in reverse while allocating gradient temporaries. Layer sizes are
/// log-uniform in 512 B .. 64 MiB and fixed across steps, so steady state is cache hits.
/// About 1 free in 20 completes late (its `free_completed` comes a few entries later, as
/// after `record_stream`). Addresses are synthetic but consistent.
pub fn synthetic_trace(events: usize, seed: u64) -> Snapshot {
    const LAYERS: usize = 100;
    let mut rng = Rng::new(seed);
    let sizes: Vec<u64> = (0..LAYERS)
        .map(|_| {
            let log2 = 9.0 + rng.below_fast(1 << 20) as f64 / (1u64 << 20) as f64 * 17.0;
            (2f64.powf(log2) as u64).max(1)
        })
        .collect();
    let mut t = Vec::with_capacity(events + 8);
    let mut next_addr: u64 = 0x7000_0000_0000;
    let mut time: i64 = 0;
    let mut delayed: Vec<(usize, TraceEntry)> = Vec::new();
    let entry = |action, addr, size, time| TraceEntry {
        action,
        addr,
        size,
        stream: 0,
        time_us: time,
        compile_context: "".into(),
        user_metadata: "".into(),
        frames: None,
    };
    let mut alloc = |t: &mut Vec<TraceEntry>, size: u64, time: &mut i64| {
        let a = next_addr;
        next_addr += size.div_ceil(512) * 512 + 512;
        *time += 1;
        t.push(entry(TraceAction::Alloc, a, size, *time));
        a
    };
    let free = |t: &mut Vec<TraceEntry>,
                delayed: &mut Vec<(usize, TraceEntry)>,
                rng: &mut Rng,
                a: u64,
                size: u64,
                time: &mut i64| {
        *time += 1;
        t.push(entry(TraceAction::FreeRequested, a, size, *time));
        let done = entry(TraceAction::FreeCompleted, a, size, *time + 1);
        if rng.below_fast(20) == 0 {
            delayed.push((t.len() + 3 + rng.below_fast(40) as usize, done));
        } else {
            t.push(done);
        }
    };
    let flush = |t: &mut Vec<TraceEntry>, delayed: &mut Vec<(usize, TraceEntry)>| {
        let n = t.len();
        let mut i = 0;
        while i < delayed.len() {
            if delayed[i].0 <= n {
                t.push(delayed.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
    };
    let mut acts = Vec::with_capacity(LAYERS);
    while t.len() < events {
        for &s in &sizes {
            acts.push((alloc(&mut t, s, &mut time), s));
            let tmp = s / 2 + rng.below_fast(4096);
            let ta = alloc(&mut t, tmp, &mut time);
            free(&mut t, &mut delayed, &mut rng, ta, tmp, &mut time);
            flush(&mut t, &mut delayed);
        }
        while let Some((a, s)) = acts.pop() {
            let g = alloc(&mut t, s, &mut time);
            free(&mut t, &mut delayed, &mut rng, a, s, &mut time);
            free(&mut t, &mut delayed, &mut rng, g, s, &mut time);
            flush(&mut t, &mut delayed);
        }
    }
    t.truncate(events);
    Snapshot {
        device_traces: vec![t],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AllocatorConfig, SimDevice};

    #[test]
    fn cases_run_and_release_everything() {
        let a = CachingAllocator::new(SimDevice::new(150 << 30), AllocatorConfig::default());
        let opts = BenchOptions::tiny();
        let c = bench_mixed(&mut &a, 256, &opts).unwrap();
        assert_eq!(c.name, "mixed_live256");
        assert_eq!(a.memory_allocated(), 0);
        let c = bench_single(&mut &a, 4096, &opts).unwrap();
        assert_eq!(c.pytorch_key, "cpp_pair_ns_4096");
        assert!(c.ns_min <= c.ns_per_pair_median && c.ns_per_pair_median <= c.ns_max);
        let sys = run_system_bench(&opts).unwrap();
        assert_eq!(sys.len(), 8);
    }

    /// An allocator whose every call fails, as a broken peer (or a broken build) would.
    struct Broken;
    impl PairAlloc for Broken {
        fn alloc(&mut self, _size: u64) -> Result<u64, AllocError> {
            Err(AllocError::Device("broken".into()))
        }
        fn free(&mut self, _ptr: u64, _size: u64) -> Result<(), AllocError> {
            Err(AllocError::Device("broken".into()))
        }
    }

    /// A paired case says which side failed, so a caller can drop a failing peer without
    /// mistaking its own allocator's failure for the peer's.
    #[test]
    fn paired_errors_name_the_failing_side() {
        let opts = BenchOptions::tiny();
        let a = CachingAllocator::new(SimDevice::new(1 << 36), AllocatorConfig::default());
        let e = bench_single_paired(&mut &a, Some(&mut Broken), 512, &opts).unwrap_err();
        assert_eq!(e.side, Side::Peer);
        let e = bench_mixed_paired(&mut &a, Some(&mut Broken), 16, &opts).unwrap_err();
        assert_eq!(e.side, Side::Peer);
        let e = bench_single_paired(&mut Broken, Some(&mut &a), 512, &opts).unwrap_err();
        assert_eq!(e.side, Side::Ours);
        assert!(e.to_string().starts_with("measured allocator: "), "{e}");
        let e = bench_mixed_paired(&mut Broken, Some(&mut SystemAlloc), 16, &opts).unwrap_err();
        assert_eq!(e.side, Side::Ours);
    }

    #[test]
    fn paired_cases_time_both_sides_alike() {
        let opts = BenchOptions::tiny();
        let a = CachingAllocator::new(SimDevice::new(1 << 36), AllocatorConfig::default());
        let mut sys = SystemAlloc;
        let (ours, peer) = bench_mixed_paired(&mut &a, Some(&mut sys), 16, &opts).unwrap();
        let peer = peer.unwrap();
        assert_eq!((ours.repeats, peer.repeats), (3, 3));
        assert_eq!(ours.name, peer.name);
        let r = paired_ratio(&ours, &peer).unwrap();
        assert!(r.is_finite() && r > 0.0);
        assert_eq!(a.memory_allocated(), 0, "both working sets are released");
        let (_, none) = bench_single_paired::<_, SystemAlloc>(&mut &a, None, 512, &opts).unwrap();
        assert!(none.is_none());
        // The median of per-repeat ratios, not the ratio of medians.
        let case = |v: &[f64]| summarise("x".into(), "k".into(), &opts, v.to_vec());
        let got = paired_ratio(&case(&[1.0, 10.0, 2.0]), &case(&[3.0, 10.0, 2.0])).unwrap();
        assert_eq!(got, 1.0);
    }

    #[test]
    fn reference_attaches_by_key() {
        let a = CachingAllocator::new(SimDevice::new(1 << 30), AllocatorConfig::default());
        let mut cs = vec![bench_single(&mut &a, 512, &BenchOptions::tiny()).unwrap()];
        attach_pytorch_reference(&mut cs, |k| (k == "cpp_pair_ns_512").then_some(626.8));
        assert_eq!(cs[0].pytorch_ns, Some(626.8));
        assert!(cs[0].speedup_vs_pytorch.unwrap() > 0.0);
        assert!(format_table(&cs, Some(&cs)).contains("single_512B"));
    }

    #[test]
    fn synthetic_trace_is_consistent() {
        let s = synthetic_trace(50_000, SEED);
        let t = &s.device_traces[0];
        assert_eq!(t.len(), 50_000);
        let mut live = std::collections::HashSet::new();
        let mut requested = std::collections::HashSet::new();
        for e in t {
            match e.action {
                TraceAction::Alloc => assert!(live.insert(e.addr)),
                TraceAction::FreeRequested => {
                    assert!(live.remove(&e.addr));
                    requested.insert(e.addr);
                }
                TraceAction::FreeCompleted => assert!(requested.remove(&e.addr)),
                _ => unreachable!(),
            }
        }
        assert_eq!(synthetic_trace(1000, SEED), synthetic_trace(1000, SEED));
    }
}
