//! The data model of `torch.cuda.memory._snapshot()`, PyTorch 2.11's schema.
//!
//! These are plain data. `headroom-trace` reads and writes them as pickles; the allocator
//! produces them from its live state and its history ring buffer.

use std::collections::BTreeMap;

/// One stack frame: `{"name", "filename", "line"}`.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    pub name: String,
    pub filename: String,
    pub line: i64,
}

/// A block's `state` string.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

impl BlockState {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active_allocated" => BlockState::ActiveAllocated,
            // the _snapshot docstring's name for it; accept both
            "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BlockInfo {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    pub frames: Vec<Frame>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SegmentInfo {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    /// `"large"` or `"small"`.
    pub segment_type: String,
    pub segment_pool_id: (i64, i64),
    pub is_expandable: bool,
    pub frames: Vec<Frame>,
    pub blocks: Vec<BlockInfo>,
}

/// A trace entry's `action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum TraceAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
}

impl TraceAction {
    pub const ALL: [TraceAction; 9] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        TraceAction::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// One entry of `device_traces`. For `oom`, PyTorch stores the driver's free bytes under the
/// key `device_free` instead of `addr`; here that value lives in `addr` and the writer
/// restores the key.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TraceEntry {
    pub action: TraceAction,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: i64,
    pub compile_context: String,
    pub user_metadata: String,
    /// Present only when a stack was stored for the entry.
    pub frames: Option<Vec<Frame>>,
}

/// `allocator_settings` of a snapshot.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AllocatorSettings {
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub pytorch_cuda_alloc_conf: String,
    pub max_split_size: i64,
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    pub pinned_num_register_threads: i64,
    pub release_lock_on_cudamalloc: bool,
    pub pinned_use_cuda_host_register: bool,
    pub graph_capture_record_stream_reuse: bool,
    /// `"1"`, `"2"`, … `"32768"` → divisions.
    pub roundup_power2_divisions: BTreeMap<String, i64>,
}

impl Default for AllocatorSettings {
    fn default() -> Self {
        AllocatorSettings {
            pytorch_cuda_alloc_conf: String::new(),
            max_split_size: -1,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            pinned_num_register_threads: 1,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            graph_capture_record_stream_reuse: false,
            roundup_power2_divisions: (0..16).map(|i| ((1u64 << i).to_string(), 0)).collect(),
        }
    }
}

/// An `external_annotations` entry (`record_function` scopes).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Annotation {
    pub stage: String,
    pub name: String,
    pub device: i64,
    pub time_us: i64,
}

/// The whole `_snapshot()` dict.
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub segments: Vec<SegmentInfo>,
    /// One list per device, oldest first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    pub allocator_settings: AllocatorSettings,
    pub external_annotations: Vec<Annotation>,
}
