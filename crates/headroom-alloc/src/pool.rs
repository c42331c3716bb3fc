//! A block pool's two ordered sets, as an intrusive treap over the block arena.
//!
//! Design note: PyTorch keeps free blocks in `std::set<Block*>` ordered by (stream, size,
//! address) and searches with `lower_bound`: best fit within a stream, ties to the lowest
//! address. A `BTreeSet` would allocate and free nodes as the set grows and shrinks, so a
//! cache hit could touch the host allocator. The treap's links live inside the blocks
//! themselves, so insert and remove never allocate. Priorities come from a fixed xorshift
//! sequence, which keeps every run bit-for-bit deterministic.

use crate::block::{Arena, BlockId, Membership, NIL};
use crate::event::StreamId;

/// Sort key. The unmapped set orders by (stream, address): its keys carry size 0.
pub type Key = (StreamId, u64, u64);

#[derive(Clone, Copy, Debug)]
pub struct Tree {
    root: BlockId,
    len: usize,
    kind: Membership,
}

impl Tree {
    pub fn new(kind: Membership) -> Self {
        Tree {
            root: NIL,
            len: 0,
            kind,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn key(&self, a: &Arena, id: BlockId) -> Key {
        let b = a.get(id);
        match self.kind {
            Membership::Unmapped => (b.stream, 0, b.ptr),
            _ => (b.stream, b.size, b.ptr),
        }
    }

    /// Split subtree `t` into (< key, >= key).
    fn split(&self, a: &mut Arena, t: BlockId, key: Key) -> (BlockId, BlockId) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.key(a, t) < key {
            let r = a.get(t).right;
            let (l2, r2) = self.split(a, r, key);
            a.get_mut(t).right = l2;
            (t, r2)
        } else {
            let l = a.get(t).left;
            let (l2, r2) = self.split(a, l, key);
            a.get_mut(t).left = r2;
            (l2, t)
        }
    }

    /// Merge two subtrees where every key of `l` is below every key of `r`.
    fn merge(a: &mut Arena, l: BlockId, r: BlockId) -> BlockId {
        if l == NIL {
            return r;
        }
        if r == NIL {
            return l;
        }
        if a.get(l).prio > a.get(r).prio {
            let lr = a.get(l).right;
            let m = Self::merge(a, lr, r);
            a.get_mut(l).right = m;
            l
        } else {
            let rl = a.get(r).left;
            let m = Self::merge(a, l, rl);
            a.get_mut(r).left = m;
            r
        }
    }

    pub fn insert(&mut self, a: &mut Arena, id: BlockId, prio: u32) {
        debug_assert_eq!(a.get(id).member, Membership::None);
        {
            let b = a.get_mut(id);
            b.left = NIL;
            b.right = NIL;
            b.prio = prio;
            b.member = self.kind;
        }
        let key = self.key(a, id);
        // Descend while the path's priorities beat ours, then split there: one pass, no rotations.
        let mut parent = NIL;
        let mut went_left = false;
        let mut cur = self.root;
        while cur != NIL && a.get(cur).prio > prio {
            parent = cur;
            went_left = key < self.key(a, cur);
            cur = if went_left {
                a.get(cur).left
            } else {
                a.get(cur).right
            };
        }
        let (l, r) = self.split(a, cur, key);
        {
            let b = a.get_mut(id);
            b.left = l;
            b.right = r;
        }
        if parent == NIL {
            self.root = id;
        } else if went_left {
            a.get_mut(parent).left = id;
        } else {
            a.get_mut(parent).right = id;
        }
        self.len += 1;
    }

    pub fn remove(&mut self, a: &mut Arena, id: BlockId) {
        debug_assert_eq!(a.get(id).member, self.kind);
        let key = self.key(a, id);
        let mut parent = NIL;
        let mut went_left = false;
        let mut cur = self.root;
        while cur != id {
            debug_assert!(cur != NIL, "block not in tree");
            if cur == NIL {
                return;
            }
            parent = cur;
            went_left = key < self.key(a, cur);
            cur = if went_left {
                a.get(cur).left
            } else {
                a.get(cur).right
            };
        }
        let (l, r) = (a.get(id).left, a.get(id).right);
        let m = Self::merge(a, l, r);
        if parent == NIL {
            self.root = m;
        } else if went_left {
            a.get_mut(parent).left = m;
        } else {
            a.get_mut(parent).right = m;
        }
        let b = a.get_mut(id);
        b.left = NIL;
        b.right = NIL;
        b.member = Membership::None;
        self.len -= 1;
    }

    /// Smallest element whose key satisfies `pred`, which must be false then true in key
    /// order (a monotone split), as every bound query here is.
    #[inline]
    fn first_where(&self, a: &Arena, pred: impl Fn(Key) -> bool) -> Option<BlockId> {
        let mut best = NIL;
        let mut cur = self.root;
        while cur != NIL {
            if pred(self.key(a, cur)) {
                best = cur;
                cur = a.get(cur).left;
            } else {
                cur = a.get(cur).right;
            }
        }
        (best != NIL).then_some(best)
    }

    /// Largest element whose key satisfies `pred` (true then false in key order).
    fn last_where(&self, a: &Arena, pred: impl Fn(Key) -> bool) -> Option<BlockId> {
        let mut best = NIL;
        let mut cur = self.root;
        while cur != NIL {
            if pred(self.key(a, cur)) {
                best = cur;
                cur = a.get(cur).right;
            } else {
                cur = a.get(cur).left;
            }
        }
        (best != NIL).then_some(best)
    }

    /// Smallest element with key >= `key`.
    #[inline]
    pub fn lower_bound(&self, a: &Arena, key: Key) -> Option<BlockId> {
        self.first_where(a, |k| k >= key)
    }

    /// Smallest element with key > that of `id`.
    pub fn successor(&self, a: &Arena, id: BlockId) -> Option<BlockId> {
        let key = self.key(a, id);
        self.first_where(a, |k| k > key)
    }

    /// Largest element with key < `key`.
    pub fn predecessor_of_key(&self, a: &Arena, key: Key) -> Option<BlockId> {
        self.last_where(a, |k| k < key)
    }

    pub fn predecessor(&self, a: &Arena, id: BlockId) -> Option<BlockId> {
        self.predecessor_of_key(a, self.key(a, id))
    }

    pub fn last(&self, a: &Arena) -> Option<BlockId> {
        let mut cur = self.root;
        if cur == NIL {
            return None;
        }
        while a.get(cur).right != NIL {
            cur = a.get(cur).right;
        }
        Some(cur)
    }

    /// In-order ids. Allocates; for release paths and checks, never the hot path.
    pub fn to_vec(self, a: &Arena) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.len);
        let mut stack = Vec::new();
        let mut cur = self.root;
        while cur != NIL || !stack.is_empty() {
            while cur != NIL {
                stack.push(cur);
                cur = a.get(cur).left;
            }
            if let Some(n) = stack.pop() {
                out.push(n);
                cur = a.get(n).right;
            }
        }
        out
    }
}

/// One of a device's block pools: free blocks and unmapped expandable ranges.
pub struct BlockPool {
    pub blocks: Tree,
    pub unmapped: Tree,
    /// GC clock: ticks on every cache search while GC is enabled.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    pub fn new() -> Self {
        BlockPool {
            blocks: Tree::new(Membership::Blocks),
            unmapped: Tree::new(Membership::Unmapped),
            get_free_blocks_call_count: 0,
        }
    }
}

/// xorshift32: the treap's priority sequence.
#[derive(Clone, Copy, Debug)]
pub struct Prio(u32);

impl Default for Prio {
    fn default() -> Self {
        Prio(0x9E37_79B9)
    }
}

impl Prio {
    #[inline]
    pub fn next(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::PoolKind;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn treap_matches_btreeset(ops in proptest::collection::vec((0u64..4, 0u64..64, any::<bool>()), 1..300)) {
            let mut a = Arena::default();
            let mut t = Tree::new(Membership::Blocks);
            let mut model: BTreeSet<(u64, u64, u64)> = BTreeSet::new();
            let mut ids = std::collections::HashMap::new();
            let mut prio = Prio::default();
            for (i, (stream, size, ins)) in ops.into_iter().enumerate() {
                let key = (stream, size * 512, i as u64);
                if ins || model.is_empty() {
                    let id = a.alloc(key.2, key.1, key.0, PoolKind::Large);
                    t.insert(&mut a, id, prio.next());
                    model.insert(key);
                    ids.insert(key, id);
                } else {
                    let k = *model.iter().nth(i % model.len()).unwrap();
                    model.remove(&k);
                    let id = ids.remove(&k).unwrap();
                    t.remove(&mut a, id);
                    a.release(id);
                }
                prop_assert_eq!(t.len(), model.len());
                let probe = (stream, size * 512, 0);
                let got = t.lower_bound(&a, probe).map(|id| { let b = a.get(id); (b.stream, b.size, b.ptr) });
                prop_assert_eq!(got, model.range(probe..).next().copied());
                let inorder: Vec<_> = t.to_vec(&a).into_iter().map(|id| { let b = a.get(id); (b.stream, b.size, b.ptr) }).collect();
                prop_assert_eq!(inorder, model.iter().copied().collect::<Vec<_>>());
                if let Some(first) = t.lower_bound(&a, (0, 0, 0)) {
                    let succ = t.successor(&a, first).map(|id| { let b = a.get(id); (b.stream, b.size, b.ptr) });
                    prop_assert_eq!(succ, model.iter().nth(1).copied());
                }
                let pred = t.predecessor_of_key(&a, probe).map(|id| { let b = a.get(id); (b.stream, b.size, b.ptr) });
                prop_assert_eq!(pred, model.range(..probe).next_back().copied());
            }
        }
    }
}
