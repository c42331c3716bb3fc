//! The run log: every allocator request of a load test (alloc, free, OOM), 16 bytes each,
//! from the empty allocator on, kept beside the history ring for the what-if.
//!
//! Design note: the history ring (`LoadConfig::history_entries`) keeps the last events with
//! their stacks, for the snapshot; a run longer than the ring (a 2 s default run makes
//! about 400,000 entries) leaves a trace that starts from a warm state, which a replay can
//! only rebuild approximately, and the OOMs before its start are lost: every config then
//! showed the same peak and the own-config row disagreed with the run. The log keeps only
//! what the client asked for, so a replay of it on a fresh allocator under the run's own
//! config and capacity re-makes the run's allocator exactly: the same requests in the same
//! order get the same answers (on meta the simulated device even hands out the same
//! addresses). Its memory is bounded (`LoadConfig::what_if_log_entries`); past the bound it
//! stops and says so, and the what-if falls back to the ring, with a note.
//!
//! A free is replayed as completed at once: the load test's workloads never hold a block
//! on another stream (`record_stream`), so the free's completion follows its request.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use vramroom_alloc::{
    AllocError, AllocEvent, AllocatorConfig, CachingAllocator, Observer, SimDevice,
};

const ADDR_BITS: u32 = 48;
const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;
const STREAM_SHIFT: u32 = ADDR_BITS;
const KIND_SHIFT: u32 = 60;
const CHUNK: usize = 1 << 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Alloc = 0,
    Free = 1,
    Oom = 2,
}

/// `addr | stream index << 48 | kind << 60`, and the size.
#[derive(Clone, Copy)]
struct Entry(u64, u64);

#[derive(Default)]
struct Inner {
    /// Fixed-size chunks: growing one vector would copy it and double its memory at times.
    chunks: Vec<Vec<Entry>>,
    len: usize,
    max: usize,
    /// Why the log stopped, if it did.
    stopped: Option<String>,
    /// Requests seen after it stopped.
    missed: u64,
    /// The streams seen, by index (a CUDA stream is a raw pointer: it does not fit 12 bits).
    streams: Vec<u64>,
}

impl Inner {
    fn push(&mut self, kind: Kind, addr: u64, size: u64, stream: u64) {
        if self.stopped.is_some() {
            self.missed += 1;
            return;
        }
        if self.len >= self.max {
            self.stopped = Some(format!(
                "the run made more than the {} allocator requests the what-if log keeps",
                self.max
            ));
            self.missed += 1;
            return;
        }
        let idx = match self.streams.iter().position(|&s| s == stream) {
            Some(i) => i as u64,
            None => {
                self.streams.push(stream);
                self.streams.len() as u64 - 1
            }
        };
        if addr > ADDR_MASK || idx >= 1 << (KIND_SHIFT - STREAM_SHIFT) {
            self.stopped = Some(format!(
                "an address ({addr:#x}) or a stream count beyond what the compact log holds"
            ));
            self.missed += 1;
            return;
        }
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(c) = self.chunks.last_mut() {
            c.push(Entry(
                addr | idx << STREAM_SHIFT | (kind as u64) << KIND_SHIFT,
                size,
            ));
            self.len += 1;
        }
    }
}

/// The log; [`RunLog::observer`] is what the allocator feeds.
#[derive(Clone)]
pub struct RunLog(Arc<Mutex<Inner>>);

struct LogObserver(Arc<Mutex<Inner>>);

impl Observer for LogObserver {
    fn on_event(&mut self, ev: &AllocEvent) {
        let (kind, addr, size, stream) = match *ev {
            AllocEvent::Alloc {
                ptr,
                requested,
                stream,
                ..
            } => (Kind::Alloc, ptr, requested, stream),
            AllocEvent::FreeRequested { ptr, stream, .. } => (Kind::Free, ptr, 0, stream),
            AllocEvent::Oom { size, stream, .. } => (Kind::Oom, 0, size, stream),
            _ => return,
        };
        self.0.lock().push(kind, addr, size, stream);
    }
}

/// What one replay of the log measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogReplay {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
}

impl RunLog {
    /// A log that keeps at most `max_entries` requests (16 bytes each).
    pub fn new(max_entries: usize) -> RunLog {
        RunLog(Arc::new(Mutex::new(Inner {
            max: max_entries,
            ..Default::default()
        })))
    }

    /// The observer to add to the run's allocator before anything is allocated.
    pub fn observer(&self) -> Box<dyn Observer> {
        Box::new(LogObserver(self.0.clone()))
    }

    /// Requests logged.
    pub fn len(&self) -> usize {
        self.0.lock().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Why the log is incomplete (and how many requests it missed), if it is.
    pub fn incomplete(&self) -> Option<(String, u64)> {
        let g = self.0.lock();
        g.stopped.clone().map(|s| (s, g.missed))
    }

    /// Frees the log's memory (after the what-if).
    pub fn clear(&self) {
        let mut g = self.0.lock();
        g.chunks = Vec::new();
        g.len = 0;
    }

    /// Replays the log on a fresh allocator of `capacity` bytes under `config`: the failed
    /// requests of the run are asked again (and given back at once when they now fit), a
    /// request that fails here is skipped and so is its free, as the client did.
    pub fn replay(&self, config: &AllocatorConfig, capacity: u64) -> Result<LogReplay, String> {
        let g = self.0.lock();
        let alloc = CachingAllocator::new(SimDevice::new(capacity), config.clone());
        let mut live: HashMap<u64, u64> = HashMap::new();
        for e in g.chunks.iter().flatten() {
            let addr = e.0 & ADDR_MASK;
            let idx = (e.0 >> STREAM_SHIFT) & ((1 << (KIND_SHIFT - STREAM_SHIFT)) - 1);
            let stream = g.streams.get(idx as usize).copied().unwrap_or(0);
            let kind = match e.0 >> KIND_SHIFT {
                0 => Kind::Alloc,
                1 => Kind::Free,
                _ => Kind::Oom,
            };
            match kind {
                Kind::Alloc => match alloc.malloc(e.1, stream) {
                    Ok(a) => {
                        live.insert(addr, a.ptr);
                    }
                    Err(AllocError::OutOfMemory(_)) => {}
                    Err(x) => return Err(x.to_string()),
                },
                Kind::Free => {
                    if let Some(p) = live.remove(&addr) {
                        alloc.free(p).map_err(|x| x.to_string())?;
                    }
                }
                Kind::Oom => match alloc.malloc(e.1, stream) {
                    Ok(a) => alloc.free(a.ptr).map_err(|x| x.to_string())?,
                    Err(AllocError::OutOfMemory(_)) => {}
                    Err(x) => return Err(x.to_string()),
                },
            }
        }
        let st = alloc.stats();
        Ok(LogReplay {
            peak_allocated_bytes: st.allocated_bytes.all().peak.max(0) as u64,
            peak_reserved_bytes: st.reserved_bytes.all().peak.max(0) as u64,
            num_alloc_retries: st.num_alloc_retries,
            num_ooms: st.num_ooms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A client of variable sizes that runs out now and then on 64 MiB, logged.
    fn logged(max: usize) -> (RunLog, CachingAllocator<SimDevice>) {
        let alloc = CachingAllocator::new(SimDevice::new(64 * MIB), AllocatorConfig::default());
        let log = RunLog::new(max);
        alloc.add_observer(log.observer());
        let mut live: Vec<u64> = Vec::new();
        let mut x = 7u64;
        for i in 0..2_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let size = (x >> 40) % (6 * MIB) + 512;
            if let Ok(a) = alloc.malloc(size, if i.is_multiple_of(7) { 0x7f00_dead } else { 0 }) {
                live.push(a.ptr);
            }
            if live.len() > 12 || (x >> 20).is_multiple_of(3) {
                let k = ((x >> 8) as usize) % live.len().max(1);
                if k < live.len() {
                    alloc.free(live.swap_remove(k)).unwrap();
                }
            }
        }
        (log, alloc)
    }

    #[test]
    fn replay_under_the_run_config_remakes_the_run() {
        let (log, alloc) = logged(1 << 20);
        assert!(log.incomplete().is_none());
        let st = alloc.stats();
        assert!(st.num_ooms > 0, "the client never ran out");
        let r = log.replay(&AllocatorConfig::default(), 64 * MIB).unwrap();
        assert_eq!(r.num_ooms, st.num_ooms);
        assert_eq!(
            r.peak_reserved_bytes,
            st.reserved_bytes.all().peak.max(0) as u64
        );
        assert_eq!(
            r.peak_allocated_bytes,
            st.allocated_bytes.all().peak.max(0) as u64
        );
        // More room: fewer OOMs.
        let big = log.replay(&AllocatorConfig::default(), 256 * MIB).unwrap();
        assert!(big.num_ooms < r.num_ooms);
    }

    #[test]
    fn a_full_log_says_so() {
        let (log, _) = logged(100);
        assert_eq!(log.len(), 100);
        let (why, missed) = log.incomplete().unwrap();
        assert!(why.contains("100"), "{why}");
        assert!(missed > 0);
    }
}
