//! # vramroom-trace
//!
//! Memory traces in and out of [`vramroom_alloc`]'s data model, for replay and what-if
//! analysis.
//!
//! * [`pickle`]: PyTorch snapshot pickles (`torch.cuda.memory._dump_snapshot()`, or the
//!   segment list of `torch.cuda.memory_snapshot()`) read into a [`Snapshot`], and written
//!   back in a form that Python and the `pytorch.org/memory_viz` viewer both load.
//! * [`rmm`]: RAPIDS RMM `logging_resource_adaptor` CSV logs ([`RmmEvent`]), and
//!   conversions to and from snapshot traces.
//! * [`error`]: [`TraceError`], the one error type.
//!
//! Main types: [`Snapshot`] (with `SegmentInfo`, `BlockInfo`, `TraceEntry`, re-exported
//! from `vramroom_alloc`), [`RmmEvent`], [`TraceError`].
//!
//! ```
//! use vramroom_trace::{read_snapshot, rmm_from_snapshot, write_rmm_csv, write_snapshot};
//! use vramroom_trace::Snapshot;
//!
//! let bytes = write_snapshot(&Snapshot::default());
//! let snap = read_snapshot(&bytes)?;
//! assert!(snap.segments.is_empty());
//! let csv = write_rmm_csv(&rmm_from_snapshot(&snap));
//! assert_eq!(csv, "Thread,Time,Action,Pointer,Size,Stream\n");
//! # Ok::<(), vramroom_trace::TraceError>(())
//! ```

pub mod concurrency;
pub mod diff;
pub mod error;
pub mod pickle;
pub mod ranks;
pub mod recommend;
pub mod replay;
pub mod rmm;

pub use error::TraceError;
pub use pickle::{read_snapshot, read_snapshot_file, write_snapshot, write_snapshot_file};
pub use replay::{
    min_capacity, min_capacity_plan, own_config, recorded_segment_sizes, replay, replay_plan,
    traced_devices, ReplayError, ReplayOptions, ReplayPlan, ReplayResult,
};
pub use rmm::{
    read_rmm_csv, rmm_from_snapshot, snapshot_from_rmm, write_rmm_csv, RmmAction, RmmEvent,
};
pub use vramroom_alloc::snapshot::{
    AllocatorSettings, Annotation, BlockInfo, BlockState, Frame, SegmentInfo, Snapshot, Stack,
    TraceAction, TraceEntry,
};
