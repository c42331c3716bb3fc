//! The pointer map: allocated blocks by device address (PyTorch's `allocated_blocks`).
//!
//! Design note: every cache hit inserts one pointer and every free removes one, so this map is
//! on the hot path twice per pair. Its keys are device addresses (never iterated, never
//! ordered), its values 4-byte block ids, so a general-purpose `HashMap` spends most of its
//! time on machinery this use does not need (control bytes, generic hashing). Here: buckets
//! of four (address, id) slots, one cache line each, Fibonacci hashing of the address to a
//! bucket (the multiply's high bits mix the aligned low bits away), at most a quarter full.
//! A lookup compares all four keys of its bucket at once and takes the match by bit scan,
//! so it costs one line and one predictable branch; slot-by-slot linear probing ended on a
//! coin-toss branch (home slot or the next?), about one mispredict per free.
//!
//! A bucket that was full when an insert came by carries an `overflow` mark, and only then
//! does a lookup that misses there go on to the next bucket. Removing just clears the slot;
//! marks stay until the table is rebuilt, which happens when it doubles (at a quarter full)
//! or when an eighth of the buckets carry a stale mark. At a quarter full, a bucket overflows
//! for about one insert in 250. Address 0 is the empty-slot marker; a block at address 0 (no
//! real device hands one out) is kept aside in `zero`. The table never shrinks, so a warm
//! allocator's inserts and removes never touch the host allocator.

use crate::block::{BlockId, NIL};

const EMPTY: u64 = 0;
/// 2^64 / φ: Fibonacci hashing.
const MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// Slots per bucket.
const WAYS: usize = 4;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    keys: [u64; WAYS],
    ids: [BlockId; WAYS],
    /// Bit `i` set: slot `i` holds a key (the same as `keys[i] != EMPTY`, kept so that an
    /// insert finds a free slot with one bit scan instead of four compares).
    used: u8,
    /// An insert found this bucket full and went on: a lookup that misses here goes on too.
    overflow: bool,
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 64);

impl Bucket {
    const EMPTY: Bucket = Bucket {
        keys: [EMPTY; WAYS],
        ids: [NIL; WAYS],
        used: 0,
        overflow: false,
    };

    /// Bit `i` set where `keys[i] == key`, computed without branches.
    #[inline(always)]
    fn matches(&self, key: u64) -> u32 {
        let mut m = 0;
        for (i, &k) in self.keys.iter().enumerate() {
            m |= ((k == key) as u32) << i;
        }
        m
    }
}

pub struct PtrMap {
    buckets: Box<[Bucket]>,
    mask: usize,
    /// 64 - log2(buckets.len()): the home bucket is the top bits of `key * MUL`.
    shift: u32,
    len: usize,
    /// `len` at which the table doubles (a quarter of its slots).
    grow_at: usize,
    /// Buckets carrying an overflow mark.
    marked: usize,
    /// The value for address 0, or `NIL`.
    zero: BlockId,
}

impl PtrMap {
    /// Room for `n` entries before the first growth.
    pub fn with_capacity(n: usize) -> Self {
        Self::with_buckets((n.max(1) * 4).div_ceil(WAYS).next_power_of_two())
    }

    fn with_buckets(nb: usize) -> Self {
        PtrMap {
            buckets: vec![Bucket::EMPTY; nb].into_boxed_slice(),
            mask: nb - 1,
            shift: 64 - nb.trailing_zeros(),
            len: 0,
            grow_at: nb * WAYS / 4,
            marked: 0,
            zero: NIL,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        // With one bucket the shift would be 64; `checked_shr` makes that bucket 0.
        key.wrapping_mul(MUL).checked_shr(self.shift).unwrap_or(0) as usize
    }

    #[inline(always)]
    fn bucket(&self, i: usize) -> &Bucket {
        // SAFETY: every index is `home` (log2(len) bits) or masked by `mask` = len - 1.
        unsafe { self.buckets.get_unchecked(i) }
    }

    #[inline(always)]
    fn bucket_mut(&mut self, i: usize) -> &mut Bucket {
        debug_assert!(i < self.buckets.len());
        // SAFETY: as in `bucket`.
        unsafe { self.buckets.get_unchecked_mut(i) }
    }

    /// (bucket, slot) holding `key`, if any.
    #[inline(always)]
    fn find(&self, key: u64) -> Option<(usize, usize)> {
        let mut i = self.home(key);
        loop {
            let b = self.bucket(i);
            let m = b.matches(key);
            if m != 0 {
                return Some((i, m.trailing_zeros() as usize));
            }
            if !b.overflow {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<BlockId> {
        if key == EMPTY {
            return (self.zero != NIL).then_some(self.zero);
        }
        self.find(key).map(|(i, j)| self.bucket(i).ids[j])
    }

    /// Map `key` to `id`, replacing any previous id.
    #[inline]
    pub fn insert(&mut self, key: u64, id: BlockId) {
        if key == EMPTY {
            if self.zero == NIL {
                self.len += 1;
            }
            self.zero = id;
            return;
        }
        if let Some((i, j)) = self.find(key) {
            self.bucket_mut(i).ids[j] = id;
            return;
        }
        self.insert_absent(key, id);
    }

    /// Map `key`, which must be absent (an allocated block's address is unique among
    /// allocated blocks), to `id`: `insert` without the lookup.
    #[inline]
    pub fn insert_new(&mut self, key: u64, id: BlockId) {
        debug_assert!(self.get(key).is_none(), "address {key:#x} already mapped");
        if key == EMPTY {
            return self.insert(key, id);
        }
        self.insert_absent(key, id);
    }

    /// Add a non-zero key known to be absent, growing first if the table is a quarter full.
    #[inline(always)]
    fn insert_absent(&mut self, key: u64, id: BlockId) {
        if self.len >= self.grow_at {
            self.rebuild(self.buckets.len() * 2);
        }
        self.place(key, id);
        self.len += 1;
    }

    /// Put an absent key in the first free slot from its home bucket on, marking the full
    /// buckets passed.
    #[inline(always)]
    fn place(&mut self, key: u64, id: BlockId) {
        let mut i = self.home(key);
        loop {
            let b = self.bucket_mut(i);
            let free = !b.used & ((1 << WAYS) - 1);
            if free != 0 {
                let j = free.trailing_zeros() as usize;
                b.keys[j] = key;
                b.ids[j] = id;
                b.used |= 1 << j;
                return;
            }
            if !b.overflow {
                b.overflow = true;
                self.marked += 1;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Remove `key`, returning its id.
    #[inline]
    pub fn remove(&mut self, key: u64) -> Option<BlockId> {
        if key == EMPTY {
            let v = std::mem::replace(&mut self.zero, NIL);
            if v == NIL {
                return None;
            }
            self.len -= 1;
            return Some(v);
        }
        let (i, j) = self.find(key)?;
        let b = self.bucket_mut(i);
        let v = b.ids[j];
        b.keys[j] = EMPTY;
        b.ids[j] = NIL;
        b.used &= !(1 << j);
        self.len -= 1;
        if self.marked * 8 > self.buckets.len() {
            self.rebuild(self.buckets.len());
        }
        Some(v)
    }

    /// Rehash into `nb` buckets (a power of two), dropping stale overflow marks.
    #[cold]
    fn rebuild(&mut self, nb: usize) {
        let old = std::mem::replace(self, Self::with_buckets(nb));
        self.zero = old.zero;
        self.len = old.len;
        for b in old.buckets.iter() {
            for (&k, &v) in b.keys.iter().zip(&b.ids) {
                if k != EMPTY {
                    self.place(k, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Same answers as a `HashMap` under any sequence of inserts, removes and lookups,
        /// with keys drawn from a few aligned ranges (so probe runs collide and wrap) and 0.
        #[test]
        fn matches_hashmap(ops in proptest::collection::vec((0u8..3, 0u64..200, 0u32..1000), 1..2000)) {
            let mut m = PtrMap::with_capacity(4);
            let mut model: HashMap<u64, u32> = HashMap::new();
            for (op, k, v) in ops {
                // Aligned addresses in two far-apart regions, plus address 0.
                let key = match k % 3 {
                    0 if k == 0 => 0,
                    0 => 0x7f00_0000_0000 + k * 512,
                    1 => 0x7f00_0020_0000 + k * (2 << 20),
                    _ => u64::MAX - k * 4096,
                };
                match op {
                    0 => {
                        if model.contains_key(&key) {
                            m.insert(key, v);
                        } else {
                            m.insert_new(key, v);
                        }
                        model.insert(key, v);
                    }
                    1 => prop_assert_eq!(m.remove(key), model.remove(&key)),
                    _ => prop_assert_eq!(m.get(key), model.get(&key).copied()),
                }
                prop_assert_eq!(m.len(), model.len());
            }
            for (k, v) in &model {
                prop_assert_eq!(m.get(*k), Some(*v));
            }
        }
    }

    /// Keys that all hash to one bucket: the overflow chain, removal inside it, and the
    /// rebuild that drops stale marks keep every answer right.
    #[test]
    fn overflow_chains_and_rebuilds() {
        let mut m = PtrMap::with_capacity(64);
        let target = m.home(512);
        let same: Vec<u64> = (1..)
            .map(|i: u64| i << 9)
            .filter(|&k| m.home(k) == target)
            .take(11)
            .collect();
        let mut model = HashMap::new();
        for (i, &k) in same.iter().enumerate() {
            m.insert(k, i as u32);
            model.insert(k, i as u32);
        }
        assert!(m.marked >= 2, "11 keys in one bucket of 4 mark two buckets");
        for round in 0..200u32 {
            let k = same[(round as usize * 7) % same.len()];
            assert_eq!(m.remove(k), model.remove(&k));
            for &q in &same {
                assert_eq!(m.get(q), model.get(&q).copied());
            }
            m.insert(k, round);
            model.insert(k, round);
            // Unrelated churn, so that stale marks pile up and force rebuilds.
            for j in 0..20u64 {
                let key = (1u64 << 40) + ((round as u64 * 20 + j) << 12);
                m.insert(key, j as u32);
                assert_eq!(m.remove(key), Some(j as u32));
            }
        }
        assert_eq!(m.len(), model.len());
        for (k, v) in &model {
            assert_eq!(m.get(*k), Some(*v));
        }
    }

    #[test]
    fn grows_and_keeps_everything() {
        let mut m = PtrMap::with_capacity(4);
        for i in 1..=10_000u64 {
            m.insert(i << 9, i as u32);
        }
        assert_eq!(m.len(), 10_000);
        for i in (1..=10_000u64).step_by(2) {
            assert_eq!(m.remove(i << 9), Some(i as u32));
        }
        for i in 1..=10_000u64 {
            let want = (i % 2 == 0).then_some(i as u32);
            assert_eq!(m.get(i << 9), want);
        }
        assert_eq!(m.remove(12345 << 9), None);
    }
}
