//! A block pool's two ordered sets, as an intrusive treap over the block arena.
//!
//! Design note: PyTorch keeps free blocks in `std::set<Block*>` ordered by (stream, size,
//! address) and searches with `lower_bound`: best fit within a stream, ties to the lowest
//! address. A `BTreeSet` would allocate and free nodes as the set grows and shrinks, so a
//! cache hit could touch the host allocator. The treap's links live inside the blocks
//! themselves, so insert and remove never allocate. Each arena slot draws its priority once
//! from a fixed xorshift sequence, which keeps every run bit-for-bit deterministic (the
//! tree's shape is never observable anyway: only its in-order sequence is). Parent links
//! make `remove` start at the block itself, as erasing through a `std::set` iterator does,
//! instead of searching for it from the root; insert, split and merge are loops, not
//! recursion.
//!
//! Which way a search turns at each block is as good as a coin toss, so a branch there
//! mispredicts about every other level. The children are an array indexed by side, and the
//! descents (`lower_bound` and the other bound queries, and insert's walk down to its
//! place) compute each key comparison without branching (`key_lt`) and pick the side as
//! data, not as a jump: in the mixed-size benchmarks this halves the mispredicted branches.
//! Split and merge walk only short spines and keep plain branches, which cost less there
//! (fully branch-free versions made the single-size pair slower).

use crate::block::{Arena, BlockId, Membership, NIL};
use crate::event::StreamId;

/// Sort key. The unmapped set orders by (stream, address): its keys carry size 0.
pub type Key = (StreamId, u64, u64);

/// Index into `Block::kids`.
const LEFT: usize = 0;
const RIGHT: usize = 1;

/// `a < b` in (stream, size, address) order, computed without branches.
#[inline(always)]
fn key_lt(a: Key, b: Key) -> bool {
    (a.0 < b.0) | ((a.0 == b.0) & ((a.1 < b.1) | ((a.1 == b.1) & (a.2 < b.2))))
}

/// `if c { x } else { y }` for ids, without a branch.
#[inline(always)]
fn pick(c: bool, x: BlockId, y: BlockId) -> BlockId {
    y ^ ((x ^ y) & (c as BlockId).wrapping_neg())
}

#[derive(Clone, Copy, Debug)]
pub struct Tree {
    root: BlockId,
    kind: Membership,
    /// `!0` for the blocks set, `0` for the unmapped set: the key's size is `size & mask`,
    /// so computing a key needs no branch on the set's kind.
    size_mask: u64,
}

impl Tree {
    pub fn new(kind: Membership) -> Self {
        Tree {
            root: NIL,
            kind,
            size_mask: if kind == Membership::Unmapped { 0 } else { !0 },
        }
    }

    /// Number of blocks in the set: O(n), for checks (the hot path keeps no count).
    pub fn len(&self, a: &Arena) -> usize {
        self.to_vec(a).len()
    }

    #[inline(always)]
    fn key(&self, a: &Arena, id: BlockId) -> Key {
        let b = a.get(id);
        (b.stream, b.size & self.size_mask, b.ptr)
    }

    #[inline(always)]
    pub fn insert(&mut self, a: &mut Arena, id: BlockId) {
        debug_assert_eq!(a.get(id).member, Membership::None);
        let prio = {
            let b = a.get_mut(id);
            b.member = self.kind;
            b.prio
        };
        let key = self.key(a, id);
        // Descend while the path's priorities beat ours, then split there: one pass, no
        // rotations.
        let mut parent = NIL;
        let mut side = LEFT;
        let mut cur = self.root;
        while cur != NIL && a.get(cur).prio > prio {
            parent = cur;
            side = !key_lt(key, self.key(a, cur)) as usize;
            cur = a.get(cur).kids[side];
        }
        let (l, r) = self.split(a, cur, key);
        {
            let b = a.get_mut(id);
            b.kids = [l, r];
        }
        if l != NIL {
            a.get_mut(l).parent = id;
        }
        if r != NIL {
            a.get_mut(r).parent = id;
        }
        Self::hang(a, &mut self.root, parent, side, id);
    }

    /// Split subtree `t` into (< key, >= key); the parts' roots get parent `NIL`. The spines
    /// split here are short, so plain branches serve better than the descent's selects.
    #[inline(always)]
    fn split(&self, a: &mut Arena, mut t: BlockId, key: Key) -> (BlockId, BlockId) {
        // `l_tail` is the node of the left part whose right child comes next, `r_tail` the
        // node of the right part whose left child comes next.
        let (mut l_root, mut r_root) = (NIL, NIL);
        let (mut l_tail, mut r_tail) = (NIL, NIL);
        while t != NIL {
            if key_lt(self.key(a, t), key) {
                if l_tail == NIL {
                    l_root = t;
                    a.get_mut(t).parent = NIL;
                } else {
                    a.get_mut(l_tail).kids[RIGHT] = t;
                    a.get_mut(t).parent = l_tail;
                }
                l_tail = t;
                t = a.get(t).kids[RIGHT];
            } else {
                if r_tail == NIL {
                    r_root = t;
                    a.get_mut(t).parent = NIL;
                } else {
                    a.get_mut(r_tail).kids[LEFT] = t;
                    a.get_mut(t).parent = r_tail;
                }
                r_tail = t;
                t = a.get(t).kids[LEFT];
            }
        }
        if l_tail != NIL {
            a.get_mut(l_tail).kids[RIGHT] = NIL;
        }
        if r_tail != NIL {
            a.get_mut(r_tail).kids[LEFT] = NIL;
        }
        (l_root, r_root)
    }

    /// Merge two subtrees where every key of `l` is below every key of `r`; the result's
    /// root gets parent `NIL`.
    #[inline(always)]
    fn merge(a: &mut Arena, mut l: BlockId, mut r: BlockId) -> BlockId {
        // Built top-down: each step places the higher-priority of the two roots under
        // `hook` and continues down that root's inner spine (an `l` root's right side, an
        // `r` root's left side).
        let mut root = NIL;
        let mut hook = NIL;
        let mut side = LEFT;
        loop {
            if l == NIL || r == NIL {
                let x = if l == NIL { r } else { l };
                Self::hang(a, &mut root, hook, side, x);
                return root;
            }
            if a.get(l).prio > a.get(r).prio {
                let x = l;
                Self::hang(a, &mut root, hook, side, x);
                l = a.get(x).kids[RIGHT];
                hook = x;
                side = RIGHT;
            } else {
                let x = r;
                Self::hang(a, &mut root, hook, side, x);
                r = a.get(x).kids[LEFT];
                hook = x;
                side = LEFT;
            }
        }
    }

    /// `x` (maybe `NIL`) as child `side` of `hook`, or as `root` if `hook` is `NIL`; `x`'s
    /// parent becomes `hook`.
    #[inline(always)]
    fn hang(a: &mut Arena, root: &mut BlockId, hook: BlockId, side: usize, x: BlockId) {
        if hook == NIL {
            *root = x;
        } else {
            a.get_mut(hook).kids[side & 1] = x;
        }
        if x != NIL {
            a.get_mut(x).parent = hook;
        }
    }

    #[inline(always)]
    pub fn remove(&mut self, a: &mut Arena, id: BlockId) {
        debug_assert_eq!(a.get(id).member, self.kind);
        let (kids, parent) = {
            let b = a.get(id);
            (b.kids, b.parent)
        };
        let m = Self::merge(a, kids[LEFT], kids[RIGHT]);
        if m != NIL {
            a.get_mut(m).parent = parent;
        }
        if parent == NIL {
            debug_assert_eq!(self.root, id);
            self.root = m;
        } else {
            let side = (a.get(parent).kids[RIGHT] == id) as usize;
            a.get_mut(parent).kids[side] = m;
        }
        // The removed block's own links are left stale: only members' links are ever
        // read, and `insert` rewrites all three.
        a.get_mut(id).member = Membership::None;
    }

    /// Smallest element whose key satisfies `pred`, which must be false then true in key
    /// order (a monotone split), as every bound query here is.
    #[inline(always)]
    fn first_where(&self, a: &Arena, pred: impl Fn(Key) -> bool) -> Option<BlockId> {
        let mut best = NIL;
        let mut cur = self.root;
        while cur != NIL {
            let p = pred(self.key(a, cur));
            best = pick(p, cur, best);
            cur = a.get(cur).kids[!p as usize];
        }
        (best != NIL).then_some(best)
    }

    /// Largest element whose key satisfies `pred` (true then false in key order).
    fn last_where(&self, a: &Arena, pred: impl Fn(Key) -> bool) -> Option<BlockId> {
        let mut best = NIL;
        let mut cur = self.root;
        while cur != NIL {
            let p = pred(self.key(a, cur));
            best = pick(p, cur, best);
            cur = a.get(cur).kids[p as usize];
        }
        (best != NIL).then_some(best)
    }

    /// Smallest element with key >= `key`.
    #[inline(always)]
    pub fn lower_bound(&self, a: &Arena, key: Key) -> Option<BlockId> {
        self.first_where(a, |k| !key_lt(k, key))
    }

    /// Smallest element with key > that of `id`.
    pub fn successor(&self, a: &Arena, id: BlockId) -> Option<BlockId> {
        let key = self.key(a, id);
        self.first_where(a, |k| key_lt(key, k))
    }

    /// Largest element with key < `key`.
    pub fn predecessor_of_key(&self, a: &Arena, key: Key) -> Option<BlockId> {
        self.last_where(a, |k| key_lt(k, key))
    }

    pub fn predecessor(&self, a: &Arena, id: BlockId) -> Option<BlockId> {
        self.predecessor_of_key(a, self.key(a, id))
    }

    pub fn last(&self, a: &Arena) -> Option<BlockId> {
        let mut cur = self.root;
        if cur == NIL {
            return None;
        }
        while a.get(cur).kids[RIGHT] != NIL {
            cur = a.get(cur).kids[RIGHT];
        }
        Some(cur)
    }

    /// Every structural property of the treap, recomputed: links are symmetric, the root has
    /// no parent, priorities are heap-ordered, keys strictly increase in order, every node is
    /// a member of this set. For invariant checks; O(n).
    pub fn check(&self, a: &Arena) -> Result<(), String> {
        if self.root != NIL && a.get(self.root).parent != NIL {
            return Err(format!(
                "{:?} tree: root {} has a parent",
                self.kind, self.root
            ));
        }
        let ids = self.to_vec(a);
        for w in ids.windows(2) {
            if self.key(a, w[0]) >= self.key(a, w[1]) {
                return Err(format!("{:?} tree: keys out of order", self.kind));
            }
        }
        for &id in &ids {
            let b = a.get(id);
            if b.member != self.kind {
                return Err(format!(
                    "{:?} tree: block {id} is {:?}",
                    self.kind, b.member
                ));
            }
            for c in b.kids {
                if c != NIL && (a.get(c).parent != id || a.get(c).prio > b.prio) {
                    return Err(format!("{:?} tree: bad link {id} -> {c}", self.kind));
                }
            }
        }
        Ok(())
    }

    /// In-order ids. Allocates; for release paths and checks, never the hot path.
    pub fn to_vec(self, a: &Arena) -> Vec<BlockId> {
        let mut out = Vec::new();
        let mut stack = Vec::new();
        let mut cur = self.root;
        while cur != NIL || !stack.is_empty() {
            while cur != NIL {
                stack.push(cur);
                cur = a.get(cur).kids[LEFT];
            }
            if let Some(n) = stack.pop() {
                out.push(n);
                cur = a.get(n).kids[RIGHT];
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
            for (i, (stream, size, ins)) in ops.into_iter().enumerate() {
                let key = (stream, size * 512, i as u64);
                if ins || model.is_empty() {
                    let id = a.alloc(key.2, key.1, key.0, PoolKind::Large);
                    t.insert(&mut a, id);
                    model.insert(key);
                    ids.insert(key, id);
                } else {
                    let k = *model.iter().nth(i % model.len()).unwrap();
                    model.remove(&k);
                    let id = ids.remove(&k).unwrap();
                    t.remove(&mut a, id);
                    a.release(id);
                }
                prop_assert_eq!(t.len(&a), model.len());
                prop_assert_eq!(t.check(&a), Ok(()));
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
