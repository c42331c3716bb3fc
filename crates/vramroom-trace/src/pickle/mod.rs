//! PyTorch memory-snapshot pickles in and out.
//!
//! # Design
//!
//! A snapshot recorded the way users record them (with stacks) is mostly sharing: an
//! 8.6 MB file holds 25,581 trace entries whose `frames` lists make 1.7 million references
//! to 319 frame dicts, and equal lists are everywhere. Python's `pickle.load` keeps that
//! sharing (every reference is a pointer); a reader that copies shared parts per
//! reference builds gigabytes from megabytes, and a guard that measures that copy refuses
//! every real file. So sharing is kept end to end, one job per file:
//!
//! * `source.rs`: the input, streamed through one buffer, capped at [`MAX_INPUT_BYTES`],
//!   nothing allocated from a length field.
//! * `decode.rs`: the pickle machine (our own, not `serde-pickle`: its memo loses count of
//!   shared containers, see the note there) into `arena.rs`: 4-byte references to
//!   scalars and containers, a memo reference being the same index again; then the check
//!   that the result nests at most [`MAX_DEPTH`] deep and contains no cycle.
//! * `convert.rs`: the arena → [`Snapshot`] along the schema, each shared frame and frames
//!   list converted once and interned by content into a shared [`Stack`]; errors carry a
//!   path like `segments[3].blocks[0].size`; and the size guard, charged with what is
//!   really read and built against a budget proportional to the input.
//! * `encode.rs`: the protocol-4 writer that `MemoryViz.js` and Python read, writing each
//!   shared stack once and memo references after.
//!
//! Hostile input of any kind is an error ([`TraceError::Pickle`] or
//! [`TraceError::NotASnapshot`]) that names the problem, never a panic, and the time and
//! memory spent are linear in the input's size.
//!
//! [`Stack`]: vramroom_alloc::snapshot::Stack

mod arena;
mod convert;
mod decode;
mod encode;
mod source;

use std::path::{Path, PathBuf};

use vramroom_alloc::snapshot::Snapshot;

use crate::error::TraceError;

pub use convert::{BASE_BUDGET, BUDGET_PER_INPUT_BYTE};

/// Deepest nesting of containers a pickle may have. A 2.11 snapshot nests 7 deep.
pub const MAX_DEPTH: usize = 64;

/// Largest input read: 8 GiB, about 20 times the largest recordings we know of. An input
/// that goes on past it (an endless pipe, a device file) is refused with this limit named.
pub const MAX_INPUT_BYTES: u64 = 8 << 30;

/// Parses a pickle as written by `torch.cuda.memory._dump_snapshot()` (the
/// `_snapshot()` dict), or the list of segments that `torch.cuda.memory_snapshot()`
/// returns (then traces are empty and settings default).
pub fn read_snapshot(bytes: &[u8]) -> Result<Snapshot, TraceError> {
    read(source::Source::new(bytes, PathBuf::new()))
}

/// [`read_snapshot`] on a file, streamed: the file is never held in memory whole.
pub fn read_snapshot_file(path: &Path) -> Result<Snapshot, TraceError> {
    // Not a plain open: a FIFO with no writer would block forever (it reads as empty).
    let file = vramroom_alloc::input::open_nonblocking(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read(source::Source::new(file, path.to_path_buf()))
}

fn read<R: std::io::Read>(src: source::Source<R>) -> Result<Snapshot, TraceError> {
    let (doc, input_len) = decode::decode(src)?;
    convert::snapshot(&doc, input_len)
}

/// Encodes a snapshot as a protocol-4 pickle that Python's `pickle.load` and PyTorch's
/// web viewer (`pytorch.org/memory_viz`) both read, with PyTorch's key order.
pub fn write_snapshot(s: &Snapshot) -> Vec<u8> {
    // writing to a Vec cannot fail
    encode::Encoder::new(Vec::new())
        .write(s)
        .unwrap_or_default()
}

/// Writes [`write_snapshot`]'s bytes to `path` by `vramroom_alloc::output::write_file`'s
/// rules: a regular file through a temporary file and a rename (a crash or a full disk never
/// leaves a partial file), a symlink's target rather than the link, and a device or FIFO
/// written into, never replaced.
pub fn write_snapshot_file(s: &Snapshot, path: &Path) -> Result<(), TraceError> {
    let bytes = write_snapshot(s);
    vramroom_alloc::output::write_file(path, &bytes).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })
}
