//! # vramroom-alloc
//!
//! PyTorch 2.11's CUDA caching allocator, re-stated as a deterministic state machine over a
//! [`Device`] trait: block rounding, small and large pools, best fit by (stream, size,
//! address), both split rules, merging, pending frees with stream uses, the OOM fallback
//! chain, garbage collection, expandable segments and `empty_cache`.
//!
//! The policy does no I/O and reads no clock except through its device. Statistics
//! ([`DeviceStats`]), the history ring buffer and any user [`Observer`] are fed from one
//! stream of [`AllocEvent`]s.
//!
//! Main types: [`CachingAllocator`], [`AllocatorConfig`], [`SimDevice`], [`HostDevice`],
//! [`DeviceStats`], [`Snapshot`], [`OutOfMemoryError`].
//!
//! ```
//! use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};
//! let alloc = CachingAllocator::new(SimDevice::new(80 << 30), AllocatorConfig::default());
//! let a = alloc.malloc(1000, 0).unwrap();
//! assert_eq!(alloc.memory_allocated(), 1024);
//! assert_eq!(alloc.memory_reserved(), 2 << 20);
//! alloc.free(a.ptr).unwrap();
//! alloc.empty_cache();
//! assert_eq!(alloc.memory_reserved(), 0);
//! ```

pub mod allocator;
pub mod bench;
mod block;
pub mod config;
pub mod device;
mod driver_va;
pub mod event;
mod expandable;
pub mod history;
mod import;
pub mod input;
mod invariants;
mod lock;
pub mod oom;
/// Writing output files: atomic for regular files, never replacing devices, FIFOs or links.
pub mod output;
pub mod policy;
mod pool;
pub mod private;
mod ptrmap;
mod release;
pub mod rng;
pub mod size;
pub mod snapshot;
pub mod stats;
pub mod summary;
/// The one plain-text table printer.
pub mod table;

pub use allocator::CachingAllocator;
pub use config::{AllocatorConfig, Backend, ConfigError, ConfigScope};
pub use device::{Device, DeviceError, EventId, HostDevice, SimDevice};
pub use event::{AllocEvent, PoolKind, StreamId};
pub use history::HistoryMode;
pub use import::{ImportSegment, LiveBlock};
pub use oom::{AllocError, OutOfMemoryError};
pub use policy::{Allocation, Observer};
pub use private::{MempoolId, DEFAULT_POOL};
pub use size::{format_size, human_bytes, parse_size, SizeError};
pub use snapshot::{
    AllocatorSettings, Annotation, BlockInfo, BlockState, Frame, SegmentInfo, Snapshot, Stack,
    TraceAction, TraceEntry,
};
pub use stats::{DeviceStats, Stat, StatArray, StatType};
pub use summary::memory_summary;
