//! The writer: a [`Snapshot`] as a protocol-4 pickle.
//!
//! Design note: a small encoder of our own, for two reasons: dict keys must come out in
//! PyTorch's order, and the web viewer `MemoryViz.js` has its own unpickler that knows
//! only some opcodes and only protocols 2–4. The encoder emits `PROTO 4`, `EMPTY_DICT`/
//! `MARK`/`SETITEMS`, `EMPTY_LIST`/`APPEND`/`APPENDS`, `SHORT_BINUNICODE`/`BINUNICODE`,
//! `BININT1`/`BININT2`/`BININT`/`LONG1`, `BINFLOAT`, `NEWTRUE`/`NEWFALSE`, `TUPLE2`,
//! `MEMOIZE`/`BINGET`/`LONG_BINGET` and `STOP`, all of which that unpickler implements.
//! Integers get the opcode CPython's pickler would choose; lists are appended in batches
//! of 1000 as CPython does, which also keeps the viewer's `push(...items)` spread under
//! JavaScript's argument limit. No `FRAME` opcodes are written: framing is optional in
//! protocol 4.
//!
//! Sharing is written as sharing, the way CPython's pickler writes any object it has
//! seen: strings are memoized by value, and a [`Stack`] or a frame by its allocation
//! (`MEMOIZE` right after its `EMPTY_LIST`/`EMPTY_DICT`, a `BINGET`/`LONG_BINGET` for
//! every later use). A snapshot read and written back therefore stays about its original
//! size instead of copying each stack into every entry; the reader's interning makes equal
//! stacks one allocation, so they are written once too.
//!
//! Output goes through a 64 KiB buffer to any `Write`, so a file is written as it is
//! encoded and never held whole.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;

use vramroom_alloc::snapshot::{
    AllocatorSettings, Annotation, Frame, SegmentInfo, Snapshot, Stack, TraceAction, TraceEntry,
};

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const SETITEMS: u8 = b'u';
const EMPTY_LIST: u8 = b']';
const APPEND: u8 = b'a';
const APPENDS: u8 = b'e';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const TUPLE2: u8 = 0x86;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// CPython's `_BATCHSIZE`.
const BATCH: usize = 1000;
/// Bytes buffered before they go to the sink.
const FLUSH_AT: usize = 64 << 10;

pub(super) struct Encoder<'s, W: Write> {
    out: Vec<u8>,
    sink: W,
    /// The first write error; later output is dropped and this is returned at the end.
    error: Option<io::Error>,
    next_id: u32,
    /// Memo ids are u32; past that, values are written in full.
    memo_full: bool,
    strings: HashMap<&'s str, u32>,
    /// Stacks and frames by address: shared ones are written once.
    stacks: HashMap<usize, u32>,
    frames: HashMap<*const Frame, u32>,
}

impl<'s, W: Write> Encoder<'s, W> {
    pub(super) fn new(sink: W) -> Self {
        Encoder {
            out: Vec::with_capacity(FLUSH_AT + 1024),
            sink,
            error: None,
            next_id: 0,
            memo_full: false,
            strings: HashMap::new(),
            stacks: HashMap::new(),
            frames: HashMap::new(),
        }
    }

    /// Writes `s` and `STOP`, and returns the sink.
    pub(super) fn write(mut self, s: &'s Snapshot) -> io::Result<W> {
        self.snapshot(s);
        self.out.push(STOP);
        self.flush();
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.sink),
        }
    }

    fn flush(&mut self) {
        if self.error.is_none() {
            if let Err(e) = self.sink.write_all(&self.out) {
                self.error = Some(e);
            }
        }
        self.out.clear();
    }

    #[inline]
    fn maybe_flush(&mut self) {
        if self.out.len() >= FLUSH_AT {
            self.flush();
        }
    }

    /// `MEMOIZE` the top of the stack; its id, or `None` once the memo is full.
    fn memoize(&mut self) -> Option<u32> {
        if self.memo_full {
            return None;
        }
        let id = self.next_id;
        match self.next_id.checked_add(1) {
            Some(n) => self.next_id = n,
            None => self.memo_full = true,
        }
        self.out.push(MEMOIZE);
        Some(id)
    }

    fn get(&mut self, id: u32) {
        match u8::try_from(id) {
            Ok(small) => self.out.extend([BINGET, small]),
            Err(_) => {
                self.out.push(LONG_BINGET);
                self.out.extend(id.to_le_bytes());
            }
        }
    }

    fn int(&mut self, v: i128) {
        // CPython's save_long, opcode for opcode
        if (0..=0xff).contains(&v) {
            self.out.extend([BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.out.push(BININT2);
            self.out.extend((v as u16).to_le_bytes());
        } else if (i128::from(i32::MIN)..=i128::from(i32::MAX)).contains(&v) {
            self.out.push(BININT);
            self.out.extend((v as i32).to_le_bytes());
        } else {
            let bytes = long_bytes(v);
            self.out.extend([LONG1, bytes.len() as u8]);
            self.out.extend(bytes);
        }
    }

    fn uint(&mut self, v: u64) {
        self.int(i128::from(v));
    }

    fn sint(&mut self, v: i64) {
        self.int(i128::from(v));
    }

    fn float(&mut self, v: f64) {
        self.out.push(BINFLOAT);
        self.out.extend(v.to_be_bytes());
    }

    fn bool(&mut self, v: bool) {
        self.out.push(if v { NEWTRUE } else { NEWFALSE });
    }

    fn str(&mut self, s: &'s str) {
        if let Some(&id) = self.strings.get(s) {
            self.get(id);
            return;
        }
        let bytes = s.as_bytes();
        if let Ok(n) = u8::try_from(bytes.len()) {
            self.out.extend([SHORT_BINUNICODE, n]);
        } else if let Ok(n) = u32::try_from(bytes.len()) {
            self.out.push(BINUNICODE);
            self.out.extend(n.to_le_bytes());
        } else {
            // ≥ 4 GiB: the viewer cannot read this opcode, but nothing else could either
            self.out.push(BINUNICODE8);
            self.out.extend((bytes.len() as u64).to_le_bytes());
        }
        if bytes.len() >= FLUSH_AT {
            self.flush();
            if self.error.is_none() {
                if let Err(e) = self.sink.write_all(bytes) {
                    self.error = Some(e);
                }
            }
        } else {
            self.out.extend_from_slice(bytes);
        }
        if let Some(id) = self.memoize() {
            self.strings.insert(s, id);
        }
    }

    fn list<T>(&mut self, items: &'s [T], mut each: impl FnMut(&mut Self, &'s T)) {
        self.out.push(EMPTY_LIST);
        for batch in items.chunks(BATCH) {
            if let [only] = batch {
                each(self, only);
                self.out.push(APPEND);
            } else {
                self.out.push(MARK);
                for item in batch {
                    each(self, item);
                    self.maybe_flush();
                }
                self.out.push(APPENDS);
            }
        }
    }

    /// A dict whose `body` writes key/value pairs; `empty` skips the MARK.
    fn dict(&mut self, empty: bool, body: impl FnOnce(&mut Self)) {
        self.out.push(EMPTY_DICT);
        if !empty {
            self.out.push(MARK);
            body(self);
            self.out.push(SETITEMS);
        }
    }

    fn snapshot(&mut self, s: &'s Snapshot) {
        self.out.extend([PROTO, 4]);
        self.dict(false, |e| {
            e.str("segments");
            e.list(&s.segments, Self::segment);
            e.str("device_traces");
            e.list(&s.device_traces, |e, t| e.list(t, Self::trace_entry));
            e.str("allocator_settings");
            e.settings(&s.allocator_settings);
            e.str("external_annotations");
            e.list(&s.external_annotations, Self::annotation);
        });
    }

    fn frames(&mut self, stack: &'s Stack) {
        if stack.is_empty() {
            // one byte; sharing it would cost more
            self.out.push(EMPTY_LIST);
            return;
        }
        if let Some(&id) = self.stacks.get(&stack.addr()) {
            self.get(id);
            return;
        }
        self.out.push(EMPTY_LIST);
        if let Some(id) = self.memoize() {
            self.stacks.insert(stack.addr(), id);
        }
        for batch in stack.chunks(BATCH) {
            self.out.push(MARK);
            for f in batch {
                self.frame(f);
            }
            self.out.push(APPENDS);
        }
    }

    fn frame(&mut self, f: &'s Arc<Frame>) {
        let key = Arc::as_ptr(f);
        if let Some(&id) = self.frames.get(&key) {
            self.get(id);
            return;
        }
        self.out.push(EMPTY_DICT);
        if let Some(id) = self.memoize() {
            self.frames.insert(key, id);
        }
        self.out.push(MARK);
        self.str("name");
        self.str(&f.name);
        self.str("filename");
        self.str(&f.filename);
        self.str("line");
        self.uint(f.line);
        self.out.push(SETITEMS);
    }

    fn segment(&mut self, s: &'s SegmentInfo) {
        self.dict(false, |e| {
            e.str("device");
            e.sint(s.device);
            e.str("address");
            e.uint(s.address);
            e.str("total_size");
            e.uint(s.total_size);
            e.str("allocated_size");
            e.uint(s.allocated_size);
            e.str("active_size");
            e.uint(s.active_size);
            e.str("requested_size");
            e.uint(s.requested_size);
            e.str("stream");
            e.uint(s.stream);
            e.str("segment_type");
            e.str(&s.segment_type);
            e.str("segment_pool_id");
            e.sint(s.segment_pool_id.0);
            e.sint(s.segment_pool_id.1);
            e.out.push(TUPLE2);
            e.str("is_expandable");
            e.bool(s.is_expandable);
            // PyTorch 2.11 adds a segment's stack after its blocks, and an empty one
            // before them
            let stack_last = !s.frames.is_empty();
            if !stack_last {
                e.str("frames");
                e.frames(&s.frames);
            }
            e.str("blocks");
            e.list(&s.blocks, |e, b| {
                e.dict(false, |e| {
                    e.str("address");
                    e.uint(b.address);
                    e.str("size");
                    e.uint(b.size);
                    e.str("requested_size");
                    e.uint(b.requested_size);
                    e.str("state");
                    e.str(b.state.as_str());
                    e.str("frames");
                    e.frames(&b.frames);
                })
            });
            if stack_last {
                e.str("frames");
                e.frames(&s.frames);
            }
        });
    }

    fn trace_entry(&mut self, t: &'s TraceEntry) {
        self.dict(false, |e| {
            e.str("action");
            e.str(t.action.as_str());
            e.str(if t.action == TraceAction::Oom {
                "device_free"
            } else {
                "addr"
            });
            e.uint(t.addr);
            e.str("size");
            e.uint(t.size);
            e.str("stream");
            e.uint(t.stream);
            e.str("time_us");
            e.sint(t.time_us);
            e.str("compile_context");
            e.str(&t.compile_context);
            e.str("user_metadata");
            e.str(&t.user_metadata);
            if let Some(frames) = &t.frames {
                e.str("frames");
                e.frames(frames);
            }
        });
    }

    fn annotation(&mut self, a: &'s Annotation) {
        self.dict(false, |e| {
            e.str("stage");
            e.str(&a.stage);
            e.str("name");
            e.str(&a.name);
            e.str("device");
            e.sint(a.device);
            e.str("time_us");
            e.sint(a.time_us);
        });
    }

    fn settings(&mut self, s: &'s AllocatorSettings) {
        self.dict(false, |e| {
            e.str("PYTORCH_CUDA_ALLOC_CONF");
            e.str(&s.pytorch_cuda_alloc_conf);
            e.str("max_split_size");
            e.sint(s.max_split_size);
            e.str("garbage_collection_threshold");
            e.float(s.garbage_collection_threshold);
            e.str("expandable_segments");
            e.bool(s.expandable_segments);
            e.str("pinned_num_register_threads");
            e.sint(s.pinned_num_register_threads);
            e.str("release_lock_on_cudamalloc");
            e.bool(s.release_lock_on_cudamalloc);
            e.str("pinned_use_cuda_host_register");
            e.bool(s.pinned_use_cuda_host_register);
            e.str("graph_capture_record_stream_reuse");
            e.bool(s.graph_capture_record_stream_reuse);
            e.str("roundup_power2_divisions");
            // PyTorch lists the divisions by size ("1", "2", "4", …), not as strings sort
            let mut keys: Vec<(&'s String, &'s i64)> = s.roundup_power2_divisions.iter().collect();
            keys.sort_by_key(|(k, _)| (k.parse::<u64>().map_err(|_| k.as_str()), *k));
            e.dict(keys.is_empty(), |e| {
                for (k, v) in keys {
                    e.str(k);
                    e.sint(*v);
                }
            });
        });
    }
}

/// CPython's `encode_long`: little-endian two's complement, shortest form that keeps
/// the sign (so 2^63 takes 9 bytes).
fn long_bytes(v: i128) -> Vec<u8> {
    let bit_length = 128 - v.unsigned_abs().leading_zeros() as usize;
    let n = ((bit_length >> 3) + 1).min(16);
    let mut bytes: Vec<u8> = v.to_le_bytes().iter().take(n).copied().collect();
    if v < 0 && bytes.len() > 1 {
        let len = bytes.len();
        if bytes[len - 1] == 0xff && bytes[len - 2] & 0x80 != 0 {
            bytes.pop();
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_bytes_match_cpython() {
        // values from `pickle.encode_long` in CPython 3.12
        assert_eq!(long_bytes(0x7fff_ffff + 1), vec![0, 0, 0, 0x80, 0]);
        assert_eq!(
            long_bytes(140440462426112),
            vec![0, 0, 0xe0, 0xd7, 0xba, 0x7f]
        );
        assert_eq!(long_bytes(1 << 63), vec![0, 0, 0, 0, 0, 0, 0, 0x80, 0]);
        assert_eq!(
            long_bytes(u64::MAX.into()),
            vec![0xff; 8].into_iter().chain([0]).collect::<Vec<_>>()
        );
        assert_eq!(
            long_bytes(-(1 << 31) - 1),
            vec![0xff, 0xff, 0xff, 0x7f, 0xff]
        );
        assert_eq!(long_bytes(-(1 << 40)), vec![0, 0, 0, 0, 0, 0xff]);
        assert_eq!(long_bytes(i64::MIN.into()), vec![0, 0, 0, 0, 0, 0, 0, 0x80]);
    }

    fn frame(n: u64) -> Frame {
        Frame {
            name: format!("f{n}"),
            filename: "m.py".into(),
            line: n,
        }
    }

    #[test]
    fn shared_stacks_and_frames_are_written_once() {
        let stack = Stack::from(vec![frame(1), frame(2)]);
        let entry = |frames: Option<Stack>| TraceEntry {
            action: TraceAction::Alloc,
            addr: 1,
            size: 2,
            stream: 0,
            time_us: 0,
            compile_context: "N/A".into(),
            user_metadata: "".into(),
            frames,
        };
        let one = Snapshot {
            device_traces: vec![vec![entry(Some(stack.clone()))]],
            ..Snapshot::default()
        };
        let many = Snapshot {
            device_traces: vec![vec![entry(Some(stack.clone())); 100]],
            ..Snapshot::default()
        };
        let w = |s: &Snapshot| Encoder::new(Vec::new()).write(s).unwrap();
        let (a, b) = (w(&one), w(&many));
        // each further entry is its dict of memoized keys plus a 2-byte reference to
        // the stack, not a copy of it
        let per_entry = (b.len() - a.len()) / 99;
        assert!(per_entry < 40, "{per_entry} bytes per repeated entry");
        // equal but separate stacks are written separately (identity, as CPython does)
        let lists = |a: Stack, b: Stack| {
            let s = Snapshot {
                device_traces: vec![vec![entry(Some(a)), entry(Some(b))]],
                ..Snapshot::default()
            };
            w(&s).iter().filter(|&&b| b == EMPTY_LIST).count()
        };
        let shared = Stack::from(vec![frame(1)]);
        assert_eq!(
            lists(Stack::from(vec![frame(1)]), Stack::from(vec![frame(1)])),
            lists(shared.clone(), shared) + 1
        );
    }

    #[test]
    fn write_errors_are_returned() {
        #[derive(Debug)]
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let err = Encoder::new(Full).write(&Snapshot::default()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
    }
}
