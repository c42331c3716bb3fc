//! The pickle machine: opcodes in, an [`arena`](super::arena) out.
//!
//! Design note: this is a plain-data subset of CPython's unpickler, written here rather
//! than taken from `serde-pickle`. Version 1.2 of that crate reference-counts memo entries
//! and loses count when a memoized container is itself referenced twice (upstream issue
//! birkenfeld/serde-pickle#24). PyTorch shares frame dicts and frame lists between blocks
//! and trace entries, so every real snapshot with stacks failed there with "recursive
//! structure found"; it also builds a tree of owned values, copying each shared stack
//! once per reference. Here a memo reference is an index, so sharing is free.
//!
//! Only plain-data opcodes are accepted (no globals, `REDUCE`, `BUILD`, persistent ids or
//! out-of-band buffers), so nothing in a pickle can run code or name a class. Bytes after
//! `STOP` are never read, as with Python's `pickle.load` and the web viewer (`_memory_viz`
//! pads the pickles it embeds with NULs).
//!
//! The stack is one vector with marks as positions in it, as in CPython: the items of a
//! `MARK … APPENDS` run are copied once into their container's run in the arena, and no
//! opcode allocates on its own. Strings repeated by value rather than memoized (PyTorch
//! writes `"N/A"` anew in every trace entry) become one scalar. Every opcode adds at most
//! one scalar or container and a few items, so memory here is linear in the input (the
//! input itself is streamed, see `source.rs`); what the document would become once
//! expanded is the converter's to bound.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::io::Read;

use rustc_hash::FxBuildHasher;

use super::arena::{Doc, Item, Kind, Ref, Scalar, Val};
use super::source::{bad, Source};
use super::MAX_DEPTH;
use crate::error::TraceError;

/// More open `MARK`s than this is refused; real pickles keep one open per level.
const MAX_OPEN_MARKS: usize = 2 * MAX_DEPTH;
/// Text literals (`INT`, `LONG`, `FLOAT`, `PUT`, `GET`) are at most this long; real
/// ones have at most 20 digits.
const MAX_TEXT_LITERAL: usize = 256;

mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
}

/// Python's memo: ids are dense in every pickler we know of (`MEMOIZE` takes the next one;
/// CPython's `BINPUT`s count up too), so they live in a vector; an id beyond its end goes
/// to a map, so a hostile `LONG_BINPUT 4294967295` costs one entry, not 16 GiB.
#[derive(Default)]
struct Memo {
    dense: Vec<Item>,
    sparse: HashMap<u32, Item>,
}

impl Memo {
    /// `len(memo)` in Python: the number of distinct ids stored.
    fn len(&self) -> usize {
        self.dense.len() + self.sparse.len()
    }

    fn put(&mut self, id: u32, item: Item) {
        let i = id as usize;
        if let Some(slot) = self.dense.get_mut(i) {
            *slot = item;
        } else if i == self.dense.len() {
            self.dense.push(item);
            // ids stored out of order join the vector once it reaches them
            while let Some(next) = self.sparse.remove(&(self.dense.len() as u32)) {
                self.dense.push(next);
            }
        } else {
            self.sparse.insert(id, item);
        }
    }

    #[inline]
    fn get(&self, id: u32) -> Option<Item> {
        match self.dense.get(id as usize) {
            Some(item) => Some(*item),
            None => self.sparse.get(&id).copied(),
        }
    }
}

/// Same stack discipline as CPython's unpickler.
struct Machine<R> {
    src: Source<R>,
    stack: Vec<Item>,
    /// Where each open `MARK` began, as positions in `stack`.
    marks: Vec<usize>,
    memo: Memo,
    doc: Doc,
    /// Strings seen, by hash of their text: a repeat becomes the same scalar. A hash
    /// collision only costs the sharing (the text is compared before reuse).
    strings: HashMap<u64, Item, FxBuildHasher>,
    /// Reused for arguments that span buffer refills and for text lines.
    scratch: Vec<u8>,
}

/// Runs the pickle to `STOP` and checks the result's shape (see `arena.rs`); returns it
/// with the number of bytes read.
pub(super) fn decode<R: Read>(src: Source<R>) -> Result<(Doc, u64), TraceError> {
    let mut m = Machine {
        src,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        doc: Doc::new(),
        strings: HashMap::default(),
        scratch: Vec::new(),
    };
    let (root, at) = m.run()?;
    let mut doc = m.doc;
    doc.root = root;
    doc.check_shape(at)?;
    Ok((doc, at + 1))
}

/// Two's-complement little-endian bytes (LONG1/LONG4) as an integer.
fn long_from_le(bytes: &[u8]) -> Scalar {
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    let fill = if negative { 0xff } else { 0 };
    // sign-extension bytes beyond 16 change nothing
    let mut len = bytes.len();
    while len > 16 && bytes.get(len - 1) == Some(&fill) {
        len -= 1;
    }
    let significant = bytes.get(..len).unwrap_or(bytes);
    if len > 16
        || significant
            .last()
            .is_some_and(|b| (b & 0x80 != 0) != negative)
    {
        return Scalar::HugeInt { negative };
    }
    let mut buf = [fill; 16];
    for (dst, src) in buf.iter_mut().zip(significant) {
        *dst = *src;
    }
    Scalar::int(i128::from_le_bytes(buf))
}

/// A decimal literal of `INT`/`LONG` (protocols 0 and 1).
fn int_from_text(text: &str) -> Option<Scalar> {
    let t = text.trim();
    let t = t.strip_suffix('L').unwrap_or(t);
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(match t.parse::<i128>() {
        Ok(i) => Scalar::int(i),
        Err(_) => Scalar::HugeInt {
            negative: t.starts_with('-'),
        },
    })
}

/// `raw-unicode-escape`, the encoding of protocol 0's `UNICODE`: Latin-1 bytes plus
/// `\uXXXX` and `\UXXXXXXXX`.
fn raw_unicode_escape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let width = match (b, bytes.get(i + 1)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => 0,
        };
        if width == 0 {
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let hex = bytes.get(i + 2..i + 2 + width)?;
        let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
        out.push(char::from_u32(code)?);
        i += 2 + width;
    }
    Some(out)
}

impl<R: Read> Machine<R> {
    fn len_u32(&mut self, at: u64) -> Result<usize, TraceError> {
        usize::try_from(u32::from_le_bytes(self.src.array(at)?))
            .map_err(|_| bad(at, "length does not fit in memory"))
    }

    fn len_i32(&mut self, at: u64) -> Result<usize, TraceError> {
        let n = i32::from_le_bytes(self.src.array(at)?);
        usize::try_from(n).map_err(|_| bad(at, format_args!("negative length {n}")))
    }

    fn len_u64(&mut self, at: u64) -> Result<usize, TraceError> {
        let n = u64::from_le_bytes(self.src.array(at)?);
        usize::try_from(n).map_err(|_| bad(at, format_args!("length {n} too large")))
    }

    /// A text literal (a number or memo id in protocols 0 and 1), left in `scratch`.
    fn text_literal(&mut self, at: u64) -> Result<&str, TraceError> {
        self.src.line(at, MAX_TEXT_LITERAL, &mut self.scratch)?;
        std::str::from_utf8(&self.scratch).map_err(|_| bad(at, "text literal is not ASCII"))
    }

    fn memo_id_text(&mut self, at: u64) -> Result<u32, TraceError> {
        let text = self.text_literal(at)?;
        text.trim()
            .parse::<u32>()
            .map_err(|_| bad(at, format_args!("memo id {text:?} is not a number")))
    }

    /// Pushes a string argument of `n` bytes.
    fn str_arg(&mut self, n: usize, at: u64) -> Result<(), TraceError> {
        let Self {
            src,
            scratch,
            doc,
            strings,
            stack,
            ..
        } = self;
        let item = src.bytes(n, at, scratch, |b| {
            let text = std::str::from_utf8(b).map_err(|_| bad(at, "string is not valid UTF-8"))?;
            let hash = strings.hasher().hash_one(text);
            if let Some(&seen) = strings.get(&hash) {
                if matches!(doc.val(seen), Some(Val::Str(s)) if s == text) {
                    return Ok(seen);
                }
            }
            let item = doc
                .add_leaf(Scalar::Str(text.into()))
                .ok_or_else(|| bad(at, "more than 2^30 strings"))?;
            strings.insert(hash, item);
            Ok(item)
        })??;
        stack.push(item);
        Ok(())
    }

    /// A bytes argument of `n` bytes: read past, not kept (see [`Scalar::Bytes`]).
    fn bytes_arg(&mut self, n: usize, at: u64) -> Result<Scalar, TraceError> {
        self.src.skip(n, at)?;
        Ok(Scalar::Bytes)
    }

    #[inline]
    fn push_leaf(&mut self, s: Scalar, at: u64) -> Result<(), TraceError> {
        let item = self
            .doc
            .add_leaf(s)
            .ok_or_else(|| bad(at, "more than 2^30 scalars of one kind"))?;
        self.stack.push(item);
        Ok(())
    }

    fn push_node(&mut self, kind: Kind, items: &[Item], at: u64) -> Result<(), TraceError> {
        let item = self.doc.add_node(kind, items, at)?;
        self.stack.push(item);
        Ok(())
    }

    /// Where the items above the innermost mark begin.
    #[inline]
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn pop(&mut self, at: u64) -> Result<Item, TraceError> {
        if self.stack.len() <= self.floor() {
            return Err(bad(at, "stack underflow"));
        }
        self.stack.pop().ok_or_else(|| bad(at, "stack underflow"))
    }

    #[inline]
    fn top(&self, at: u64) -> Result<Item, TraceError> {
        match self.stack.last() {
            Some(top) if self.stack.len() > self.floor() => Ok(*top),
            _ => Err(bad(at, "stack underflow")),
        }
    }

    /// Closes the innermost mark; its items are `stack[start..]` until truncated.
    fn pop_mark(&mut self, at: u64) -> Result<usize, TraceError> {
        self.marks.pop().ok_or_else(|| bad(at, "no MARK to pop to"))
    }

    /// A container made of the items above the mark, which closes.
    fn build_from_mark(&mut self, kind: Kind, at: u64) -> Result<(), TraceError> {
        let start = self.pop_mark(at)?;
        let items = self.stack.get(start..).unwrap_or(&[]);
        if kind == Kind::Dict {
            if items.len() % 2 != 0 {
                return Err(bad(at, "odd number of items for DICT"));
            }
            self.check_keys(items, at)?;
        }
        let item = self.doc.add_node(kind, items, at)?;
        self.stack.truncate(start);
        self.stack.push(item);
        Ok(())
    }

    /// The container on top of the stack (below `skip` items), which must be of `kind`.
    fn container(&self, kind: Kind, skip: usize, at: u64) -> Result<usize, TraceError> {
        let floor = self.floor();
        let pos = self
            .stack
            .len()
            .checked_sub(skip + 1)
            .filter(|p| *p >= floor)
            .ok_or_else(|| bad(at, "stack underflow"))?;
        match self.stack.get(pos).map(|i| i.get()) {
            Some(Ref::Node(i)) if self.doc.kind(i) == Some(kind) => Ok(i),
            _ => Err(bad(at, format_args!("stack top is not a {kind:?}"))),
        }
    }

    /// Python refuses unhashable keys; lists and dicts are the unhashable ones here.
    fn check_keys(&self, items: &[Item], at: u64) -> Result<(), TraceError> {
        for key in items.iter().step_by(2) {
            if let Ref::Node(i) = key.get() {
                if self.doc.kind(i).is_some_and(|k| k != Kind::Tuple) {
                    return Err(bad(at, "unhashable dict key (a list or dict)"));
                }
            }
        }
        Ok(())
    }

    /// `APPENDS`/`SETITEMS`: the items above the mark go into the container below it.
    fn extend_from_mark(&mut self, kind: Kind, at: u64) -> Result<(), TraceError> {
        let start = self.pop_mark(at)?;
        let n = self.stack.len().saturating_sub(start);
        if kind == Kind::Dict {
            if n % 2 != 0 {
                return Err(bad(at, "odd number of items for SETITEMS"));
            }
            self.check_keys(self.stack.get(start..).unwrap_or(&[]), at)?;
        }
        // the container is just below the mark
        let target = self.container(kind, n, at)?;
        self.doc
            .extend(target, self.stack.get(start..).unwrap_or(&[]), at)?;
        self.stack.truncate(start);
        Ok(())
    }

    fn memoize(&mut self, id: u32, at: u64) -> Result<(), TraceError> {
        let top = self.top(at)?;
        self.memo.put(id, top);
        Ok(())
    }

    #[inline(always)]
    fn get(&mut self, id: u32, at: u64) -> Result<(), TraceError> {
        let item = self
            .memo
            .get(id)
            .ok_or_else(|| bad(at, format_args!("memo id {id} was never stored")))?;
        self.stack.push(item);
        Ok(())
    }

    /// Memo references come in long runs (a frames list is a hundred of them): the rest
    /// of a run that is in the buffer is taken in one loop here, instead of one opcode
    /// dispatch each, which mispredicts. An opcode cut by the buffer's end is left to the
    /// main loop.
    fn get_run(&mut self) -> Result<(), TraceError> {
        let base = self.src.offset();
        let buf = self.src.buffered();
        let mut i = 0;
        loop {
            let (id, len) = match buf.get(i) {
                Some(&op::BINGET) => match buf.get(i + 1) {
                    Some(&b) => (u32::from(b), 2),
                    None => break,
                },
                Some(&op::LONG_BINGET) => match buf.get(i + 1..i + 5) {
                    Some(&[a, b, c, d]) => (u32::from_le_bytes([a, b, c, d]), 5),
                    _ => break,
                },
                _ => break,
            };
            let item = self.memo.get(id).ok_or_else(|| {
                bad(
                    base + i as u64,
                    format_args!("memo id {id} was never stored"),
                )
            })?;
            self.stack.push(item);
            i += len;
        }
        self.src.consume(i);
        Ok(())
    }

    /// Runs to `STOP`; returns the result and the offset of the `STOP`.
    fn run(&mut self) -> Result<(Item, u64), TraceError> {
        loop {
            let at = self.src.offset();
            let Some(code) = self.src.byte()? else {
                return Err(TraceError::Pickle(format!(
                    "truncated: no STOP opcode in {at} bytes"
                )));
            };
            match code {
                op::BINGET => {
                    let id = u32::from(self.src.u8(at)?);
                    self.get(id, at)?;
                    self.get_run()?;
                }
                op::LONG_BINGET => {
                    let id = u32::from_le_bytes(self.src.array(at)?);
                    self.get(id, at)?;
                    self.get_run()?;
                }
                op::PROTO => {
                    let v = self.src.u8(at)?;
                    if v > 5 {
                        return Err(bad(at, format_args!("unsupported protocol {v}")));
                    }
                }
                op::FRAME => {
                    // framing only groups opcodes for buffered readers; ours is buffered
                    self.src.array::<8>(at)?;
                }
                op::STOP => return Ok((self.pop(at)?, at)),
                op::MARK => {
                    if self.marks.len() >= MAX_OPEN_MARKS {
                        return Err(bad(at, "too many open MARKs"));
                    }
                    self.marks.push(self.stack.len());
                }
                op::POP => {
                    if self.stack.len() <= self.floor() {
                        let start = self.pop_mark(at)?;
                        self.stack.truncate(start);
                    } else {
                        self.pop(at)?;
                    }
                }
                op::POP_MARK => {
                    let start = self.pop_mark(at)?;
                    self.stack.truncate(start);
                }
                op::DUP => {
                    // the same object again, not a copy
                    let top = self.top(at)?;
                    self.stack.push(top);
                }

                op::PUT => {
                    let id = self.memo_id_text(at)?;
                    self.memoize(id, at)?;
                }
                op::BINPUT => {
                    let id = u32::from(self.src.u8(at)?);
                    self.memoize(id, at)?;
                }
                op::LONG_BINPUT => {
                    let id = u32::from_le_bytes(self.src.array(at)?);
                    self.memoize(id, at)?;
                }
                op::MEMOIZE => {
                    let id = u32::try_from(self.memo.len()).map_err(|_| bad(at, "memo is full"))?;
                    self.memoize(id, at)?;
                }
                op::GET => {
                    let id = self.memo_id_text(at)?;
                    self.get(id, at)?;
                }

                op::NONE => self.push_leaf(Scalar::None, at)?,
                op::NEWTRUE => self.push_leaf(Scalar::Bool(true), at)?,
                op::NEWFALSE => self.push_leaf(Scalar::Bool(false), at)?,
                op::INT => {
                    let text = self.text_literal(at)?;
                    // protocol 0 spells booleans as INT 01 / 00
                    let s = match text {
                        "01" => Scalar::Bool(true),
                        "00" => Scalar::Bool(false),
                        t => int_from_text(t)
                            .ok_or_else(|| bad(at, format_args!("bad INT literal {t:?}")))?,
                    };
                    self.push_leaf(s, at)?;
                }
                op::LONG => {
                    let text = self.text_literal(at)?;
                    let s = int_from_text(text)
                        .ok_or_else(|| bad(at, format_args!("bad LONG literal {text:?}")))?;
                    self.push_leaf(s, at)?;
                }
                op::FLOAT => {
                    let text = self.text_literal(at)?;
                    let f = text
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| bad(at, format_args!("bad FLOAT literal {text:?}")))?;
                    self.push_leaf(Scalar::Float(f), at)?;
                }
                op::UNICODE => {
                    // a protocol-0 string may be as long as the input; no literal limit
                    self.src.line(at, usize::MAX, &mut self.scratch)?;
                    let s = raw_unicode_escape(&self.scratch)
                        .ok_or_else(|| bad(at, "bad escape in UNICODE literal"))?;
                    self.push_leaf(Scalar::Str(s.into()), at)?;
                }
                op::BINFLOAT => {
                    let f = f64::from_be_bytes(self.src.array(at)?);
                    self.push_leaf(Scalar::Float(f), at)?;
                }
                op::BININT => {
                    let i = i32::from_le_bytes(self.src.array(at)?);
                    self.push_leaf(Scalar::Int(i.into()), at)?;
                }
                op::BININT1 => {
                    let i = self.src.u8(at)?;
                    self.push_leaf(Scalar::Int(i.into()), at)?;
                }
                op::BININT2 => {
                    let i = u16::from_le_bytes(self.src.array(at)?);
                    self.push_leaf(Scalar::Int(i.into()), at)?;
                }
                op::LONG1 => {
                    let n = usize::from(self.src.u8(at)?);
                    let s = self.src.bytes(n, at, &mut self.scratch, long_from_le)?;
                    self.push_leaf(s, at)?;
                }
                op::LONG4 => {
                    let n = self.len_i32(at)?;
                    let s = self.src.bytes(n, at, &mut self.scratch, long_from_le)?;
                    self.push_leaf(s, at)?;
                }
                op::SHORT_BINUNICODE => {
                    let n = usize::from(self.src.u8(at)?);
                    self.str_arg(n, at)?;
                }
                op::BINUNICODE => {
                    let n = self.len_u32(at)?;
                    self.str_arg(n, at)?;
                }
                op::BINUNICODE8 => {
                    let n = self.len_u64(at)?;
                    self.str_arg(n, at)?;
                }
                // Python 2 `str`, which Python 3 reads as bytes with encoding='bytes'
                op::SHORT_BINBYTES | op::SHORT_BINSTRING => {
                    let n = usize::from(self.src.u8(at)?);
                    let b = self.bytes_arg(n, at)?;
                    self.push_leaf(b, at)?;
                }
                op::BINBYTES => {
                    let n = self.len_u32(at)?;
                    let b = self.bytes_arg(n, at)?;
                    self.push_leaf(b, at)?;
                }
                op::BINSTRING => {
                    let n = self.len_i32(at)?;
                    let b = self.bytes_arg(n, at)?;
                    self.push_leaf(b, at)?;
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = self.len_u64(at)?;
                    let b = self.bytes_arg(n, at)?;
                    self.push_leaf(b, at)?;
                }

                op::EMPTY_TUPLE => self.push_node(Kind::Tuple, &[], at)?,
                op::TUPLE1 => {
                    let a = self.pop(at)?;
                    self.push_node(Kind::Tuple, &[a], at)?;
                }
                op::TUPLE2 => {
                    let b = self.pop(at)?;
                    let a = self.pop(at)?;
                    self.push_node(Kind::Tuple, &[a, b], at)?;
                }
                op::TUPLE3 => {
                    let c = self.pop(at)?;
                    let b = self.pop(at)?;
                    let a = self.pop(at)?;
                    self.push_node(Kind::Tuple, &[a, b, c], at)?;
                }
                op::TUPLE => self.build_from_mark(Kind::Tuple, at)?,
                op::EMPTY_LIST => self.push_node(Kind::List, &[], at)?,
                op::LIST => self.build_from_mark(Kind::List, at)?,
                op::APPEND => {
                    let list = self.container(Kind::List, 1, at)?;
                    let v = self.pop(at)?;
                    self.doc.extend(list, &[v], at)?;
                }
                op::APPENDS => self.extend_from_mark(Kind::List, at)?,
                op::EMPTY_DICT => self.push_node(Kind::Dict, &[], at)?,
                op::DICT => self.build_from_mark(Kind::Dict, at)?,
                op::SETITEM => {
                    let dict = self.container(Kind::Dict, 2, at)?;
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    self.check_keys(&[k], at)?;
                    self.doc.extend(dict, &[k, v], at)?;
                }
                op::SETITEMS => self.extend_from_mark(Kind::Dict, at)?,
                other => {
                    return Err(bad(
                        at,
                        format_args!(
                            "opcode 0x{other:02x} is not plain data and cannot occur \
                             in a memory snapshot"
                        ),
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_from_le_matches_python() {
        let int = |b: &[u8]| match long_from_le(b) {
            Scalar::Int(i) => Some(i128::from(i)),
            Scalar::UInt(u) => Some(i128::from(u)),
            _ => None,
        };
        assert_eq!(int(&[]), Some(0));
        assert_eq!(int(&[0xff]), Some(-1));
        assert_eq!(int(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]), Some(1 << 63));
        assert_eq!(int(&[0xff; 8]), Some(-1));
        let mut wide = vec![0xffu8; 8];
        wide.extend([0; 10]);
        assert_eq!(int(&wide), Some(u64::MAX.into()));
        assert!(matches!(
            long_from_le(&[0, 0, 0, 0, 0, 0, 0, 0, 1]),
            Scalar::HugeInt { negative: false }
        ));
        assert!(matches!(
            long_from_le(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
            Scalar::HugeInt { negative: false }
        ));
        assert!(matches!(
            long_from_le(&[0; 16].iter().copied().chain([0x80]).collect::<Vec<_>>()),
            Scalar::HugeInt { negative: true }
        ));
    }

    #[test]
    fn raw_unicode_escape_decodes() {
        assert_eq!(
            raw_unicode_escape(b"a\\u00e9\\U0001F600\xe9").unwrap(),
            "aé😀é"
        );
        assert!(raw_unicode_escape(b"\\u12").is_none());
        assert!(raw_unicode_escape(b"\\ud800").is_none());
    }

    #[test]
    fn memo_ids_out_of_order_and_far_away() {
        let mut m = Memo::default();
        m.put(1, Item::leaf(1));
        m.put(u32::MAX, Item::leaf(9));
        assert_eq!(m.len(), 2);
        m.put(0, Item::leaf(0));
        assert_eq!(m.dense.len(), 2, "id 1 joined the vector");
        assert_eq!(m.get(1), Some(Item::leaf(1)));
        assert_eq!(m.get(u32::MAX), Some(Item::leaf(9)));
        m.put(0, Item::leaf(5));
        assert_eq!((m.len(), m.get(0)), (3, Some(Item::leaf(5))));
        assert_eq!(m.get(2), None);
    }

    fn run(bytes: &[u8]) -> Result<Doc, TraceError> {
        decode(Source::new(bytes, Default::default())).map(|(doc, _)| doc)
    }

    #[test]
    fn marks_are_positions_and_pops_stay_above_them() {
        // [1, (2, 3)] built with marks, then popped past a mark: underflow
        let doc = run(b"\x80\x04](K\x01(K\x02K\x03te.").unwrap();
        let Ref::Node(root) = doc.root.get() else {
            panic!()
        };
        assert_eq!(doc.items(root).1.len(), 2);
        let err = run(b"\x80\x04K\x01(a.").err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("underflow")));
        // POP with nothing above the mark drops the mark, as CPython does
        assert!(run(b"\x80\x04K\x01(0.").is_ok());
    }
}
