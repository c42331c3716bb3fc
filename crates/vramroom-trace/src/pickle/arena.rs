//! What the decoder builds: an arena of scalars and containers that refer to each other
//! by index, and the check that it has no cycle and a bounded depth.
//!
//! Design note: the arena is the only thing held for the whole input, so its size is the
//! reader's peak memory. A real snapshot is millions of references to a few hundred
//! shared frame dicts; each reference is one [`Item`], a `u32` whose top bit tells a
//! container from a scalar (half the size of a pointer, a quarter of a tagged enum), and
//! 64-bit integers, most of a snapshot's scalars, are kept in 8 bytes each.
//! A memo reference is the same index again, exactly as Python's unpickler pushes the same
//! object again, so sharing costs nothing while decoding; the converter then builds each
//! shared part once (see `convert.rs`). All containers keep their items in one vector,
//! each in one run, and scalars are at most 24 bytes (`Box<str>`, 64-bit integers; wider
//! integers keep only their sign, and bytes only their presence: all the schema needs to
//! reject them).
//!
//! The arena lives until the snapshot is built. Freeing each frames list's items once it
//! is converted, which per-container vectors would allow, was weighed and measured: for
//! the 8.6 MB `hf_bert_varlen_infer` recording the heap peaks at 17.9 MB (massif), of
//! which the built snapshot is 2.8 MB and the arena the rest, so freeing could save at
//! most those 2.8 MB, while one vector per container costs more than that in headers and
//! allocator overhead (and an allocation and a free for each of 43,000 containers).
//!
//! The converter follows the snapshot schema and never recurses into anything else, so
//! structure is checked once here instead of on every walk: nesting deeper than
//! [`MAX_DEPTH`] or a container inside itself is refused, wherever it is in the document.

use std::cell::Cell;

use super::source::bad;
use super::MAX_DEPTH;
use crate::error::TraceError;

/// A scalar as Python would hold it.
#[derive(Debug)]
pub(super) enum Scalar {
    None,
    Bool(bool),
    Int(i64),
    /// An integer in (i64::MAX, u64::MAX].
    UInt(u64),
    /// An integer beyond 64 bits; only its sign is kept.
    HugeInt {
        negative: bool,
    },
    Float(f64),
    Str(Box<str>),
    /// Python `bytes`; no snapshot field holds bytes, so only their presence is kept.
    Bytes,
}

impl Scalar {
    /// An integer of any width, classified by the range it fits.
    pub(super) fn int(v: i128) -> Scalar {
        if let Ok(i) = i64::try_from(v) {
            Scalar::Int(i)
        } else if let Ok(u) = u64::try_from(v) {
            Scalar::UInt(u)
        } else {
            Scalar::HugeInt { negative: v < 0 }
        }
    }
}

/// A scalar as the converter sees it, wherever it is stored.
#[derive(Clone, Copy, Debug)]
pub(super) enum Val<'d> {
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    HugeInt { negative: bool },
    Float(f64),
    Str(&'d str),
    Bytes,
}

/// A slot on the stack, in a container or in the memo: a container index with the top
/// bit set; else, with the next bit set, the index of a 64-bit integer (most scalars of a
/// snapshot are integers, and they are kept in 8 bytes); else a scalar index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Item(u32);

/// What an [`Item`] refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ref {
    Leaf(usize),
    Int(usize),
    Node(usize),
}

const NODE_BIT: u32 = 1 << 31;
const INT_BIT: u32 = 1 << 30;

/// Most containers one arena holds.
pub(super) const MAX_NODES: usize = NODE_BIT as usize;
/// Most integers, and most other scalars, one arena holds (each).
pub(super) const MAX_LEAVES: usize = INT_BIT as usize;

impl Item {
    /// Only for indices below [`MAX_LEAVES`]; the arena checks before it hands one out.
    pub(super) fn leaf(i: usize) -> Item {
        Item(i as u32 & !(NODE_BIT | INT_BIT))
    }
    fn int(i: usize) -> Item {
        Item((i as u32 & !NODE_BIT) | INT_BIT)
    }
    /// Only for indices below [`MAX_NODES`].
    pub(super) fn node(i: usize) -> Item {
        Item(i as u32 | NODE_BIT)
    }
    #[inline]
    pub(super) fn get(self) -> Ref {
        if self.0 & NODE_BIT != 0 {
            Ref::Node((self.0 & !NODE_BIT) as usize)
        } else if self.0 & INT_BIT != 0 {
            Ref::Int((self.0 & !INT_BIT) as usize)
        } else {
            Ref::Leaf(self.0 as usize)
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    List,
    Tuple,
    Dict,
}

/// No converted value yet (see [`Node::slot`]).
pub(super) const NO_SLOT: u32 = u32::MAX;

/// A container: a run of [`Doc::items`] (for a dict: key, value, key, value, …).
pub(super) struct Node {
    start: u64,
    len: u32,
    /// Items reserved at `start`; beyond `len` they are unused.
    cap: u32,
    /// The converter's memo: the index of what this container became (a frame or a
    /// stack), so a shared container is converted once.
    pub(super) slot: Cell<u32>,
    pub(super) kind: Kind,
    /// 1 + the height of its tallest container item, while that is known (see
    /// [`Doc::check_shape`]).
    height: u8,
    /// Whether it is an item of some container.
    placed: bool,
}

/// A decoded pickle, and the decoder's builder of one.
pub(super) struct Doc {
    leaves: Vec<Scalar>,
    ints: Vec<i64>,
    nodes: Vec<Node>,
    /// The items of every container, each container's in one run: one allocation instead
    /// of one per container (tens of thousands of small dicts in a real snapshot).
    items: Vec<Item>,
    pub(super) root: Item,
    /// A container got items after it was itself placed in another, so heights are only
    /// lower bounds and a cycle is possible: the full walk must run.
    dirty: bool,
}

static NONE: Scalar = Scalar::None;

fn too_deep(at: u64) -> TraceError {
    bad(at, format_args!("nested deeper than {MAX_DEPTH} levels"))
}

impl Doc {
    pub(super) fn new() -> Doc {
        Doc {
            leaves: Vec::new(),
            ints: Vec::new(),
            nodes: Vec::new(),
            items: Vec::new(),
            root: Item::leaf(0),
            dirty: false,
        }
    }

    /// The scalar `item` is; `None` for a container.
    pub(super) fn val(&self, item: Item) -> Option<Val<'_>> {
        // indices come from the arena, never from the input; the defaults are unreachable
        Some(match item.get() {
            Ref::Node(_) => return None,
            Ref::Int(i) => Val::Int(self.ints.get(i).copied().unwrap_or(0)),
            Ref::Leaf(i) => match self.leaves.get(i).unwrap_or(&NONE) {
                Scalar::None => Val::None,
                Scalar::Bool(b) => Val::Bool(*b),
                Scalar::Int(i) => Val::Int(*i),
                Scalar::UInt(u) => Val::UInt(*u),
                Scalar::HugeInt { negative } => Val::HugeInt {
                    negative: *negative,
                },
                Scalar::Float(f) => Val::Float(*f),
                Scalar::Str(s) => Val::Str(s),
                Scalar::Bytes => Val::Bytes,
            },
        })
    }

    pub(super) fn node(&self, i: usize) -> Option<&Node> {
        self.nodes.get(i)
    }

    pub(super) fn kind(&self, i: usize) -> Option<Kind> {
        self.nodes.get(i).map(|n| n.kind)
    }

    #[inline]
    pub(super) fn items(&self, i: usize) -> (Kind, &[Item]) {
        match self.nodes.get(i) {
            Some(n) => {
                let start = n.start as usize;
                let run = self.items.get(start..start + n.len as usize);
                (n.kind, run.unwrap_or(&[]))
            }
            None => (Kind::Tuple, &[]),
        }
    }

    /// Adds a scalar; `None` when the arena holds [`MAX_LEAVES`] of its kind.
    pub(super) fn add_leaf(&mut self, s: Scalar) -> Option<Item> {
        if let Scalar::Int(v) = s {
            let i = self.ints.len();
            return (i < MAX_LEAVES).then(|| {
                self.ints.push(v);
                Item::int(i)
            });
        }
        let i = self.leaves.len();
        (i < MAX_LEAVES).then(|| {
            self.leaves.push(s);
            Item::leaf(i)
        })
    }

    /// Adds a container holding `items`; `at` is the opcode's offset, for errors.
    pub(super) fn add_node(
        &mut self,
        kind: Kind,
        items: &[Item],
        at: u64,
    ) -> Result<Item, TraceError> {
        let i = self.nodes.len();
        if i >= MAX_NODES {
            return Err(bad(at, "more than 2^31 containers"));
        }
        self.nodes.push(Node {
            start: self.items.len() as u64,
            len: 0,
            cap: 0,
            slot: Cell::new(NO_SLOT),
            kind,
            height: 1,
            placed: false,
        });
        self.extend(i, items, at)?;
        Ok(Item::node(i))
    }

    /// Appends `new` to container `i`, keeping its items in one run: in place when it
    /// has room or ends the arena, else moved to the end with room to double, so a
    /// container filled in many interleaved batches still costs linear time and space.
    pub(super) fn extend(&mut self, i: usize, new: &[Item], at: u64) -> Result<(), TraceError> {
        if new.is_empty() {
            return Ok(());
        }
        let Some(node) = self.nodes.get(i) else {
            return Err(bad(at, "dangling container"));
        };
        let (start, len, cap) = (node.start as usize, node.len as usize, node.cap as usize);
        let total = len + new.len();
        let total32 =
            u32::try_from(total).map_err(|_| bad(at, "a container of over 2^32 items"))?;
        if total <= cap {
            if let Some(dst) = self.items.get_mut(start + len..start + total) {
                dst.copy_from_slice(new);
            }
        } else if start + cap == self.items.len() {
            // the last run: grow it where it is, exactly
            self.items.truncate(start + len);
            self.items.extend_from_slice(new);
        } else {
            let new_start = self.items.len();
            let room = total.max(2 * cap).min(u32::MAX as usize);
            self.items.extend_from_within(start..start + len);
            self.items.extend_from_slice(new);
            self.items.resize(new_start + room, Item::leaf(0));
            if let Some(n) = self.nodes.get_mut(i) {
                n.start = new_start as u64;
                n.cap = room as u32;
            }
        }
        self.adopt(i, new, at)?;
        if let Some(n) = self.nodes.get_mut(i) {
            n.len = total32;
            n.cap = n.cap.max(total32);
        }
        Ok(())
    }

    /// Bookkeeping for the shape check when `new` become items of container `p`.
    fn adopt(&mut self, p: usize, new: &[Item], at: u64) -> Result<(), TraceError> {
        let mut height = 1u8;
        for item in new {
            if let Ref::Node(c) = item.get() {
                if c == p {
                    return Err(bad(at, "recursive structure"));
                }
                if let Some(child) = self.nodes.get_mut(c) {
                    child.placed = true;
                    height = height.max(child.height.saturating_add(1));
                }
            }
        }
        let Some(parent) = self.nodes.get_mut(p) else {
            return Ok(());
        };
        self.dirty |= parent.placed;
        parent.height = parent.height.max(height);
        // heights never overstate, so too tall is too deep even when they are stale
        if usize::from(parent.height) > MAX_DEPTH {
            return Err(too_deep(at));
        }
        Ok(())
    }

    /// Refuses nesting deeper than [`MAX_DEPTH`] and containers that contain themselves;
    /// `at` is the offset of `STOP`, for the message.
    ///
    /// Heights are kept as containers fill, and they are exact as long as no container
    /// gets items after it was placed in another: then each child was complete when its
    /// parent took it, and no cycle can form except a container holding itself, refused
    /// on the spot. Pythons's pickler always writes that way, so real snapshots cost
    /// nothing here. Otherwise the arena is walked: iteratively, each container once
    /// however often it is shared, so linear in the arena.
    pub(super) fn check_shape(&self, at: u64) -> Result<(), TraceError> {
        if !self.dirty {
            return Ok(());
        }
        let Ref::Node(root) = self.root.get() else {
            return Ok(());
        };
        // per container: 0 new, OPEN on the current path, else its height (1..=MAX_DEPTH)
        const OPEN: u8 = u8::MAX;
        const _: () = assert!(MAX_DEPTH < OPEN as usize);
        let mut state = vec![0u8; self.nodes.len()];
        // (container, next item, height of its tallest child so far)
        let mut path: Vec<(usize, usize, u8)> = vec![(root, 0, 0)];
        if let Some(s) = state.get_mut(root) {
            *s = OPEN;
        }
        while let Some(top) = path.last_mut() {
            let (node, next, _) = *top;
            match self.items(node).1.get(next).map(|i| i.get()) {
                Some(Ref::Leaf(_) | Ref::Int(_)) => top.1 += 1,
                Some(Ref::Node(j)) => {
                    top.1 += 1;
                    match state.get(j).copied() {
                        Some(0) => {
                            // the root is at least as tall as the open path is long
                            if path.len() >= MAX_DEPTH {
                                return Err(too_deep(at));
                            }
                            if let Some(s) = state.get_mut(j) {
                                *s = OPEN;
                            }
                            path.push((j, 0, 0));
                        }
                        Some(OPEN) => return Err(bad(at, "recursive structure")),
                        Some(h) => top.2 = top.2.max(h),
                        None => return Err(bad(at, "dangling container")),
                    }
                }
                None => {
                    let Some((done, _, tallest)) = path.pop() else {
                        break;
                    };
                    let height = tallest + 1;
                    if usize::from(height) > MAX_DEPTH {
                        return Err(too_deep(at));
                    }
                    if let Some(s) = state.get_mut(done) {
                        *s = height;
                    }
                    if let Some(parent) = path.last_mut() {
                        parent.2 = parent.2.max(height);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_four_bytes_and_nodes_are_small() {
        assert_eq!(std::mem::size_of::<Item>(), 4);
        assert_eq!(std::mem::size_of::<Node>(), 24);
        assert_eq!(std::mem::size_of::<Scalar>(), 24);
        assert_eq!(Item::node(5).get(), Ref::Node(5));
        assert_eq!(Item::leaf(5).get(), Ref::Leaf(5));
        assert_eq!(Item::int(5).get(), Ref::Int(5));
        assert_eq!(Item::node(MAX_NODES - 1).get(), Ref::Node(MAX_NODES - 1));
        assert_eq!(Item::int(MAX_LEAVES - 1).get(), Ref::Int(MAX_LEAVES - 1));
        assert_eq!(Item::leaf(MAX_LEAVES - 1).get(), Ref::Leaf(MAX_LEAVES - 1));
        let mut doc = Doc::new();
        let i = doc.add_leaf(Scalar::Int(-7)).unwrap();
        let s = doc.add_leaf(Scalar::Str("x".into())).unwrap();
        assert!(matches!(doc.val(i), Some(Val::Int(-7))));
        assert!(matches!(doc.val(s), Some(Val::Str("x"))));
        assert_eq!(doc.ints.len(), 1);
    }

    #[test]
    fn integers_are_classified_by_range() {
        assert!(matches!(Scalar::int(-1), Scalar::Int(-1)));
        assert!(matches!(Scalar::int(1 << 63), Scalar::UInt(u) if u == 1 << 63));
        assert!(matches!(
            Scalar::int(1 << 64),
            Scalar::HugeInt { negative: false }
        ));
        assert!(matches!(
            Scalar::int(i128::from(i64::MIN) - 1),
            Scalar::HugeInt { negative: true }
        ));
    }

    fn leaves(doc: &mut Doc, n: usize) -> Vec<Item> {
        (0..n)
            .map(|i| doc.add_leaf(Scalar::Int(i as i64)).unwrap())
            .collect()
    }

    #[test]
    fn interleaved_batches_keep_runs_whole_and_space_linear() {
        let mut doc = Doc::new();
        let a = doc.add_node(Kind::List, &[], 0).unwrap();
        let b = doc.add_node(Kind::List, &[], 0).unwrap();
        let (Ref::Node(a), Ref::Node(b)) = (a.get(), b.get()) else {
            panic!()
        };
        let xs = leaves(&mut doc, 3);
        for round in 0..1000 {
            doc.extend(a, &xs[..1 + round % 3], 0).unwrap();
            doc.extend(b, &xs[..1], 0).unwrap();
        }
        assert_eq!(doc.items(a).1.len(), 1999);
        assert_eq!(doc.items(b).1.len(), 1000);
        assert_eq!(
            doc.items(a).1[..6],
            [xs[0], xs[0], xs[1], xs[0], xs[1], xs[2]]
        );
        assert!(doc.items.len() < 4 * 2999, "{} items kept", doc.items.len());
    }

    #[test]
    fn shared_is_fine_recursive_and_deep_are_not() {
        // [[x], [x]] with the inner list shared
        let mut doc = Doc::new();
        let x = leaves(&mut doc, 1);
        let inner = doc.add_node(Kind::List, &x, 0).unwrap();
        doc.root = doc.add_node(Kind::List, &[inner, inner], 0).unwrap();
        doc.check_shape(0).unwrap();

        // a list holding itself, refused as it is built
        let mut doc = Doc::new();
        let l = doc.add_node(Kind::List, &[], 0).unwrap();
        let Ref::Node(li) = l.get() else { panic!() };
        let err = doc.extend(li, &[l], 0).unwrap_err();
        assert!(err.to_string().contains("recursive"), "{err}");

        // a cycle through a container filled after it was placed: found by the walk
        let mut doc = Doc::new();
        let a = doc.add_node(Kind::List, &[], 0).unwrap();
        let b = doc.add_node(Kind::List, &[a], 0).unwrap();
        let Ref::Node(ai) = a.get() else { panic!() };
        doc.extend(ai, &[b], 0).unwrap();
        doc.root = b;
        assert!(doc.dirty);
        let err = doc.check_shape(0).unwrap_err();
        assert!(err.to_string().contains("recursive"), "{err}");

        // too deep, refused as it is built
        let mut doc = Doc::new();
        let mut top = doc.add_node(Kind::List, &[], 0).unwrap();
        let mut err = None;
        for _ in 0..MAX_DEPTH {
            match doc.add_node(Kind::List, &[top], 0) {
                Ok(t) => top = t,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        assert!(err.unwrap().to_string().contains("nested deeper"));

        // too deep behind a late fill: found by the walk
        let mut doc = Doc::new();
        let bottom = doc.add_node(Kind::List, &[], 0).unwrap();
        let mut top = doc.add_node(Kind::List, &[bottom], 0).unwrap();
        for _ in 0..MAX_DEPTH / 2 {
            top = doc.add_node(Kind::List, &[top], 0).unwrap();
        }
        let mut deep = doc.add_node(Kind::List, &[], 0).unwrap();
        for _ in 0..MAX_DEPTH / 2 + 2 {
            deep = doc.add_node(Kind::List, &[deep], 0).unwrap();
        }
        let Ref::Node(bi) = bottom.get() else {
            panic!()
        };
        doc.extend(bi, &[deep], 0).unwrap();
        doc.root = top;
        let err = doc.check_shape(0).unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
    }
}
