//! A block pool's two ordered sets: free blocks in size bins of small treaps, and unmapped
//! expandable ranges in one treap. Both live inside the block arena.
//!
//! Design note: PyTorch keeps free blocks in `std::set<Block*>` ordered by (stream, size,
//! address) and searches with `lower_bound`: best fit within a stream, ties to the lowest
//! address. A `BTreeSet` would allocate and free nodes as the set grows and shrinks, so a
//! cache hit could touch the host allocator; the sets here are intrusive treaps whose links
//! live inside the blocks, so insert and remove never allocate. A slot's priority is a hash
//! of its id (`block::prio`), which keeps every run bit-for-bit deterministic (a tree's shape
//! is never observable: only its in-order sequence is).
//! Parent links make `remove` start at the block itself, as erasing through a `std::set`
//! iterator does.
//!
//! One treap over all free blocks cost a best-fit search 10 to 20 dependent steps at a few
//! thousand free blocks, each a coin-toss branch. So the free-block set ([`SizeIndex`]) is
//! segregated first: per stream, blocks fall into size bins (exact 512-byte steps below
//! 2 MiB, then 32 bins per power of two, as TLSF does), a two-level bitmap says which
//! bins are non-empty, and each bin is a small treap ordered by the full key. Bins are
//! monotone in size, so "first key >= (stream, size, 0)" is still exact: the search bin's
//! treap, else the lowest block of the next non-empty bin, which one bit scan finds. The
//! observable order (and so every decision of the policy) is the same as one sorted set's.
//! The last block inserted waits outside its bin until the next insert (`SizeIndex::pending`):
//! a repeated same-size malloc+free takes it out again before it is ever filed.
//!
//! Inside a treap, which way a search turns is as good as a coin toss, so the descents
//! compute each key comparison without branching (`key_lt`) and pick the side as data, not
//! as a jump. Split and merge do the same: they keep a pointer to the link each part hangs
//! from next, so which part a node joins (or which root wins a merge) selects a pointer
//! instead of choosing between two code paths; only the loops' ends are branches.

use crate::block::{prio, Arena, Block, BlockId, Membership, NIL};
use crate::event::StreamId;

/// Sort key. The unmapped set orders by (stream, address): its keys carry size 0.
pub type Key = (StreamId, u64, u64);

/// Index into `Block::kids`.
const LEFT: usize = 0;
const RIGHT: usize = 1;

/// `a < b` in (stream, size, address) order, computed without branches.
#[inline(always)]
fn key_lt(a: Key, b: Key) -> bool {
    (a.0 < b.0) | ((a.0 == b.0) & size_addr_lt(a, b))
}

/// `a < b` in (size, address) order: one 128-bit comparison (a compare and a
/// subtract-with-borrow), not two compares and an equality test.
#[inline(always)]
fn size_addr_lt(a: Key, b: Key) -> bool {
    ((a.1 as u128) << 64 | a.2 as u128) < ((b.1 as u128) << 64 | b.2 as u128)
}

/// `if c { x } else { y }` for ids, without a branch.
#[inline(always)]
fn pick(c: bool, x: BlockId, y: BlockId) -> BlockId {
    y ^ ((x ^ y) & (c as BlockId).wrapping_neg())
}

/// Treap operations on one tree, given by its root slot. `SIZED` says whether the key
/// includes the size (free blocks) or not (unmapped ranges).
struct Treap<const SIZED: bool>;

impl<const SIZED: bool> Treap<SIZED> {
    /// Key order inside one tree. A size bin holds one stream's blocks, so sized trees
    /// compare (size, address) only; the unmapped tree mixes streams.
    #[inline(always)]
    fn lt(x: Key, y: Key) -> bool {
        if SIZED {
            size_addr_lt(x, y)
        } else {
            key_lt(x, y)
        }
    }

    #[inline(always)]
    fn key(a: &Arena, id: BlockId) -> Key {
        Self::key_of(a.get(id))
    }

    #[inline(always)]
    fn key_of(b: &Block) -> Key {
        (b.stream, if SIZED { b.size } else { 0 }, b.ptr)
    }

    #[inline(always)]
    fn insert(a: &mut Arena, root: &mut BlockId, id: BlockId) {
        if *root == NIL {
            // Many size bins hold none or one block: skip the descent and the split.
            let b = a.get_mut(id);
            b.kids = [NIL; 2];
            b.parent = NIL;
            *root = id;
            return;
        }
        let p = prio(id);
        let key = Self::key(a, id);
        // Descend while the path's priorities beat ours, then split there: one pass, no
        // rotations.
        let mut parent = NIL;
        let mut side = LEFT;
        let mut cur = *root;
        while cur != NIL && prio(cur) > p {
            parent = cur;
            side = !Self::lt(key, Self::key(a, cur)) as usize;
            cur = a.get(cur).kids[side];
        }
        hang(a, root, parent, side, id);
        Self::split_under(a, cur, key, id);
    }

    /// Split subtree `t` into (< key, >= key) and hang the parts as `id`'s left and right
    /// subtrees.
    #[inline(always)]
    fn split_under(a: &mut Arena, mut t: BlockId, key: Key, id: BlockId) {
        let base = a.base_ptr();
        // SAFETY: every id here is a live slot (see `Arena::get`), `base` stays valid (the
        // arena does not grow during a split), and no reference into the slots is alive.
        unsafe {
            // Per part (0: below `key`, 1: at or above): the node the next one hangs under,
            // and the link it goes into. A node of the left part is followed along its
            // right side, one of the right part along its left.
            let idp = base.add(id as usize);
            let mut tails = [id; 2];
            let mut links: [*mut BlockId; 2] =
                [&raw mut (*idp).kids[LEFT], &raw mut (*idp).kids[RIGHT]];
            // Which part each node joins is a coin toss, so it is data: no branch but the
            // loop's own.
            while t != NIL {
                let b = base.add(t as usize);
                let side = !Self::lt(Self::key_of(&*b), key) as usize;
                *links[side] = t;
                (*b).parent = tails[side];
                tails[side] = t;
                links[side] = &raw mut (*b).kids[side ^ 1];
                t = (*b).kids[side ^ 1];
            }
            *links[LEFT] = NIL;
            *links[RIGHT] = NIL;
        }
    }

    #[inline(always)]
    fn remove(a: &mut Arena, root: &mut BlockId, id: BlockId) {
        let (kids, parent) = {
            let b = a.get(id);
            (b.kids, b.parent)
        };
        debug_assert!(parent != NIL || *root == id);
        // The link to `id`: the root slot, or its parent's child link. Whether it is the
        // root is a coin toss in small bins, so both are computed and one is selected (for
        // a root, `get_or_last` reads some valid slot's links, which are not used).
        let p = parent.min(a.len() as BlockId - 1);
        let side = (a.get(p).kids[RIGHT] == id) as usize;
        // SAFETY: `p` is a valid slot index.
        let child: *mut BlockId = unsafe { &raw mut (*a.base_ptr().add(p as usize)).kids[side] };
        let root: *mut BlockId = root;
        let link = std::hint::select_unpredictable(parent == NIL, root, child);
        merge_into(a, kids[LEFT], kids[RIGHT], parent, link);
        // The removed block's own links are left stale: only members' links are ever
        // read, and `insert` rewrites all three.
    }

    /// Smallest element whose key satisfies `pred`, which must be false then true in key
    /// order (a monotone split), as every bound query here is.
    #[inline(always)]
    fn first_where(a: &Arena, root: BlockId, pred: impl Fn(Key) -> bool) -> Option<BlockId> {
        let mut best = NIL;
        let mut cur = root;
        while cur != NIL {
            let p = pred(Self::key(a, cur));
            best = pick(p, cur, best);
            cur = a.get(cur).kids[!p as usize];
        }
        (best != NIL).then_some(best)
    }

    /// Largest element whose key satisfies `pred` (true then false in key order).
    fn last_where(a: &Arena, root: BlockId, pred: impl Fn(Key) -> bool) -> Option<BlockId> {
        let mut best = NIL;
        let mut cur = root;
        while cur != NIL {
            let p = pred(Self::key(a, cur));
            best = pick(p, cur, best);
            cur = a.get(cur).kids[p as usize];
        }
        (best != NIL).then_some(best)
    }

    #[inline(always)]
    fn lower_bound(a: &Arena, root: BlockId, key: Key) -> Option<BlockId> {
        Self::first_where(a, root, |k| !Self::lt(k, key))
    }

    /// Smallest element with key > `key`.
    fn above(a: &Arena, root: BlockId, key: Key) -> Option<BlockId> {
        Self::first_where(a, root, |k| Self::lt(key, k))
    }

    /// Largest element with key < `key`.
    fn below(a: &Arena, root: BlockId, key: Key) -> Option<BlockId> {
        Self::last_where(a, root, |k| Self::lt(k, key))
    }

    /// The leftmost (`side` = LEFT) or rightmost block of a non-empty tree.
    #[inline(always)]
    fn end(a: &Arena, mut cur: BlockId, side: usize) -> BlockId {
        loop {
            let next = a.get(cur).kids[side];
            if next == NIL {
                return cur;
            }
            cur = next;
        }
    }

    /// Append the tree's ids in order.
    fn in_order(a: &Arena, root: BlockId, out: &mut Vec<BlockId>) {
        let mut stack = Vec::new();
        let mut cur = root;
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
    }

    /// Links are symmetric, the root has no parent, priorities are heap-ordered, keys
    /// strictly increase in order. O(n), for checks.
    fn check(a: &Arena, root: BlockId, what: &str) -> Result<Vec<BlockId>, String> {
        if root != NIL && a.get(root).parent != NIL {
            return Err(format!("{what}: root {root} has a parent"));
        }
        let mut ids = Vec::new();
        Self::in_order(a, root, &mut ids);
        for w in ids.windows(2) {
            if !key_lt(Self::key(a, w[0]), Self::key(a, w[1])) {
                return Err(format!("{what}: keys out of order"));
            }
        }
        for &id in &ids {
            let b = a.get(id);
            for c in b.kids {
                if c != NIL && (a.get(c).parent != id || prio(c) > prio(id)) {
                    return Err(format!("{what}: bad link {id} -> {c}"));
                }
            }
        }
        Ok(ids)
    }
}

/// Merge two subtrees where every key of `l` is below every key of `r`, into `link` (a root
/// slot or a child link of `hook`, which becomes the result's parent).
#[inline(always)]
fn merge_into(
    a: &mut Arena,
    mut l: BlockId,
    mut r: BlockId,
    mut hook: BlockId,
    link: *mut BlockId,
) {
    let base = a.base_ptr();
    let mut link = link;
    // Built top-down: each step places the higher-priority of the two roots at `link` and
    // continues down that root's inner spine (an `l` root's right side, an `r` root's left
    // side). Which root wins is a coin toss, so it is data, not a jump.
    // SAFETY: ids are live slots, `base` stays valid (no growth), `link` points into a
    // live block or the caller's root slot, and no reference into the slots is alive.
    unsafe {
        while l != NIL && r != NIL {
            let take_l = prio(l) > prio(r);
            let x = pick(take_l, l, r);
            let bx = base.add(x as usize);
            *link = x;
            (*bx).parent = hook;
            hook = x;
            // RIGHT == 1 for an `l` root, LEFT == 0 for an `r` root.
            let inner = take_l as usize;
            link = &raw mut (*bx).kids[inner];
            let next = (*bx).kids[inner];
            l = pick(take_l, next, l);
            r = pick(take_l, r, next);
        }
        let x = pick(l == NIL, r, l);
        *link = x;
        a.get_mut_or_scratch(x).parent = hook;
    }
}

/// `x` (not `NIL`) as child `side` of `hook`, or as `root` if `hook` is `NIL`; `x`'s parent
/// becomes `hook`.
#[inline(always)]
fn hang(a: &mut Arena, root: &mut BlockId, hook: BlockId, side: usize, x: BlockId) {
    if hook == NIL {
        *root = x;
    } else {
        a.get_mut(hook).kids[side & 1] = x;
    }
    a.get_mut(x).parent = hook;
}

/// The unmapped ranges of expandable segments, ordered by (stream, address).
#[derive(Clone, Copy, Debug)]
pub struct Tree {
    root: BlockId,
}

type Unsized = Treap<false>;

impl Default for Tree {
    fn default() -> Self {
        Tree { root: NIL }
    }
}

impl Tree {
    /// Number of blocks in the set: O(n), for checks.
    pub fn len(&self, a: &Arena) -> usize {
        self.to_vec(a).len()
    }

    pub fn insert(&mut self, a: &mut Arena, id: BlockId) {
        debug_assert_eq!(a.get(id).member, Membership::None);
        a.get_mut(id).member = Membership::Unmapped;
        Unsized::insert(a, &mut self.root, id);
    }

    pub fn remove(&mut self, a: &mut Arena, id: BlockId) {
        debug_assert_eq!(a.get(id).member, Membership::Unmapped);
        Unsized::remove(a, &mut self.root, id);
        a.get_mut(id).member = Membership::None;
    }

    /// Smallest element with key >= `key` (the key's size is ignored).
    pub fn lower_bound(&self, a: &Arena, key: Key) -> Option<BlockId> {
        Unsized::lower_bound(a, self.root, (key.0, 0, key.2))
    }

    /// Smallest element with key > that of `id`.
    pub fn successor(&self, a: &Arena, id: BlockId) -> Option<BlockId> {
        Unsized::above(a, self.root, Unsized::key(a, id))
    }

    /// Largest element with key < `key` (the key's size is ignored).
    pub fn predecessor_of_key(&self, a: &Arena, key: Key) -> Option<BlockId> {
        Unsized::below(a, self.root, (key.0, 0, key.2))
    }

    pub fn check(&self, a: &Arena) -> Result<(), String> {
        for id in Unsized::check(a, self.root, "unmapped set")? {
            if a.get(id).member != Membership::Unmapped {
                return Err(format!(
                    "unmapped set: block {id} is {:?}",
                    a.get(id).member
                ));
            }
        }
        Ok(())
    }

    /// In-order ids. Allocates; for release paths and checks, never the hot path.
    pub fn to_vec(self, a: &Arena) -> Vec<BlockId> {
        let mut out = Vec::new();
        Unsized::in_order(a, self.root, &mut out);
        out
    }
}

type Sized_ = Treap<true>;

/// Bins below 2 MiB are exact 512-byte steps: the small pool (2 MiB segments) is all exact,
/// so its split remainders, which crowd just under 2 MiB, spread over many small treaps
/// instead of piling into two (`EXACT_BITS` = 12: 4096 bins).
const EXACT_BITS: u32 = 12;
const EXACT_BINS: usize = 1 << EXACT_BITS;
/// Then 2^SUB_BITS bins per power of two.
const SUB_BITS: u32 = 5;
/// Sizes in 512-byte units are below 2^55, so the last octave starts at 2^54.
const NBINS: usize = EXACT_BINS + (54 - EXACT_BITS as usize + 1) * (1 << SUB_BITS);
/// Arrays are sized to the next power of two, so that indexing with `bin & SLOT_MASK`
/// needs no bounds check; the bins past `NBINS` stay empty.
const SLOTS: usize = NBINS.next_power_of_two();
// `Block::bin` is 16 bits.
const _: () = assert!(NBINS <= u16::MAX as usize);
const SLOT_MASK: usize = SLOTS - 1;
const NWORDS: usize = SLOTS / 64;
const WORD_MASK: usize = NWORDS - 1;
// The summary is two u64s: bit `w & 63` of `summary[w >> 6]` says `words[w]` is non-zero.
// Updates touch one half; scans read both as one u128.
const _: () = assert!(NWORDS <= 128);

/// The bin of a block size: monotone non-decreasing in `size`, which is all the ordered
/// queries need.
#[inline(always)]
pub fn bin_of(size: u64) -> usize {
    let u = size >> 9;
    // Both answers, then a select: small and large sizes alternate at random in a mixed
    // workload, so a branch here would be a coin toss.
    let lg = (63 - (u | 1).leading_zeros()).max(EXACT_BITS);
    let sub = (u >> (lg - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    let log_bin = EXACT_BINS + ((lg - EXACT_BITS) << SUB_BITS) as usize + sub as usize;
    std::hint::select_unpredictable(u < EXACT_BINS as u64, u as usize, log_bin)
}

/// One stream's bins: treap roots and the bitmap of non-empty bins. (Keeping each bin's
/// first block beside its root saved the few descents best fit makes, but its upkeep on
/// every insert and remove cost more instructions and as many mispredicts.)
struct Bins {
    summary: [u64; 2],
    words: [u64; NWORDS],
    roots: [BlockId; SLOTS],
}

impl Bins {
    fn new() -> Box<Self> {
        Box::new(Bins {
            summary: [0; 2],
            words: [0; NWORDS],
            roots: [NIL; SLOTS],
        })
    }

    #[inline(always)]
    fn root(&mut self, bin: usize) -> &mut BlockId {
        &mut self.roots[bin & SLOT_MASK]
    }

    #[inline(always)]
    fn root_of(&self, bin: usize) -> BlockId {
        self.roots[bin & SLOT_MASK]
    }

    #[inline(always)]
    fn mark(&mut self, bin: usize) {
        let w = (bin >> 6) & WORD_MASK;
        self.words[w] |= 1 << (bin & 63);
        self.summary[w >> 6] |= 1 << (w & 63);
    }

    /// Clear `bin`'s bit if `empty`, without a branch.
    #[inline(always)]
    fn unmark_if(&mut self, bin: usize, empty: bool) {
        let w = (bin >> 6) & WORD_MASK;
        self.words[w] &= !((empty as u64) << (bin & 63));
        // Whether the word just emptied is a coin toss: clear its summary bit by arithmetic.
        self.summary[w >> 6] &= !(((self.words[w] == 0) as u64) << (w & 63));
    }

    #[inline(always)]
    fn summary_bits(&self) -> u128 {
        (self.summary[1] as u128) << 64 | self.summary[0] as u128
    }

    /// The first non-empty bin at or after `from`.
    #[inline(always)]
    fn next_set(&self, from: usize) -> Option<usize> {
        if from >= NBINS {
            return None;
        }
        // Whether the answer is in `from`'s own word is a coin toss on mixed workloads, so
        // both candidates are computed and one is selected.
        let w = (from >> 6) & WORD_MASK;
        let m = self.words[w] & (!0u64 << (from & 63));
        let later = self.summary_bits() & (!0u128).checked_shl(w as u32 + 1).unwrap_or(0);
        let w2 = later.trailing_zeros() as usize & WORD_MASK;
        let here = (w << 6) | m.trailing_zeros() as usize;
        let there = (w2 << 6) | self.words[w2].trailing_zeros() as usize;
        let bin = std::hint::select_unpredictable(m != 0, here, there);
        ((m != 0) | (later != 0)).then_some(bin)
    }

    /// The last non-empty bin at or before `upto`.
    fn prev_set(&self, upto: usize) -> Option<usize> {
        let upto = upto.min(NBINS - 1);
        let w = upto >> 6;
        let m = self.words[w] & (!0u64 >> (63 - (upto & 63)));
        if m != 0 {
            return Some((w << 6) | (63 - m.leading_zeros() as usize));
        }
        let earlier = self.summary_bits() & ((1u128 << w) - 1);
        if earlier == 0 {
            return None;
        }
        let w2 = 127 - earlier.leading_zeros() as usize;
        Some((w2 << 6) | (63 - self.words[w2].leading_zeros() as usize))
    }

    /// The lowest block in bins `from..`.
    #[inline(always)]
    fn first_from(&self, a: &Arena, from: usize) -> Option<BlockId> {
        self.next_set(from)
            .map(|b| Sized_::end(a, self.root_of(b), LEFT))
    }

    /// The highest block in bins `..=upto`.
    fn last_upto(&self, a: &Arena, upto: usize) -> Option<BlockId> {
        self.prev_set(upto)
            .map(|b| Sized_::end(a, self.root_of(b), RIGHT))
    }

    /// Smallest block with key >= `key` (of this stream).
    #[inline(always)]
    fn lower_bound(&self, a: &Arena, key: Key) -> Option<BlockId> {
        let bin = bin_of(key.1);
        let root = self.root_of(bin);
        if root != NIL {
            if let Some(id) = Sized_::lower_bound(a, root, key) {
                return Some(id);
            }
        }
        self.first_from(a, bin + 1)
    }

    /// Smallest block with key > `key`.
    fn above(&self, a: &Arena, key: Key) -> Option<BlockId> {
        let bin = bin_of(key.1);
        Sized_::above(a, self.root_of(bin), key).or_else(|| self.first_from(a, bin + 1))
    }

    /// Largest block with key < `key`.
    fn below(&self, a: &Arena, key: Key) -> Option<BlockId> {
        let bin = bin_of(key.1);
        Sized_::below(a, self.root_of(bin), key)
            .or_else(|| bin.checked_sub(1).and_then(|b| self.last_upto(a, b)))
    }
}

/// Free mapped blocks, ordered by (stream, size, address): per stream, size bins of treaps,
/// plus one pending block.
///
/// The pending block is the last one inserted: a member of the set that is not yet in its
/// bin. The next insert files it. A block removed while pending (the remainder a free
/// merges straight back, the block the next malloc takes) costs no tree or bitmap work at
/// all, which is the whole of a repeated same-size pair's set traffic. Every query
/// compares the pending block's key with the bins' answer, so the set's order, and every
/// decision of the policy, are unchanged.
pub struct SizeIndex {
    /// Sorted by stream; a stream keeps its (possibly empty) bins once it has had a block.
    streams: Vec<(StreamId, Box<Bins>)>,
    /// A member not filed in any bin, or `NIL`.
    pending: BlockId,
}

impl Default for SizeIndex {
    fn default() -> Self {
        SizeIndex {
            streams: Vec::new(),
            pending: NIL,
        }
    }
}

impl SizeIndex {
    /// The bins of `stream`; nearly every program has one or two streams, so a scan, with
    /// the first slot (the default stream, nearly always) tested before the loop.
    #[inline(always)]
    fn bins_mut(&mut self, stream: StreamId) -> Option<&mut Bins> {
        let i = match self.streams.first() {
            Some((s, _)) if *s == stream => 0,
            _ => self.position_slow(stream)?,
        };
        self.streams.get_mut(i).map(|(_, b)| &mut **b)
    }

    fn position_slow(&self, stream: StreamId) -> Option<usize> {
        self.streams.iter().position(|(s, _)| *s == stream)
    }

    /// Add `id` to the set: it becomes the pending block, and the previous one is filed.
    #[inline(always)]
    pub fn insert(&mut self, a: &mut Arena, id: BlockId) {
        {
            let b = a.get_mut(id);
            debug_assert_eq!(b.member, Membership::None);
            b.member = Membership::Blocks;
        }
        let old = std::mem::replace(&mut self.pending, id);
        if old != NIL {
            self.file(a, old);
        }
    }

    /// Put a member into its bin.
    #[inline(always)]
    fn file(&mut self, a: &mut Arena, id: BlockId) {
        let (stream, size) = {
            let b = a.get(id);
            (b.stream, b.size)
        };
        let bin = bin_of(size);
        a.get_mut(id).bin = bin as u16;
        let bins = match self.bins_mut(stream) {
            Some(b) => b,
            None => self.add_stream(stream),
        };
        Sized_::insert(a, bins.root(bin), id);
        bins.mark(bin);
    }

    #[cold]
    fn add_stream(&mut self, stream: StreamId) -> &mut Bins {
        let i = self.streams.partition_point(|(s, _)| *s < stream);
        self.streams.insert(i, (stream, Bins::new()));
        &mut self.streams[i].1
    }

    #[inline(always)]
    pub fn remove(&mut self, a: &mut Arena, id: BlockId) {
        debug_assert_eq!(a.get(id).member, Membership::Blocks);
        if id == self.pending {
            self.pending = NIL;
            a.get_mut(id).member = Membership::None;
            return;
        }
        let (stream, bin) = {
            let b = a.get(id);
            (b.stream, b.bin as usize)
        };
        let Some(bins) = self.bins_mut(stream) else {
            debug_assert!(false, "block {id} of an unknown stream");
            return;
        };
        let root = bins.root(bin);
        Sized_::remove(a, root, id);
        // Whether the bin just emptied is a coin toss: its bit is cleared by arithmetic.
        let emptied = *root == NIL;
        bins.unmark_if(bin, emptied);
        a.get_mut(id).member = Membership::None;
    }

    /// Smallest element with key >= `key`.
    pub fn lower_bound(&self, a: &Arena, key: Key) -> Option<BlockId> {
        let filed = self.lower_bound_filed(a, key);
        self.with_pending::<false>(a, filed, |k| !key_lt(k, key))
    }

    /// Best fit: the smallest block of `stream` with size >= `size`, lowest address first
    /// (`lower_bound((stream, size, 0))` when its answer is of `stream`, else `None`).
    #[inline(always)]
    pub fn best_fit(&self, a: &Arena, stream: StreamId, size: u64) -> Option<BlockId> {
        let key = (stream, size, 0);
        // The stream is nearly always the first.
        let filed = match self.streams.first() {
            Some((s, bins)) if *s == stream => bins.lower_bound(a, key),
            _ => self.bins(stream).and_then(|b| b.lower_bound(a, key)),
        };
        // The bins' answer is of `stream`, so where the pending block is too, the full key
        // order is (size, address) order.
        self.with_pending::<false>(a, filed, |k| (k.0 == stream) & (k.1 >= size))
    }

    fn bins(&self, stream: StreamId) -> Option<&Bins> {
        let i = self.position_slow(stream)?;
        Some(&self.streams[i].1)
    }

    /// The answer of a bound query over the whole set, from `found`, the bins' answer: for
    /// `HIGHEST` false, the smallest key satisfying `pred` (false then true in key order);
    /// for `HIGHEST` true, the largest (`pred` true then false). The pending block replaces
    /// `found` where its key satisfies `pred` and lies beyond it on the query's side.
    #[inline(always)]
    fn with_pending<const HIGHEST: bool>(
        &self,
        a: &Arena,
        found: Option<BlockId>,
        pred: impl Fn(Key) -> bool,
    ) -> Option<BlockId> {
        let p = self.pending;
        if p == NIL {
            return found;
        }
        // Whether the pending block fits, and whether it beats the bins' answer, are coin
        // tosses on a mixed workload: both tests, then a select. A missing answer reads the
        // scratch block's key, masked out.
        let f = found.unwrap_or(NIL);
        let pk = Sized_::key(a, p);
        let fk = Sized_::key_of(a.get_or_scratch(f));
        let beyond = if HIGHEST {
            key_lt(fk, pk)
        } else {
            key_lt(pk, fk)
        };
        let take_p = pred(pk) & ((f == NIL) | beyond);
        let id = pick(take_p, p, f);
        (id != NIL).then_some(id)
    }

    /// Smallest filed element with key >= `key`.
    fn lower_bound_filed(&self, a: &Arena, key: Key) -> Option<BlockId> {
        for (s, bins) in &self.streams {
            if *s == key.0 {
                if let Some(id) = bins.lower_bound(a, key) {
                    return Some(id);
                }
            } else if *s > key.0 {
                if let Some(id) = bins.first_from(a, 0) {
                    return Some(id);
                }
            }
        }
        None
    }

    /// Smallest element with key > that of `id`.
    pub fn successor(&self, a: &Arena, id: BlockId) -> Option<BlockId> {
        let key = Sized_::key(a, id);
        let filed = self.above_filed(a, key);
        self.with_pending::<false>(a, filed, |k| key_lt(key, k))
    }

    fn above_filed(&self, a: &Arena, key: Key) -> Option<BlockId> {
        for (s, bins) in &self.streams {
            let found = if *s == key.0 {
                bins.above(a, key)
            } else if *s > key.0 {
                bins.first_from(a, 0)
            } else {
                None
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// Largest element with key < `key`.
    pub fn predecessor_of_key(&self, a: &Arena, key: Key) -> Option<BlockId> {
        let filed = self.below_filed(a, key);
        self.with_pending::<true>(a, filed, |k| key_lt(k, key))
    }

    fn below_filed(&self, a: &Arena, key: Key) -> Option<BlockId> {
        for (s, bins) in self.streams.iter().rev() {
            let found = if *s == key.0 {
                bins.below(a, key)
            } else if *s < key.0 {
                bins.last_upto(a, NBINS - 1)
            } else {
                None
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    pub fn predecessor(&self, a: &Arena, id: BlockId) -> Option<BlockId> {
        self.predecessor_of_key(a, Sized_::key(a, id))
    }

    pub fn last(&self, a: &Arena) -> Option<BlockId> {
        let filed = self
            .streams
            .iter()
            .rev()
            .find_map(|(_, bins)| bins.last_upto(a, NBINS - 1));
        self.with_pending::<true>(a, filed, |_| true)
    }

    /// In-order ids. Allocates; for release paths and checks, never the hot path.
    pub fn to_vec(&self, a: &Arena) -> Vec<BlockId> {
        let mut out = self.filed_in_order(a);
        if self.pending != NIL {
            let pk = Sized_::key(a, self.pending);
            let at = out.partition_point(|&id| key_lt(Sized_::key(a, id), pk));
            out.insert(at, self.pending);
        }
        out
    }

    /// The filed blocks (all but the pending one), in order.
    fn filed_in_order(&self, a: &Arena) -> Vec<BlockId> {
        let mut out = Vec::new();
        for (_, bins) in &self.streams {
            let mut bin = 0;
            while let Some(b) = bins.next_set(bin) {
                Sized_::in_order(a, bins.root_of(b), &mut out);
                bin = b + 1;
            }
        }
        out
    }

    /// Number of blocks in the set: O(n), for checks.
    pub fn len(&self, a: &Arena) -> usize {
        self.to_vec(a).len()
    }

    /// Every structural property, recomputed: each bin is a valid treap whose blocks are
    /// members of this set, of its stream and bin; the bitmap marks exactly the non-empty
    /// bins; streams are sorted.
    pub fn check(&self, a: &Arena) -> Result<(), String> {
        if self.pending != NIL {
            if a.get(self.pending).member != Membership::Blocks {
                return Err(format!(
                    "free set: pending block {} is {:?}",
                    self.pending,
                    a.get(self.pending).member
                ));
            }
            if self.filed_in_order(a).contains(&self.pending) {
                return Err(format!(
                    "free set: pending block {} is also filed",
                    self.pending
                ));
            }
        }
        for w in self.streams.windows(2) {
            if w[0].0 >= w[1].0 {
                return Err("free set: streams out of order".into());
            }
        }
        for (s, bins) in &self.streams {
            let mut summary = [0u64; 2];
            for (bin, &root) in bins.roots.iter().enumerate() {
                let ids = Sized_::check(a, root, "free set")?;
                let marked = bins.words[bin >> 6] >> (bin & 63) & 1 == 1;
                if marked == ids.is_empty() {
                    return Err(format!("free set: bin {bin} bitmap is wrong"));
                }
                for id in ids {
                    let b = a.get(id);
                    if b.member != Membership::Blocks
                        || b.stream != *s
                        || b.bin as usize != bin
                        || bin_of(b.size) != bin
                    {
                        return Err(format!("free set: block {id} misfiled in bin {bin}"));
                    }
                }
            }
            for (w, &word) in bins.words.iter().enumerate() {
                if word != 0 {
                    summary[w >> 6] |= 1 << (w & 63);
                }
            }
            if summary != bins.summary {
                return Err("free set: summary bitmap is wrong".into());
            }
        }
        Ok(())
    }
}

/// One of a device's block pools: free blocks and unmapped expandable ranges.
pub struct BlockPool {
    pub blocks: SizeIndex,
    pub unmapped: Tree,
    /// GC clock: ticks on every cache search while GC is enabled.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    pub fn new() -> Self {
        BlockPool {
            blocks: SizeIndex::default(),
            unmapped: Tree::default(),
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

    fn key_of(a: &Arena, id: BlockId) -> (u64, u64, u64) {
        let b = a.get(id);
        (b.stream, b.size, b.ptr)
    }

    /// A size from every region of the bin map: exact bins, across the first log bin, and huge.
    fn size_of(class: u64, x: u64) -> u64 {
        match class {
            0 => 512 * (1 + x % 300),
            1 => (2 << 20) - 512 * 32 + 512 * (x % 64),
            2 => (3 << 20) + 512 * x,
            _ => (1 << 40) + (x << 30),
        }
    }

    proptest! {
        #[test]
        fn size_index_matches_btreeset(ops in proptest::collection::vec((0u64..3, 0u64..4, 0u64..2000, any::<bool>()), 1..400)) {
            let mut a = Arena::default();
            let mut t = SizeIndex::default();
            let mut model: BTreeSet<(u64, u64, u64)> = BTreeSet::new();
            let mut ids = std::collections::HashMap::new();
            for (i, (stream, class, x, ins)) in ops.into_iter().enumerate() {
                // Streams arrive out of order (2 before 0), so the stream list must sort.
                let stream = [2, 0, 7][stream as usize];
                let key = (stream, size_of(class, x), i as u64 * 512);
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
                prop_assert_eq!(t.check(&a), Ok(()));
                let inorder: Vec<_> = t.to_vec(&a).into_iter().map(|id| key_of(&a, id)).collect();
                prop_assert_eq!(&inorder, &model.iter().copied().collect::<Vec<_>>());
                for probe in [(stream, key.1, 0), (stream, key.1 + 512, 0), (1, 0, 0), (stream, 0, 0), (9, 0, 0)] {
                    let got = t.lower_bound(&a, probe).map(|id| key_of(&a, id));
                    prop_assert_eq!(got, model.range(probe..).next().copied());
                    let fit = t.best_fit(&a, probe.0, probe.1).map(|id| key_of(&a, id));
                    prop_assert_eq!(fit, got.filter(|k| k.0 == probe.0));
                    let pred = t.predecessor_of_key(&a, probe).map(|id| key_of(&a, id));
                    prop_assert_eq!(pred, model.range(..probe).next_back().copied());
                }
                prop_assert_eq!(t.last(&a).map(|id| key_of(&a, id)), model.iter().next_back().copied());
                // Walk the whole order both ways through successor and predecessor.
                let mut fwd = Vec::new();
                let mut cur = t.lower_bound(&a, (0, 0, 0));
                while let Some(c) = cur {
                    fwd.push(key_of(&a, c));
                    cur = t.successor(&a, c);
                }
                prop_assert_eq!(&fwd, &inorder);
                let mut back = Vec::new();
                let mut cur = t.last(&a);
                while let Some(c) = cur {
                    back.push(key_of(&a, c));
                    cur = t.predecessor(&a, c);
                }
                back.reverse();
                prop_assert_eq!(&back, &inorder);
            }
        }

        #[test]
        fn unmapped_tree_matches_btreeset(ops in proptest::collection::vec((0u64..3, 0u64..64, any::<bool>()), 1..300)) {
            let mut a = Arena::default();
            let mut t = Tree::default();
            let mut model: BTreeSet<(u64, u64)> = BTreeSet::new();
            let mut ids = std::collections::HashMap::new();
            for (i, (stream, x, ins)) in ops.into_iter().enumerate() {
                let key = (stream, (x * 1000 + i as u64) << 21);
                if (ins || model.is_empty()) && !model.contains(&key) {
                    let id = a.alloc(key.1, 2 << 20, key.0, PoolKind::Large);
                    t.insert(&mut a, id);
                    model.insert(key);
                    ids.insert(key, id);
                } else if !model.is_empty() {
                    let k = *model.iter().nth(i % model.len()).unwrap();
                    model.remove(&k);
                    let id = ids.remove(&k).unwrap();
                    t.remove(&mut a, id);
                    a.release(id);
                }
                prop_assert_eq!(t.check(&a), Ok(()));
                prop_assert_eq!(t.len(&a), model.len());
                let k2 = |id: BlockId| { let b = a.get(id); (b.stream, b.ptr) };
                let probe = (stream, 0, key.1);
                prop_assert_eq!(t.lower_bound(&a, probe).map(k2), model.range((stream, key.1)..).next().copied());
                prop_assert_eq!(t.predecessor_of_key(&a, probe).map(k2), model.range(..(stream, key.1)).next_back().copied());
                if let Some(first) = t.lower_bound(&a, (0, 0, 0)) {
                    prop_assert_eq!(t.successor(&a, first).map(k2), model.iter().nth(1).copied());
                }
            }
        }
    }

    /// The pending block is a member like any other for every query, is filed by the next
    /// insert, and costs the bins nothing when it leaves before that.
    #[test]
    fn pending_block_is_a_member_and_is_filed_by_the_next_insert() {
        let mut a = Arena::default();
        let mut t = SizeIndex::default();
        let small = a.alloc(1 << 20, 4096, 0, PoolKind::Small);
        let big = a.alloc(0, 8192, 0, PoolKind::Small);
        let filed_bins = |t: &SizeIndex| -> usize {
            t.streams
                .iter()
                .map(|(_, b)| {
                    b.words
                        .iter()
                        .map(|w| w.count_ones() as usize)
                        .sum::<usize>()
                })
                .sum()
        };
        // In and out again while pending: no bin is ever marked.
        t.insert(&mut a, big);
        assert_eq!(t.lower_bound(&a, (0, 4096, 0)), Some(big));
        assert_eq!(filed_bins(&t), 0);
        t.remove(&mut a, big);
        assert_eq!(t.to_vec(&a), Vec::<BlockId>::new());
        assert_eq!(filed_bins(&t), 0);
        // The next insert files the pending block; best fit sees both.
        t.insert(&mut a, big);
        t.insert(&mut a, small);
        assert_eq!(filed_bins(&t), 1);
        assert_eq!(t.check(&a), Ok(()));
        assert_eq!(t.lower_bound(&a, (0, 512, 0)), Some(small));
        assert_eq!(t.lower_bound(&a, (0, 4608, 0)), Some(big));
        assert_eq!(t.lower_bound(&a, (0, 8704, 0)), None);
        assert_eq!(t.to_vec(&a), vec![small, big]);
        assert_eq!(t.successor(&a, small), Some(big));
        assert_eq!(t.predecessor(&a, big), Some(small));
        assert_eq!(t.last(&a), Some(big));
        // Removing the filed block leaves the pending one, and the bin empties.
        t.remove(&mut a, big);
        assert_eq!(filed_bins(&t), 0);
        assert_eq!(t.lower_bound(&a, (0, 512, 0)), Some(small));
        assert_eq!(t.check(&a), Ok(()));
    }

    #[test]
    fn bins_are_monotone_and_in_range() {
        let mut sizes: Vec<u64> = (0..(1u64 << 16)).map(|u| u << 9).collect();
        for e in 9..64 {
            sizes.extend([
                (1u64 << e) - 1,
                1 << e,
                (1 << e) + 1,
                (1 << e) + (1 << (e - 1)),
            ]);
        }
        sizes.push(u64::MAX);
        sizes.sort_unstable();
        for w in sizes.windows(2) {
            assert!(
                bin_of(w[0]) <= bin_of(w[1]),
                "bin of {} above bin of {}",
                w[0],
                w[1]
            );
        }
        assert_eq!(bin_of(u64::MAX), NBINS - 1);
        // Exact 512-byte bins below 2 MiB.
        assert_eq!(bin_of(4096), 8);
        assert_ne!(bin_of((2 << 20) - 512), bin_of((2 << 20) - 1024));
        assert_eq!(bin_of(2 << 20), EXACT_BINS);
    }
}
