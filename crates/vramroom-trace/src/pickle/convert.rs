//! The arena → [`Snapshot`], along the schema, with a path in every error and a bound
//! on what is built.
//!
//! Design note: conversion is where sharing either survives or explodes. A real snapshot
//! references a few hundred frame dicts millions of times through tens of thousands of
//! frame lists, most of them equal (a loop allocates from the same line each step). So a
//! frame dict converts once and a frames list converts once (memoized on its arena node),
//! and both are then interned by content: equal frames are one `Arc<Frame>`, equal lists
//! one [`Stack`]. The converted snapshot holds each distinct stack once, however the
//! pickle shared it, and the writer keeps that sharing (see `encode.rs`).
//!
//! The guard against "a small pickle that expands into a huge snapshot" lives here too,
//! because only here is it known what gets built: every value is charged its real size as
//! it is built (a list before its vector is reserved, a shared stack once), and every dict
//! its items as they are read (a dict referenced many times is read each time), against a
//! budget of [`BASE_BUDGET`] plus [`BUDGET_PER_INPUT_BYTE`] per input byte. The 169 real
//! recordings we have charge at most 3.1 bytes per input byte (snapshots without stacks,
//! where a trace entry is about 50 bytes of pickle for 88 bytes of `TraceEntry` and 64 of
//! dict read), so real files pass with a margin of five; a pickle that lists one memoized
//! entry dict ten million times, one or two bytes each, charges 76 or more per byte and
//! is refused long before it is built. Time is bounded the same way: conversion does
//! nothing that is not charged, except visiting each arena container once.
//!
//! Keys PyTorch added after 2.0 (`is_expandable`, `segment_pool_id`, `time_us`, block
//! `address`, …) default when missing so older snapshots load; unknown keys are ignored
//! (and never walked); a later duplicate key wins, as in a Python dict.

use std::fmt;
use std::mem::size_of;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use vramroom_alloc::snapshot::{
    AllocatorSettings, Annotation, BlockInfo, BlockState, Frame, SegmentInfo, Snapshot, Stack,
    TraceAction, TraceEntry,
};

use super::arena::{Doc, Item, Kind, Ref, Val, NO_SLOT};
use crate::error::TraceError;

/// Bytes any snapshot may build, whatever its size on disk.
pub const BASE_BUDGET: u64 = 64 << 20;
/// Bytes it may build per byte of pickle, on top of [`BASE_BUDGET`].
pub const BUDGET_PER_INPUT_BYTE: u64 = 16;

/// Where in the document a value sits, as a linked list up to the root; formatted only
/// when an error is reported.
#[derive(Clone, Copy)]
struct At<'a> {
    parent: Option<&'a At<'a>>,
    seg: Seg<'a>,
}

#[derive(Clone, Copy)]
enum Seg<'a> {
    Root,
    Key(&'a str),
    Index(usize),
}

impl<'a> At<'a> {
    const ROOT: At<'static> = At {
        parent: None,
        seg: Seg::Root,
    };
    fn key(&'a self, k: &'a str) -> At<'a> {
        At {
            parent: Some(self),
            seg: Seg::Key(k),
        }
    }
    fn index(&'a self, i: usize) -> At<'a> {
        At {
            parent: Some(self),
            seg: Seg::Index(i),
        }
    }
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // paths follow the schema, at most 7 deep, so recursion is fine
        if let Some(p) = self.parent {
            p.fmt(f)?;
        }
        match self.seg {
            Seg::Root => Ok(()),
            Seg::Key(k) if matches!(self.parent.map(|p| p.seg), Some(Seg::Root)) => f.write_str(k),
            Seg::Key(k) => write!(f, ".{k}"),
            Seg::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A value in the document.
#[derive(Clone, Copy)]
struct V<'d> {
    doc: &'d Doc,
    item: Item,
}

enum Shape<'d> {
    Scalar(Val<'d>),
    Container(Kind, &'d [Item]),
}

impl<'d> V<'d> {
    fn shape(self) -> Shape<'d> {
        match self.item.get() {
            Ref::Node(i) => {
                let (kind, items) = self.doc.items(i);
                Shape::Container(kind, items)
            }
            Ref::Leaf(_) | Ref::Int(_) => {
                Shape::Scalar(self.doc.val(self.item).unwrap_or(Val::None))
            }
        }
    }
    fn at(self, item: Item) -> V<'d> {
        V {
            doc: self.doc,
            item,
        }
    }
    fn scalar(self) -> Option<Val<'d>> {
        match self.shape() {
            Shape::Scalar(s) => Some(s),
            Shape::Container(..) => None,
        }
    }
    fn is_none(self) -> bool {
        matches!(self.scalar(), Some(Val::None))
    }
    /// The items of a list or tuple.
    fn list(self) -> Option<&'d [Item]> {
        match self.shape() {
            Shape::Container(Kind::List | Kind::Tuple, items) => Some(items),
            _ => None,
        }
    }
    /// Python's name for the value's type, and the value when it is short.
    fn describe(self) -> String {
        match self.shape() {
            Shape::Scalar(Val::None) => "None".into(),
            Shape::Scalar(Val::Bool(b)) => {
                if b {
                    "True".into()
                } else {
                    "False".into()
                }
            }
            Shape::Scalar(Val::Int(i)) => format!("int {i}"),
            Shape::Scalar(Val::UInt(u)) => format!("int {u}"),
            Shape::Scalar(Val::HugeInt { negative: true }) => "a huge negative int".into(),
            Shape::Scalar(Val::HugeInt { negative: false }) => "a huge int".into(),
            Shape::Scalar(Val::Float(f)) => format!("float {f}"),
            Shape::Scalar(Val::Str(s)) if s.chars().count() <= 40 => format!("str {s:?}"),
            Shape::Scalar(Val::Str(_)) => "a long str".into(),
            Shape::Scalar(Val::Bytes) => "bytes".into(),
            Shape::Container(Kind::List, items) => format!("list of {}", items.len()),
            Shape::Container(Kind::Tuple, items) => format!("tuple of {}", items.len()),
            Shape::Container(Kind::Dict, items) => format!("dict of {}", items.len() / 2),
        }
    }
}

fn wrong(at: At<'_>, expected: &str, v: V<'_>) -> TraceError {
    let what = match at.seg {
        Seg::Root => "top level".to_string(),
        _ => format!("`{at}`"),
    };
    TraceError::NotASnapshot(format!(
        "{what}: expected {expected}, found {}",
        v.describe()
    ))
}

/// The keys of one dict of the schema, by position.
struct Schema<const N: usize> {
    names: [&'static str; N],
}

/// The last key item seen for each field of a schema: dict keys are memoized strings, so
/// after the first dict of a kind, keys are recognised by index, without comparing text.
struct KeyCache<const N: usize>([Option<Item>; N]);

impl<const N: usize> Default for KeyCache<N> {
    fn default() -> Self {
        KeyCache([None; N])
    }
}

/// A dict's values for the fields of a schema; `None` for a missing key and for an
/// explicit Python `None`, which mean the same in snapshots.
struct Obj<'d, 'a, const N: usize> {
    vals: [Option<V<'d>>; N],
    schema: &'static Schema<N>,
    at: At<'a>,
}

impl<'d, 'a, const N: usize> Obj<'d, 'a, N> {
    fn new(
        v: V<'d>,
        at: At<'a>,
        schema: &'static Schema<N>,
        cache: &mut KeyCache<N>,
    ) -> Result<Self, TraceError> {
        let Shape::Container(Kind::Dict, items) = v.shape() else {
            return Err(wrong(at, "a dict", v));
        };
        let mut vals = [None; N];
        for kv in items.chunks_exact(2) {
            let [k, val] = kv else { continue };
            let field = match cache.0.iter().position(|c| *c == Some(*k)) {
                Some(f) => Some(f),
                None => match v.at(*k).scalar() {
                    Some(Val::Str(s)) => {
                        let f = schema.names.iter().position(|n| *n == s);
                        if let Some(slot) = f.and_then(|f| cache.0.get_mut(f)) {
                            *slot = Some(*k);
                        }
                        f
                    }
                    _ => None,
                },
            };
            if let Some(slot) = field.and_then(|f| vals.get_mut(f)) {
                // a later duplicate wins, as in Python
                let val = v.at(*val);
                *slot = (!val.is_none()).then_some(val);
            }
        }
        Ok(Obj { vals, schema, at })
    }

    fn name(&self, f: usize) -> &'static str {
        self.schema.names.get(f).copied().unwrap_or("?")
    }

    fn opt(&self, f: usize) -> Option<V<'d>> {
        self.vals.get(f).copied().flatten()
    }

    fn key_at(&self, f: usize) -> At<'_> {
        self.at.key(self.name(f))
    }

    fn req(&self, f: usize) -> Result<V<'d>, TraceError> {
        self.opt(f).ok_or_else(|| {
            TraceError::NotASnapshot(format!("missing key `{}`", self.at.key(self.name(f))))
        })
    }

    fn u64(&self, f: usize) -> Result<u64, TraceError> {
        to_u64(self.req(f)?, self.key_at(f))
    }
    fn i64(&self, f: usize) -> Result<i64, TraceError> {
        to_i64(self.req(f)?, self.key_at(f))
    }
    fn str(&self, f: usize) -> Result<&'d str, TraceError> {
        to_str(self.req(f)?, self.key_at(f))
    }
    fn opt_with<T>(
        &self,
        f: usize,
        conv: impl FnOnce(V<'d>, At<'_>) -> Result<T, TraceError>,
    ) -> Result<Option<T>, TraceError> {
        self.opt(f).map(|v| conv(v, self.key_at(f))).transpose()
    }
}

fn to_u64(v: V<'_>, at: At<'_>) -> Result<u64, TraceError> {
    match v.scalar() {
        Some(Val::Int(i)) => u64::try_from(i).map_err(|_| wrong(at, "a non-negative integer", v)),
        Some(Val::UInt(u)) => Ok(u),
        Some(Val::HugeInt { negative: false }) => Err(wrong(at, "an integer below 2^64", v)),
        _ => Err(wrong(at, "a non-negative integer", v)),
    }
}

fn to_i64(v: V<'_>, at: At<'_>) -> Result<i64, TraceError> {
    match v.scalar() {
        Some(Val::Int(i)) => Ok(i),
        _ => Err(wrong(at, "a 64-bit signed integer", v)),
    }
}

fn to_f64(v: V<'_>, at: At<'_>) -> Result<f64, TraceError> {
    match v.scalar() {
        Some(Val::Float(f)) => Ok(f),
        // a Python int where a float is meant (e.g. `0` for 0.0) is still a number
        Some(Val::Int(i)) => Ok(i as f64),
        Some(Val::UInt(u)) => Ok(u as f64),
        _ => Err(wrong(at, "a float", v)),
    }
}

fn to_bool(v: V<'_>, at: At<'_>) -> Result<bool, TraceError> {
    match v.scalar() {
        Some(Val::Bool(b)) => Ok(b),
        _ => Err(wrong(at, "a bool", v)),
    }
}

fn to_str<'d>(v: V<'d>, at: At<'_>) -> Result<&'d str, TraceError> {
    match v.scalar() {
        Some(Val::Str(s)) => Ok(s),
        _ => Err(wrong(at, "a str", v)),
    }
}

fn to_list<'d>(v: V<'d>, at: At<'_>) -> Result<&'d [Item], TraceError> {
    v.list().ok_or_else(|| wrong(at, "a list", v))
}

mod root {
    pub const SEGMENTS: usize = 0;
    pub const DEVICE_TRACES: usize = 1;
    pub const ALLOCATOR_SETTINGS: usize = 2;
    pub const EXTERNAL_ANNOTATIONS: usize = 3;
}
static ROOT: Schema<4> = Schema {
    names: [
        "segments",
        "device_traces",
        "allocator_settings",
        "external_annotations",
    ],
};

mod seg {
    pub const DEVICE: usize = 0;
    pub const ADDRESS: usize = 1;
    pub const TOTAL_SIZE: usize = 2;
    pub const ALLOCATED_SIZE: usize = 3;
    pub const ACTIVE_SIZE: usize = 4;
    pub const REQUESTED_SIZE: usize = 5;
    pub const STREAM: usize = 6;
    pub const SEGMENT_TYPE: usize = 7;
    pub const SEGMENT_POOL_ID: usize = 8;
    pub const IS_EXPANDABLE: usize = 9;
    pub const FRAMES: usize = 10;
    pub const BLOCKS: usize = 11;
}
static SEGMENT: Schema<12> = Schema {
    names: [
        "device",
        "address",
        "total_size",
        "allocated_size",
        "active_size",
        "requested_size",
        "stream",
        "segment_type",
        "segment_pool_id",
        "is_expandable",
        "frames",
        "blocks",
    ],
};

mod block {
    pub const ADDRESS: usize = 0;
    pub const SIZE: usize = 1;
    pub const REQUESTED_SIZE: usize = 2;
    pub const STATE: usize = 3;
    pub const FRAMES: usize = 4;
}
static BLOCK: Schema<5> = Schema {
    names: ["address", "size", "requested_size", "state", "frames"],
};

mod entry {
    pub const ACTION: usize = 0;
    pub const ADDR: usize = 1;
    pub const DEVICE_FREE: usize = 2;
    pub const SIZE: usize = 3;
    pub const STREAM: usize = 4;
    pub const TIME_US: usize = 5;
    pub const COMPILE_CONTEXT: usize = 6;
    pub const USER_METADATA: usize = 7;
    pub const FRAMES: usize = 8;
}
static ENTRY: Schema<9> = Schema {
    names: [
        "action",
        "addr",
        "device_free",
        "size",
        "stream",
        "time_us",
        "compile_context",
        "user_metadata",
        "frames",
    ],
};

mod frame {
    pub const NAME: usize = 0;
    pub const FILENAME: usize = 1;
    pub const LINE: usize = 2;
}
static FRAME: Schema<3> = Schema {
    names: ["name", "filename", "line"],
};

mod ann {
    pub const STAGE: usize = 0;
    pub const NAME: usize = 1;
    pub const DEVICE: usize = 2;
    pub const TIME_US: usize = 3;
}
static ANNOTATION: Schema<4> = Schema {
    names: ["stage", "name", "device", "time_us"],
};

mod set {
    pub const CONF: usize = 0;
    pub const MAX_SPLIT_SIZE: usize = 1;
    pub const GC_THRESHOLD: usize = 2;
    pub const EXPANDABLE_SEGMENTS: usize = 3;
    pub const PINNED_THREADS: usize = 4;
    pub const RELEASE_LOCK: usize = 5;
    pub const PINNED_HOST_REGISTER: usize = 6;
    pub const GRAPH_REUSE: usize = 7;
    pub const ROUNDUP: usize = 8;
}
static SETTINGS: Schema<9> = Schema {
    names: [
        "PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size",
        "garbage_collection_threshold",
        "expandable_segments",
        "pinned_num_register_threads",
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "graph_capture_record_stream_reuse",
        "roundup_power2_divisions",
    ],
};

/// What one shared thing costs beyond its own bytes: reference counts, the allocator's
/// header, a slot in an interning map.
const SHARED_OVERHEAD: u64 = 48;

#[derive(Default)]
struct Keys {
    root: KeyCache<4>,
    segment: KeyCache<12>,
    block: KeyCache<5>,
    entry: KeyCache<9>,
    frame: KeyCache<3>,
    annotation: KeyCache<4>,
    settings: KeyCache<9>,
}

struct Conv<'d> {
    doc: &'d Doc,
    keys: Keys,
    /// Distinct frames; a frame dict's node slot holds its index here.
    frames: Vec<Arc<Frame>>,
    frame_ids: FxHashMap<(&'d str, &'d str, u64), u32>,
    /// Distinct stacks; a frames list's node slot holds its index here.
    stacks: Vec<Stack>,
    /// Stacks by the items of their list: lists of the same memoized frame dicts are
    /// found here without looking at a frame.
    stacks_by_items: FxHashMap<&'d [Item], u32>,
    /// Stacks by their frames, for equal lists made of different dicts.
    stack_ids: FxHashMap<Box<[u32]>, u32>,
    /// The frame indices of the list being converted (reused).
    ids: Vec<u32>,
    strings: FxHashMap<&'d str, Arc<str>>,
    used: u64,
    budget: u64,
    input_len: u64,
}

/// Converts a decoded pickle of `input_len` bytes.
pub(super) fn snapshot(doc: &Doc, input_len: u64) -> Result<Snapshot, TraceError> {
    let mut c = Conv {
        doc,
        keys: Keys::default(),
        frames: Vec::new(),
        frame_ids: FxHashMap::default(),
        stacks: Vec::new(),
        stacks_by_items: FxHashMap::default(),
        stack_ids: FxHashMap::default(),
        ids: Vec::new(),
        strings: FxHashMap::default(),
        used: 0,
        budget: BASE_BUDGET.saturating_add(BUDGET_PER_INPUT_BYTE.saturating_mul(input_len)),
        input_len,
    };
    c.snapshot()
}

impl<'d> Conv<'d> {
    fn v(&self, item: Item) -> V<'d> {
        V {
            doc: self.doc,
            item,
        }
    }

    /// Accounts for `bytes` about to be built; refuses once the budget is spent.
    fn charge(&mut self, bytes: u64) -> Result<(), TraceError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.budget {
            return Err(TraceError::Pickle(format!(
                "the snapshot expands to over {} bytes read and built, out of proportion to \
                 the {} byte input (one object referenced many times; the limit is {} MiB \
                 plus {} bytes per input byte)",
                self.budget,
                self.input_len,
                BASE_BUDGET >> 20,
                BUDGET_PER_INPUT_BYTE
            )));
        }
        Ok(())
    }

    /// The elements of a list, converted by `f`; the vector is charged before it exists.
    fn list_of<T>(
        &mut self,
        v: V<'d>,
        at: At<'_>,
        mut f: impl FnMut(&mut Self, V<'d>, At<'_>) -> Result<T, TraceError>,
    ) -> Result<Vec<T>, TraceError> {
        let items = to_list(v, at)?;
        self.charge((items.len() as u64).saturating_mul(size_of::<T>() as u64))?;
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            out.push(f(self, v.at(*item), at.index(i))?);
        }
        Ok(out)
    }

    /// A dict of `schema`; reading its items is charged like building them, so a huge dict
    /// referenced many times costs time only within the budget.
    fn obj<'a, const N: usize>(
        &mut self,
        v: V<'d>,
        at: At<'a>,
        schema: &'static Schema<N>,
        cache: fn(&mut Keys) -> &mut KeyCache<N>,
    ) -> Result<Obj<'d, 'a, N>, TraceError> {
        if let Shape::Container(_, items) = v.shape() {
            self.charge(std::mem::size_of_val(items) as u64)?;
        }
        Obj::new(v, at, schema, cache(&mut self.keys))
    }

    /// A string that many entries repeat, shared.
    fn shared_str(&mut self, s: &'d str) -> Result<Arc<str>, TraceError> {
        if let Some(a) = self.strings.get(s) {
            return Ok(a.clone());
        }
        self.charge(s.len() as u64 + SHARED_OVERHEAD)?;
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(s, a.clone());
        Ok(a)
    }

    /// A string built once per value.
    fn owned_str(&mut self, s: &str) -> Result<String, TraceError> {
        self.charge(s.len() as u64)?;
        Ok(s.to_owned())
    }

    fn snapshot(&mut self) -> Result<Snapshot, TraceError> {
        let root = At::ROOT;
        let v = self.v(self.doc.root);
        match v.shape() {
            Shape::Container(Kind::List | Kind::Tuple, _) => Ok(Snapshot {
                segments: self.list_of(v, root, Self::segment)?,
                ..Snapshot::default()
            }),
            Shape::Container(Kind::Dict, _) => {
                let o = self.obj(v, root, &ROOT, |k| &mut k.root)?;
                let segments = self.list_of(
                    o.req(root::SEGMENTS)?,
                    o.key_at(root::SEGMENTS),
                    Self::segment,
                )?;
                let device_traces = match o.opt(root::DEVICE_TRACES) {
                    Some(v) => self.list_of(v, o.key_at(root::DEVICE_TRACES), |c, t, at| {
                        c.list_of(t, at, Self::trace_entry)
                    })?,
                    None => Vec::new(),
                };
                let allocator_settings = match o.opt(root::ALLOCATOR_SETTINGS) {
                    Some(v) => self.settings(v, o.key_at(root::ALLOCATOR_SETTINGS))?,
                    None => AllocatorSettings::default(),
                };
                let external_annotations = match o.opt(root::EXTERNAL_ANNOTATIONS) {
                    Some(v) => {
                        self.list_of(v, o.key_at(root::EXTERNAL_ANNOTATIONS), Self::annotation)?
                    }
                    None => Vec::new(),
                };
                Ok(Snapshot {
                    segments,
                    device_traces,
                    allocator_settings,
                    external_annotations,
                })
            }
            Shape::Scalar(_) => Err(wrong(
                root,
                "a dict from `_snapshot()` or a list of segments from `memory_snapshot()`",
                v,
            )),
        }
    }

    /// A frame dict, as an index into `self.frames`.
    fn frame(&mut self, v: V<'d>, at: At<'_>) -> Result<u32, TraceError> {
        let node = match v.item.get() {
            Ref::Node(n) => self.doc.node(n).filter(|n| n.kind == Kind::Dict),
            Ref::Leaf(_) | Ref::Int(_) => None,
        };
        if let Some(slot) = node.map(|n| n.slot.get()).filter(|s| *s != NO_SLOT) {
            return Ok(slot);
        }
        let o = self.obj(v, at, &FRAME, |k| &mut k.frame)?;
        let name = o.str(frame::NAME)?;
        let filename = o.str(frame::FILENAME)?;
        let line = o.u64(frame::LINE)?;
        let id = match self.frame_ids.get(&(name, filename, line)) {
            Some(id) => *id,
            None => {
                self.charge(
                    (size_of::<Frame>() + name.len() + filename.len()) as u64 + SHARED_OVERHEAD,
                )?;
                let id = u32::try_from(self.frames.len())
                    .map_err(|_| TraceError::NotASnapshot("more than 2^32 frames".into()))?;
                self.frames.push(Arc::new(Frame {
                    name: name.to_owned(),
                    filename: filename.to_owned(),
                    line,
                }));
                self.frame_ids.insert((name, filename, line), id);
                id
            }
        };
        if let Some(n) = node {
            n.slot.set(id);
        }
        Ok(id)
    }

    /// A frames list, shared with every equal one.
    fn stack(&mut self, v: V<'d>, at: At<'_>) -> Result<Stack, TraceError> {
        let items = to_list(v, at)?;
        if items.is_empty() {
            return Ok(Stack::empty());
        }
        let node = match v.item.get() {
            Ref::Node(n) => self.doc.node(n),
            Ref::Leaf(_) | Ref::Int(_) => None,
        };
        if let Some(slot) = node.map(|n| n.slot.get()).filter(|s| *s != NO_SLOT) {
            if let Some(s) = self.stacks.get(slot as usize) {
                return Ok(s.clone());
            }
        }
        if let Some(&id) = self.stacks_by_items.get(items) {
            if let Some(n) = node {
                n.slot.set(id);
            }
            return Ok(self.stacks.get(id as usize).cloned().unwrap_or_default());
        }
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        for (i, f) in items.iter().enumerate() {
            match self.frame(v.at(*f), at.index(i)) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    self.ids = ids;
                    return Err(e);
                }
            }
        }
        let id = match self.stack_ids.get(&ids[..]) {
            Some(id) => *id,
            None => {
                // the slice of pointers, its key in the map, the headers
                let cost = (ids.len() * (size_of::<Arc<Frame>>() + size_of::<u32>())) as u64
                    + 2 * SHARED_OVERHEAD;
                if let Err(e) = self.charge(cost) {
                    self.ids = ids;
                    return Err(e);
                }
                let id = u32::try_from(self.stacks.len())
                    .map_err(|_| TraceError::NotASnapshot("more than 2^32 stacks".into()))?;
                let stack: Stack = ids
                    .iter()
                    .filter_map(|&f| self.frames.get(f as usize).cloned())
                    .collect();
                self.stacks.push(stack);
                self.stack_ids.insert(ids.as_slice().into(), id);
                id
            }
        };
        self.ids = ids;
        // the key borrows the arena: only the map's slot is new
        self.charge(SHARED_OVERHEAD)?;
        self.stacks_by_items.insert(items, id);
        if let Some(n) = node {
            n.slot.set(id);
        }
        Ok(self.stacks.get(id as usize).cloned().unwrap_or_default())
    }

    fn segment(&mut self, v: V<'d>, at: At<'_>) -> Result<SegmentInfo, TraceError> {
        let o = self.obj(v, at, &SEGMENT, |k| &mut k.segment)?;
        let address = o.u64(seg::ADDRESS)?;
        // blocks tile the segment in order; older snapshots leave their address implicit
        let mut next_addr = address;
        let blocks = self.list_of(o.req(seg::BLOCKS)?, o.key_at(seg::BLOCKS), |c, b, at| {
            let ob = c.obj(b, at, &BLOCK, |k| &mut k.block)?;
            let size = ob.u64(block::SIZE)?;
            let state_v = ob.req(block::STATE)?;
            let state = BlockState::parse(to_str(state_v, ob.key_at(block::STATE))?)
                .ok_or_else(|| wrong(ob.key_at(block::STATE), "a block state", state_v))?;
            let address = ob.opt_with(block::ADDRESS, to_u64)?.unwrap_or(next_addr);
            next_addr = address.wrapping_add(size);
            Ok(BlockInfo {
                address,
                size,
                requested_size: ob.opt_with(block::REQUESTED_SIZE, to_u64)?.unwrap_or(size),
                state,
                frames: match ob.opt(block::FRAMES) {
                    Some(f) => c.stack(f, ob.key_at(block::FRAMES))?,
                    None => Stack::empty(),
                },
            })
        })?;
        let requested_default = blocks
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .fold(0u64, |acc, b| acc.saturating_add(b.requested_size));
        let segment_type = self.owned_str(o.str(seg::SEGMENT_TYPE)?)?;
        Ok(SegmentInfo {
            device: o.i64(seg::DEVICE)?,
            address,
            total_size: o.u64(seg::TOTAL_SIZE)?,
            allocated_size: o.u64(seg::ALLOCATED_SIZE)?,
            active_size: o.u64(seg::ACTIVE_SIZE)?,
            requested_size: o
                .opt_with(seg::REQUESTED_SIZE, to_u64)?
                .unwrap_or(requested_default),
            stream: o.u64(seg::STREAM)?,
            segment_type,
            segment_pool_id: o
                .opt_with(seg::SEGMENT_POOL_ID, |v, at| match to_list(v, at)? {
                    [a, b] => Ok((
                        to_i64(v.at(*a), at.index(0))?,
                        to_i64(v.at(*b), at.index(1))?,
                    )),
                    _ => Err(wrong(at, "a pair of integers", v)),
                })?
                .unwrap_or((0, 0)),
            is_expandable: o.opt_with(seg::IS_EXPANDABLE, to_bool)?.unwrap_or(false),
            frames: match o.opt(seg::FRAMES) {
                Some(f) => self.stack(f, o.key_at(seg::FRAMES))?,
                None => Stack::empty(),
            },
            blocks,
        })
    }

    fn trace_entry(&mut self, v: V<'d>, at: At<'_>) -> Result<TraceEntry, TraceError> {
        let o = self.obj(v, at, &ENTRY, |k| &mut k.entry)?;
        let action_v = o.req(entry::ACTION)?;
        let action = TraceAction::parse(to_str(action_v, o.key_at(entry::ACTION))?)
            .ok_or_else(|| wrong(o.key_at(entry::ACTION), "a trace action", action_v))?;
        // oom entries carry the driver's free bytes under `device_free` instead of `addr`
        let addr_key = if action == TraceAction::Oom
            && (o.opt(entry::DEVICE_FREE).is_some() || o.opt(entry::ADDR).is_none())
        {
            entry::DEVICE_FREE
        } else {
            entry::ADDR
        };
        let compile_context = match o.opt_with(entry::COMPILE_CONTEXT, to_str)? {
            Some(s) => self.shared_str(s)?,
            None => self.shared_str("N/A")?,
        };
        let user_metadata = match o.opt_with(entry::USER_METADATA, to_str)? {
            Some(s) => self.shared_str(s)?,
            None => self.shared_str("")?,
        };
        Ok(TraceEntry {
            action,
            addr: o.u64(addr_key)?,
            size: o.u64(entry::SIZE)?,
            stream: o.opt_with(entry::STREAM, to_u64)?.unwrap_or(0),
            time_us: o.opt_with(entry::TIME_US, to_i64)?.unwrap_or(0),
            compile_context,
            user_metadata,
            frames: match o.opt(entry::FRAMES) {
                Some(f) => Some(self.stack(f, o.key_at(entry::FRAMES))?),
                None => None,
            },
        })
    }

    fn annotation(&mut self, v: V<'d>, at: At<'_>) -> Result<Annotation, TraceError> {
        let o = self.obj(v, at, &ANNOTATION, |k| &mut k.annotation)?;
        Ok(Annotation {
            stage: self.owned_str(o.str(ann::STAGE)?)?,
            name: self.owned_str(o.str(ann::NAME)?)?,
            device: o.i64(ann::DEVICE)?,
            time_us: o.i64(ann::TIME_US)?,
        })
    }

    fn settings(&mut self, v: V<'d>, at: At<'_>) -> Result<AllocatorSettings, TraceError> {
        let o = self.obj(v, at, &SETTINGS, |k| &mut k.settings)?;
        let d = AllocatorSettings::default();
        let pytorch_cuda_alloc_conf = match o.opt_with(set::CONF, to_str)? {
            Some(s) => self.owned_str(s)?,
            None => d.pytorch_cuda_alloc_conf,
        };
        let roundup_power2_divisions = match o.opt(set::ROUNDUP) {
            None => d.roundup_power2_divisions,
            Some(v) => {
                let at = o.key_at(set::ROUNDUP);
                let Shape::Container(Kind::Dict, items) = v.shape() else {
                    return Err(wrong(at, "a dict", v));
                };
                let mut out = std::collections::BTreeMap::new();
                for kv in items.chunks_exact(2) {
                    let [k, val] = kv else { continue };
                    let (k, val) = (v.at(*k), v.at(*val));
                    let key = match k.scalar() {
                        Some(Val::Str(s)) => s.to_string(),
                        Some(Val::Int(i)) => i.to_string(),
                        Some(Val::UInt(u)) => u.to_string(),
                        _ => return Err(wrong(at, "str keys", k)),
                    };
                    // a map node: the key, the value, links
                    self.charge(key.len() as u64 + SHARED_OVERHEAD)?;
                    let n = to_i64(val, at.key(&key))?;
                    out.insert(key, n);
                }
                out
            }
        };
        Ok(AllocatorSettings {
            pytorch_cuda_alloc_conf,
            max_split_size: o
                .opt_with(set::MAX_SPLIT_SIZE, to_i64)?
                .unwrap_or(d.max_split_size),
            garbage_collection_threshold: o
                .opt_with(set::GC_THRESHOLD, to_f64)?
                .unwrap_or(d.garbage_collection_threshold),
            expandable_segments: o
                .opt_with(set::EXPANDABLE_SEGMENTS, to_bool)?
                .unwrap_or(d.expandable_segments),
            pinned_num_register_threads: o
                .opt_with(set::PINNED_THREADS, to_i64)?
                .unwrap_or(d.pinned_num_register_threads),
            release_lock_on_cudamalloc: o
                .opt_with(set::RELEASE_LOCK, to_bool)?
                .unwrap_or(d.release_lock_on_cudamalloc),
            pinned_use_cuda_host_register: o
                .opt_with(set::PINNED_HOST_REGISTER, to_bool)?
                .unwrap_or(d.pinned_use_cuda_host_register),
            graph_capture_record_stream_reuse: o
                .opt_with(set::GRAPH_REUSE, to_bool)?
                .unwrap_or(d.graph_capture_record_stream_reuse),
            roundup_power2_divisions,
        })
    }
}
