//! The data model of `torch.cuda.memory._snapshot()`, PyTorch 2.11's schema.
//!
//! These are plain data. `vramroom-trace` reads and writes them as pickles; the allocator
//! produces them from its live state and its history ring buffer.
//!
//! Design note: stacks are shared, not copied. PyTorch records a stack per allocation, and
//! a long recording repeats the same few dozen stacks tens of thousands of times (a real
//! 8.6 MB snapshot holds 1.7 million frame references but 73 distinct stacks). A [`Stack`]
//! is therefore a reference-counted slice of reference-counted [`Frame`]s: cloning one is a
//! counter increment, and the pickle reader and writer keep one copy of each stack, so a
//! snapshot in memory is about as large as its distinct content, not its expansion. The
//! strings repeated on every trace entry (`compile_context`, `user_metadata`) are shared
//! `Arc<str>` for the same reason. Equality is by value throughout; sharing is only a
//! matter of memory.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// One stack frame: `{"name", "filename", "line"}`.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    pub name: String,
    pub filename: String,
    /// PyTorch stores it as an unsigned 64-bit integer: frames of code that
    /// `torch.compile` generated carry 2^64 - 1 (C++'s -1) for "no line".
    pub line: u64,
}

/// A call stack, innermost frame first, as PyTorch stores it in `frames`.
///
/// Shared by reference: clones are cheap and equal stacks may be one allocation (see the
/// module docs). The empty stack allocates nothing.
#[derive(Clone, Default)]
pub struct Stack(Option<Arc<[Arc<Frame>]>>);

impl Stack {
    /// The empty stack.
    pub const fn empty() -> Self {
        Stack(None)
    }

    /// Whether `self` and `other` are the same allocation (both empty counts as the same).
    /// Equal stacks need not be the same allocation; see [`PartialEq`] for equality.
    pub fn ptr_eq(&self, other: &Stack) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }

    /// An identity for this allocation while it lives (0 for the empty stack), for writers
    /// that emit each shared stack once.
    pub fn addr(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |a| a.as_ptr() as *const () as usize)
    }
}

impl Deref for Stack {
    type Target = [Arc<Frame>];
    fn deref(&self) -> &[Arc<Frame>] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl From<Vec<Arc<Frame>>> for Stack {
    fn from(frames: Vec<Arc<Frame>>) -> Self {
        if frames.is_empty() {
            Stack(None)
        } else {
            Stack(Some(frames.into()))
        }
    }
}

impl From<Vec<Frame>> for Stack {
    fn from(frames: Vec<Frame>) -> Self {
        frames.into_iter().map(Arc::new).collect::<Vec<_>>().into()
    }
}

impl From<&[Frame]> for Stack {
    fn from(frames: &[Frame]) -> Self {
        frames
            .iter()
            .cloned()
            .map(Arc::new)
            .collect::<Vec<_>>()
            .into()
    }
}

impl FromIterator<Arc<Frame>> for Stack {
    fn from_iter<I: IntoIterator<Item = Arc<Frame>>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<_>>().into()
    }
}

impl PartialEq for Stack {
    fn eq(&self, other: &Stack) -> bool {
        self.ptr_eq(other) || **self == **other
    }
}

impl Eq for Stack {}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(|fr| &**fr)).finish()
    }
}

/// A list of frames, as in the pickle.
impl serde::Serialize for Stack {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(|fr| &**fr))
    }
}

impl<'de> serde::Deserialize<'de> for Stack {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<Frame>::deserialize(d).map(Stack::from)
    }
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
    pub frames: Stack,
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
    pub frames: Stack,
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
    /// `"N/A"` unless recorded under `torch.compile`; shared, as most entries repeat it.
    pub compile_context: Arc<str>,
    pub user_metadata: Arc<str>,
    /// Present only when a stack was stored for the entry.
    pub frames: Option<Stack>,
}

impl TraceEntry {
    /// An entry of the default stream at time 0, with no stack and no metadata (what a
    /// test or a synthetic trace starts from; set the other fields by struct update).
    pub fn new(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry {
            action,
            addr,
            size,
            stream: 0,
            time_us: 0,
            compile_context: "N/A".into(),
            user_metadata: "".into(),
            frames: None,
        }
    }
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
