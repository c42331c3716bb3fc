//! The events the allocator policy emits. Stats, history and user observers consume them.

/// Which of a device's two default pools a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum PoolKind {
    Small = 0,
    Large = 1,
}

impl PoolKind {
    pub fn stat_type(self) -> crate::stats::StatType {
        match self {
            PoolKind::Small => crate::stats::StatType::SmallPool,
            PoolKind::Large => crate::stats::StatType::LargePool,
        }
    }
    pub fn is_small(self) -> bool {
        matches!(self, PoolKind::Small)
    }
    /// The snapshot's `segment_type` string.
    pub fn segment_type(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// A CUDA stream as PyTorch records it: the raw `cudaStream_t` as an integer, 0 = default.
pub type StreamId = u64;

/// One state change of the allocator, in the order PyTorch's allocator makes them.
/// Sizes are bytes. `ptr` is a device address.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AllocEvent {
    /// A block was handed to a client. `block_size` may exceed the rounded request.
    Alloc {
        pool: PoolKind,
        ptr: u64,
        block_size: u64,
        requested: u64,
        stream: StreamId,
        oversize: bool,
    },
    /// The client freed the block (it may still be pending on other streams).
    FreeRequested {
        pool: PoolKind,
        ptr: u64,
        block_size: u64,
        requested: u64,
        stream: StreamId,
        oversize: bool,
    },
    /// The free completed: the block is back in the cache.
    FreeCompleted {
        pool: PoolKind,
        ptr: u64,
        block_size: u64,
        requested: u64,
        stream: StreamId,
    },
    /// Net change of the free-blocks-of-split-segments counters.
    InactiveSplit {
        pool: PoolKind,
        blocks: i64,
        bytes: i64,
    },
    SegmentAlloc {
        pool: PoolKind,
        ptr: u64,
        size: u64,
        stream: StreamId,
        oversize: bool,
    },
    SegmentFree {
        pool: PoolKind,
        ptr: u64,
        size: u64,
        stream: StreamId,
        oversize: bool,
    },
    SegmentMap {
        pool: PoolKind,
        ptr: u64,
        size: u64,
        stream: StreamId,
    },
    SegmentUnmap {
        pool: PoolKind,
        ptr: u64,
        size: u64,
        stream: StreamId,
    },
    /// The last-resort retry after flushing the cache began.
    AllocRetry,
    /// All outstanding stream events were waited for.
    SyncAllStreams,
    /// The allocator raised OOM for a request of rounded size `size`.
    Oom {
        size: u64,
        device_free: u64,
        stream: StreamId,
    },
    /// A snapshot was taken; `active_bytes` is the device's total active size.
    Snapshot { active_bytes: u64 },
}

impl AllocEvent {
    /// The event with its stream mapped through `f` (private pools file blocks under
    /// virtual streams; listeners see the real one).
    pub fn map_stream(mut self, f: impl FnOnce(StreamId) -> StreamId) -> Self {
        match &mut self {
            AllocEvent::Alloc { stream, .. }
            | AllocEvent::FreeRequested { stream, .. }
            | AllocEvent::FreeCompleted { stream, .. }
            | AllocEvent::SegmentAlloc { stream, .. }
            | AllocEvent::SegmentFree { stream, .. }
            | AllocEvent::SegmentMap { stream, .. }
            | AllocEvent::SegmentUnmap { stream, .. }
            | AllocEvent::Oom { stream, .. } => *stream = f(*stream),
            AllocEvent::InactiveSplit { .. }
            | AllocEvent::AllocRetry
            | AllocEvent::SyncAllStreams
            | AllocEvent::Snapshot { .. } => {}
        }
        self
    }
}
