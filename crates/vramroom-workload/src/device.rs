//! Devices a run can use: cpu (real compute), meta (no data), and a hook for others (CUDA).
//!
//! Design note: the runtime's [`Device`] talks to its allocator through
//! `StorageAllocator`, which hides the caching allocator's richer API. A load run needs that
//! API too — `DeviceStats`, the snapshot, observers, `mem_get_info` — so every device comes
//! as a [`RunDevice`]: the runtime device plus an [`AllocatorProbe`] on the same allocator.
//! A CUDA backend plugs in through [`DeviceProvider`] and then takes exactly the code path
//! cpu and meta take.
//!
//! On meta, ops cost nothing, so N worker threads on two cores would run their requests
//! one after another instead of overlapping, and concurrency would look free. The meta
//! device therefore runs its workers under a [`VirtualClock`] ([`Interleave::Virtual`]):
//! one worker at a time holds the baton; each allocation of `n` bytes costs the worker
//! `n + OP_COST` units of virtual time (the time to fill its output — the proxy for an
//! op's compute that real kernels roughly follow), and the baton goes to the worker
//! furthest behind. Requests in flight therefore hold their memory for as long, relative to
//! each other, as they would under real compute, and the interleaving is deterministic.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use vramroom_alloc::{
    AllocatorConfig, CachingAllocator, DeviceStats, HistoryMode, HostDevice, Observer, SimDevice,
    Snapshot,
};
use vramroom_tensor::{Allocation, Device, StorageAllocator};

use crate::error::{Result, WorkloadError};

/// The default capacity of `vramroom loadtest` and `vramroom serve` on cpu and meta: a small simulated card, so the default
/// scenario comes close to it on a laptop in seconds.
pub const DEFAULT_CAPACITY: u64 = 128 << 20;

/// The caching allocator's API as a load run needs it, for any device type.
pub trait AllocatorProbe: Send + Sync {
    fn stats(&self) -> DeviceStats;
    fn memory_stats(&self) -> BTreeMap<String, i64>;
    fn memory_summary(&self) -> String;
    fn snapshot(&self) -> Snapshot;
    fn add_observer(&self, o: Box<dyn Observer>) -> usize;
    fn remove_observer(&self, id: usize);
    fn record_memory_history(&self, mode: HistoryMode, max_entries: usize);
    /// `(free, total)` per the device.
    fn mem_get_info(&self) -> (u64, u64);
    fn reset_peak_memory_stats(&self);
    fn empty_cache(&self);
}

impl<D> AllocatorProbe for CachingAllocator<D>
where
    D: vramroom_alloc::Device + 'static,
    CachingAllocator<D>: Send + Sync,
{
    fn stats(&self) -> DeviceStats {
        CachingAllocator::stats(self)
    }
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        CachingAllocator::memory_stats(self)
    }
    fn memory_summary(&self) -> String {
        CachingAllocator::memory_summary(self, false)
    }
    fn snapshot(&self) -> Snapshot {
        CachingAllocator::snapshot(self)
    }
    fn add_observer(&self, o: Box<dyn Observer>) -> usize {
        CachingAllocator::add_observer(self, o)
    }
    fn remove_observer(&self, id: usize) {
        let _ = CachingAllocator::remove_observer(self, id);
    }
    fn record_memory_history(&self, mode: HistoryMode, max_entries: usize) {
        CachingAllocator::record_memory_history(self, mode, max_entries)
    }
    fn mem_get_info(&self) -> (u64, u64) {
        CachingAllocator::mem_get_info(self)
    }
    fn reset_peak_memory_stats(&self) {
        CachingAllocator::reset_peak_memory_stats(self)
    }
    fn empty_cache(&self) {
        CachingAllocator::empty_cache(self)
    }
}

/// A device for a run: the runtime device and a probe on its allocator.
#[derive(Clone)]
pub struct RunDevice {
    pub device: Device,
    pub probe: Arc<dyn AllocatorProbe>,
    /// `"cpu"`, `"meta"`, `"cuda:0"`.
    pub name: String,
    /// The device reports real driver usage (`mem_get_info`) worth plotting apart from
    /// reserved (false for simulated devices, where it equals reserved).
    pub has_device_usage: bool,
    /// Meta under [`Interleave::Virtual`]: the clock its workers must enter.
    pub clock: Option<Arc<VirtualClock>>,
}

/// Supplies devices of a kind the engine does not know (the CUDA backend).
pub trait DeviceProvider: Send + Sync {
    /// `"cuda:0"`.
    fn name(&self) -> String;
    /// A fresh device with its own caching allocator under `config`, limited to `capacity`
    /// bytes (e.g. with `set_per_process_memory_fraction`).
    fn create(&self, capacity: u64, config: &AllocatorConfig) -> Result<RunDevice>;
}

/// How meta workers interleave (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interleave {
    /// Deterministic virtual time, weighted by bytes allocated.
    Virtual,
    /// Free-running threads.
    None,
}

/// Virtual-time cost of one allocation beyond its bytes: the fixed cost of an op.
pub const OP_COST: f64 = 16384.0;

/// Most workers a virtual clock schedules.
pub const MAX_WORKERS: usize = 4096;

/// How long a worker waits for its turn before going ahead anyway. Only a worker that
/// holds the baton and blocks on something else (never expected) makes this matter; it
/// turns a would-be deadlock into a slightly less exact interleaving. Long enough that a
/// loaded machine (CI running many tests on two cores) never trips it in a normal run,
/// which would make meta runs nondeterministic.
const TURN_TIMEOUT: Duration = Duration::from_millis(1000);

struct VState {
    vtime: Vec<f64>,
    active: Vec<bool>,
    /// The worker has run at least one request under this clock.
    seen: Vec<bool>,
    /// Virtual time at which the worker's current request began.
    began: Vec<f64>,
    /// The worker finished a request of a closed loop ([`VirtualClock::enter_closed`]) and
    /// will send its next one at once: it keeps its place in virtual time, and nobody runs
    /// past it until it is back or [`VirtualClock::rest`]s.
    returning: Vec<bool>,
    /// Virtual time when the last gate was set: the start of the workers it gathers.
    epoch: f64,
    baton: Option<usize>,
    /// Running mean of a request's virtual duration.
    request_vtime: f64,
    /// While set, nobody runs until this many workers have entered (or the deadline).
    gate: Option<(usize, Instant)>,
}

impl VState {
    fn next(&self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, &a) in self.active.iter().enumerate() {
            if (a || self.returning[i]) && best.is_none_or(|b| self.vtime[i] < self.vtime[b]) {
                best = Some(i);
            }
        }
        best
    }
    fn active_count(&self) -> usize {
        self.active.iter().filter(|&&a| a).count()
    }
}

/// How long a gate waits for its workers (a `-n` run may have fewer requests than workers).
const GATE_TIMEOUT: Duration = Duration::from_millis(1000);

/// A baton passed between worker threads in virtual-time order.
pub struct VirtualClock {
    st: Mutex<VState>,
    cvs: Vec<Condvar>,
}

thread_local! {
    /// The worker index of this thread, while it runs requests under a clock.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
    /// Virtual time owed by this worker's last allocation, paid at its next one.
    static PENDING: Cell<f64> = const { Cell::new(0.0) };
}

impl VirtualClock {
    pub fn new() -> VirtualClock {
        VirtualClock {
            st: Mutex::new(VState {
                vtime: vec![0.0; MAX_WORKERS],
                active: vec![false; MAX_WORKERS],
                seen: vec![false; MAX_WORKERS],
                began: vec![0.0; MAX_WORKERS],
                returning: vec![false; MAX_WORKERS],
                epoch: 0.0,
                baton: None,
                request_vtime: 0.0,
                gate: None,
            }),
            cvs: (0..MAX_WORKERS).map(|_| Condvar::new()).collect(),
        }
    }
    fn wait_turn(&self, st: &mut parking_lot::MutexGuard<'_, VState>, i: usize) {
        let started = Instant::now();
        loop {
            if let Some((n, deadline)) = st.gate {
                if st.active_count() >= n || Instant::now() >= deadline {
                    st.gate = None;
                    st.baton = None;
                    self.pass(st);
                } else {
                    self.cvs[i].wait_for(st, Duration::from_millis(10));
                    continue;
                }
            }
            match st.baton {
                None => {
                    st.baton = Some(i);
                    return;
                }
                Some(b) if b == i => return,
                Some(_) => {
                    if started.elapsed() >= TURN_TIMEOUT {
                        tracing::debug!(worker = i, "virtual clock: turn timed out");
                        return;
                    }
                    self.cvs[i].wait_for(st, TURN_TIMEOUT);
                }
            }
        }
    }
    fn pass(&self, st: &mut VState) {
        if st.gate.is_some() {
            // Nobody runs until the gate opens; the waiting workers poll it.
            st.baton = None;
            return;
        }
        st.baton = st.next();
        if let Some(n) = st.baton {
            self.cvs[n].notify_one();
        }
    }
    /// Holds every worker until `n` of them have entered: a stage's workers start together,
    /// in virtual-time order, whatever order their threads happened to be spawned in, so a
    /// meta run is deterministic.
    pub fn gate(&self, n: usize) {
        let mut st = self.st.lock();
        st.epoch = st
            .vtime
            .iter()
            .zip(&st.seen)
            .filter(|(_, &seen)| seen)
            .map(|(&v, _)| v)
            .fold(0.0, f64::max);
        st.gate = Some((n.clamp(1, MAX_WORKERS), Instant::now() + GATE_TIMEOUT));
        st.baton = None;
    }
    /// Worker `i` starts a request: it joins the schedule (at the current virtual time if
    /// it was idle) and waits for its turn. The guard leaves the schedule when dropped.
    ///
    /// A worker's *first* request starts a fraction of a mean request later than now, the
    /// fraction being `frac(i·φ)` (a low-discrepancy sequence): in a closed system at steady
    /// state the requests in flight are at spread-out phases, not in lockstep, and this
    /// spreads any number of workers evenly without knowing how many will come.
    pub fn enter(&self, i: usize) -> ClockTurn<'_> {
        let i = i.min(MAX_WORKERS - 1);
        let mut st = self.st.lock();
        let now = st.next().map(|n| st.vtime[n]).unwrap_or(0.0);
        if !st.seen[i] {
            st.seen[i] = true;
            let phase = (i as f64 * 0.618_033_988_749_894_9).fract();
            // Behind a gate the workers start from the gate's time, not from whoever
            // happened to enter first.
            let base = if st.gate.is_some() { st.epoch } else { now };
            st.vtime[i] = base + phase * st.request_vtime;
        } else if !st.active[i] {
            st.vtime[i] = st.vtime[i].max(now);
        }
        st.began[i] = st.vtime[i];
        st.active[i] = true;
        st.returning[i] = false;
        if st.gate.is_some() {
            // The waiting workers poll the gate; wake the one that may open it.
            for k in 0..MAX_WORKERS {
                if st.active[k] {
                    self.cvs[k].notify_one();
                }
            }
        }
        self.wait_turn(&mut st, i);
        WORKER.with(|w| w.set(Some(i)));
        ClockTurn {
            clock: self,
            i,
            closed: false,
        }
    }
    /// [`VirtualClock::enter`] for a worker of a closed loop (a load test's): when the turn
    /// ends, the worker keeps its place in virtual time until its next request enters, so
    /// the requests go to the workers in virtual-time order however long its thread takes
    /// between two requests in real time — what makes a meta load deterministic. A worker
    /// that stops sending requests must [`VirtualClock::rest`].
    pub fn enter_closed(&self, i: usize) -> ClockTurn<'_> {
        let mut t = self.enter(i);
        t.closed = true;
        t
    }
    /// Worker `i` sends no more requests for now (idle, or the load is over): it gives up
    /// the place [`VirtualClock::enter_closed`] kept.
    pub fn rest(&self, i: usize) {
        let i = i.min(MAX_WORKERS - 1);
        let mut st = self.st.lock();
        if !st.returning[i] {
            return;
        }
        st.returning[i] = false;
        if st.baton == Some(i) || st.baton.is_none() {
            self.pass(&mut st);
        }
    }
    /// Called at every allocator call of a worker, before it takes effect: the worker pays
    /// the time its last allocation's op took (that op ran while everything live *then* was
    /// still live, so the pay comes before this call's free or allocation), the
    /// furthest-behind worker runs, and `next_cost` is what the call leaves owing (the
    /// cost of this allocation's op; 0 for a free). Paying at the next call rather than
    /// right after the allocation lets the runtime tag the new block's category first, so
    /// the category breakdown at the peak equals the allocator's peak.
    fn step(&self, next_cost: f64) {
        let Some(i) = WORKER.with(|w| w.get()) else {
            return;
        };
        let owed = PENDING.with(|p| p.replace(next_cost));
        if owed == 0.0 {
            return;
        }
        let mut st = self.st.lock();
        st.vtime[i] += owed;
        self.pass(&mut st);
        self.wait_turn(&mut st, i);
    }
    fn leave(&self, i: usize, closed: bool) {
        WORKER.with(|w| w.set(None));
        let owed = PENDING.with(|p| p.replace(0.0));
        let mut st = self.st.lock();
        st.vtime[i] += owed;
        st.active[i] = false;
        st.returning[i] = closed;
        let d = st.vtime[i] - st.began[i];
        st.request_vtime = if st.request_vtime == 0.0 {
            d
        } else {
            0.8 * st.request_vtime + 0.2 * d
        };
        if st.baton == Some(i) || st.baton.is_none() {
            self.pass(&mut st);
        }
    }
}

impl Default for VirtualClock {
    fn default() -> Self {
        VirtualClock::new()
    }
}

/// Held while a worker runs one request under a [`VirtualClock`].
pub struct ClockTurn<'a> {
    clock: &'a VirtualClock,
    i: usize,
    closed: bool,
}

impl Drop for ClockTurn<'_> {
    fn drop(&mut self) {
        self.clock.leave(self.i, self.closed);
    }
}

/// Forwards to the caching allocator; under a clock, each allocation costs virtual time.
struct ClockedAllocator<D: vramroom_alloc::Device> {
    inner: Arc<CachingAllocator<D>>,
    clock: Arc<VirtualClock>,
}

impl<D> StorageAllocator for ClockedAllocator<D>
where
    D: vramroom_alloc::Device + 'static,
    CachingAllocator<D>: Send + Sync,
{
    fn allocate(&self, nbytes: u64) -> vramroom_tensor::Result<Allocation> {
        self.clock.step(nbytes as f64 + OP_COST);
        StorageAllocator::allocate(&*self.inner, nbytes)
    }
    fn free(&self, ptr: u64) {
        self.clock.step(0.0);
        StorageAllocator::free(&*self.inner, ptr)
    }
    fn memory_allocated(&self) -> u64 {
        self.inner.memory_allocated()
    }
    fn memory_reserved(&self) -> u64 {
        self.inner.memory_reserved()
    }
    fn max_memory_allocated(&self) -> u64 {
        self.inner.max_memory_allocated()
    }
    fn reset_peak_memory_stats(&self) {
        self.inner.reset_peak_memory_stats()
    }
    fn empty_cache(&self) {
        self.inner.empty_cache()
    }
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.inner.memory_stats()
    }
    fn memory_summary(&self, abbreviated: bool) -> String {
        self.inner.memory_summary(abbreviated)
    }
}

/// A real GPU (`--device cuda`, `cuda:N`): vramroom-tensor's CUDA runtime, its caching
/// allocator limited to the run's capacity the way `set_per_process_memory_fraction` limits
/// PyTorch's.
pub struct CudaProvider {
    pub ordinal: i32,
}

impl CudaProvider {
    /// `cuda` or `cuda:N`, when this machine has that GPU; otherwise why not.
    pub fn parse(s: &str) -> Result<CudaProvider> {
        let ordinal = match s.strip_prefix("cuda") {
            Some("") => 0,
            Some(rest) => rest
                .strip_prefix(':')
                .and_then(|n| n.parse::<i32>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    WorkloadError::Config(format!("unknown device {s:?} (expected cuda or cuda:N)"))
                })?,
            None => return Err(WorkloadError::Config(format!("unknown device {s:?}"))),
        };
        if let Some(why) = vramroom_cuda::unavailable_reason() {
            return Err(WorkloadError::DeviceUnavailable(s.into(), why));
        }
        let count = vramroom_cuda::device_count();
        if ordinal >= count {
            return Err(WorkloadError::DeviceUnavailable(
                s.into(),
                format!("this machine has {count} CUDA device(s)"),
            ));
        }
        Ok(CudaProvider { ordinal })
    }
    /// The PCI bus id NVML knows this GPU by.
    pub fn pci_bus_id(&self) -> Option<String> {
        vramroom_cuda::CudaDevice::new(self.ordinal)
            .ok()
            .map(|d| d.pci_bus_id().to_string())
    }
}

impl DeviceProvider for CudaProvider {
    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }
    fn create(&self, capacity: u64, config: &AllocatorConfig) -> Result<RunDevice> {
        let rt = Device::cuda(self.ordinal, config.clone())
            .map_err(|e| WorkloadError::DeviceUnavailable(self.name(), e.to_string()))?;
        let (_, total) = rt.allocator.mem_get_info();
        if capacity < total {
            rt.allocator
                .set_per_process_memory_fraction(capacity as f64 / total as f64)
                .map_err(|e| WorkloadError::Config(e.to_string()))?;
        }
        Ok(RunDevice {
            device: rt.device.clone(),
            probe: rt.allocator.clone(),
            name: self.name(),
            has_device_usage: true,
            clock: None,
        })
    }
}

impl RunDevice {
    /// The cpu device: real host memory (up to `capacity`) under PyTorch's caching policy.
    pub fn cpu(capacity: u64, config: &AllocatorConfig) -> RunDevice {
        let alloc = Arc::new(CachingAllocator::new(
            HostDevice::new(capacity),
            config.clone(),
        ));
        RunDevice {
            device: Device::cpu(alloc.clone()),
            probe: alloc,
            name: "cpu".into(),
            has_device_usage: false,
            clock: None,
        }
    }
    /// The meta device: a simulated GPU of `capacity` bytes.
    pub fn meta(capacity: u64, config: &AllocatorConfig, interleave: Interleave) -> RunDevice {
        let alloc = Arc::new(CachingAllocator::new(
            SimDevice::new(capacity),
            config.clone(),
        ));
        let (storage, clock): (Arc<dyn StorageAllocator>, _) = match interleave {
            Interleave::Virtual => {
                let clock = Arc::new(VirtualClock::new());
                (
                    Arc::new(ClockedAllocator {
                        inner: alloc.clone(),
                        clock: clock.clone(),
                    }),
                    Some(clock),
                )
            }
            Interleave::None => (alloc.clone(), None),
        };
        RunDevice {
            device: Device::meta(storage),
            probe: alloc,
            name: "meta".into(),
            has_device_usage: false,
            clock,
        }
    }
}

/// Which device runs the load.
#[derive(Clone)]
pub enum DeviceChoice {
    /// Real compute on host memory, limited to the capacity.
    Cpu,
    /// No data, same allocations: fast.
    Meta,
    /// A device from elsewhere (the CUDA backend).
    Custom(Arc<dyn DeviceProvider>),
}

impl std::fmt::Debug for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("Cpu"),
            DeviceChoice::Meta => f.write_str("Meta"),
            DeviceChoice::Custom(p) => write!(f, "Custom({})", p.name()),
        }
    }
}

impl std::str::FromStr for DeviceChoice {
    type Err = WorkloadError;
    /// `cpu`, `meta`, or `cuda`/`cuda:N` (a [`CudaProvider`]; on a machine
    /// without that GPU, [`WorkloadError::DeviceUnavailable`] saying why).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceChoice::Cpu),
            "meta" => Ok(DeviceChoice::Meta),
            d if d.starts_with("cuda") => {
                Ok(DeviceChoice::Custom(Arc::new(CudaProvider::parse(d)?)))
            }
            d => Err(WorkloadError::Config(format!(
                "unknown device {d:?} (expected cpu, meta or cuda)"
            ))),
        }
    }
}

/// Creates the run's device.
pub fn make_device(
    choice: &DeviceChoice,
    capacity: u64,
    config: &AllocatorConfig,
) -> Result<RunDevice> {
    match choice {
        DeviceChoice::Cpu => Ok(RunDevice::cpu(capacity, config)),
        DeviceChoice::Meta => Ok(RunDevice::meta(capacity, config, Interleave::Virtual)),
        DeviceChoice::Custom(p) => p.create(capacity, config),
    }
}
