//! Memory history: `_record_memory_history` and the data behind `_snapshot()`.
//!
//! Design note: the history is an observer of allocator events. It keeps a ring buffer of
//! trace entries (append until full, then overwrite the oldest; read oldest first), exactly
//! as PyTorch's per-device buffer does, so a snapshot of a long run holds its last
//! `max_entries` events.

use std::collections::VecDeque;

use crate::event::AllocEvent;
use crate::snapshot::{Stack, TraceAction, TraceEntry};

/// The `enabled` argument of `_record_memory_history`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HistoryMode {
    /// `None`: record nothing and clear the buffer.
    #[default]
    Off,
    /// `"state"`: keep stacks of live blocks only (ring buffer of 1).
    State,
    /// `"all"`: also keep the event history.
    All,
}

#[derive(Default)]
pub struct History {
    mode: HistoryMode,
    capacity: usize,
    buf: VecDeque<TraceEntry>,
}

impl History {
    pub fn configure(&mut self, mode: HistoryMode, max_entries: usize) {
        self.mode = mode;
        match mode {
            HistoryMode::Off => {
                self.buf.clear();
                self.capacity = 0;
            }
            HistoryMode::State => self.capacity = 1,
            HistoryMode::All => self.capacity = max_entries.max(1),
        }
        while self.buf.len() > self.capacity {
            self.buf.pop_front();
        }
    }

    pub fn mode(&self) -> HistoryMode {
        self.mode
    }

    #[inline]
    pub fn enabled(&self) -> bool {
        self.mode != HistoryMode::Off
    }

    pub fn record(&mut self, ev: &AllocEvent, time_us: i64, ctx: Option<&Stack>) {
        let Some(entry) = entry_for(ev, time_us, ctx) else {
            return;
        };
        if self.buf.len() == self.capacity {
            self.buf.pop_front();
        }
        self.buf.push_back(entry);
    }

    /// Oldest first.
    pub fn entries(&self) -> Vec<TraceEntry> {
        self.buf.iter().cloned().collect()
    }

    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

fn entry_for(ev: &AllocEvent, time_us: i64, ctx: Option<&Stack>) -> Option<TraceEntry> {
    let (action, addr, size, stream) = match *ev {
        AllocEvent::Alloc {
            ptr,
            requested,
            stream,
            ..
        } => (TraceAction::Alloc, ptr, requested, stream),
        AllocEvent::FreeRequested {
            ptr,
            requested,
            stream,
            ..
        } => (TraceAction::FreeRequested, ptr, requested, stream),
        AllocEvent::FreeCompleted {
            ptr,
            requested,
            stream,
            ..
        } => (TraceAction::FreeCompleted, ptr, requested, stream),
        AllocEvent::SegmentAlloc {
            ptr, size, stream, ..
        } => (TraceAction::SegmentAlloc, ptr, size, stream),
        AllocEvent::SegmentFree {
            ptr, size, stream, ..
        } => (TraceAction::SegmentFree, ptr, size, stream),
        AllocEvent::SegmentMap {
            ptr, size, stream, ..
        } => (TraceAction::SegmentMap, ptr, size, stream),
        AllocEvent::SegmentUnmap {
            ptr, size, stream, ..
        } => (TraceAction::SegmentUnmap, ptr, size, stream),
        AllocEvent::Oom {
            size,
            device_free,
            stream,
        } => (TraceAction::Oom, device_free, size, stream),
        AllocEvent::Snapshot { active_bytes } => (TraceAction::Snapshot, 0, active_bytes, 0),
        AllocEvent::InactiveSplit { .. } | AllocEvent::AllocRetry | AllocEvent::SyncAllStreams => {
            return None
        }
    };
    Some(TraceEntry {
        action,
        addr,
        size,
        stream,
        time_us,
        compile_context: "N/A".into(),
        user_metadata: "".into(),
        // shared with the block, as PyTorch shares the context object
        frames: ctx.cloned(),
    })
}
