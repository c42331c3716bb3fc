//! The pointer map: allocated blocks by device address (PyTorch's `allocated_blocks`).
//!
//! Design note: every cache hit inserts one pointer and every free removes one, so this map is
//! on the hot path twice per pair. Its keys are device addresses (never iterated, never
//! ordered), its values 4-byte block ids, so a general-purpose `HashMap` spends most of its
//! time on machinery this use does not need (SIMD group probing, control bytes, generic
//! hashing). This is the textbook alternative: one flat array of (address, id), Fibonacci
//! hashing of the address (the multiply's high bits mix the aligned low bits away), linear
//! probing at a load factor of at most 1/4 (16 bytes a slot: 4096 live blocks take 256 KiB;
//! at 1/2, probe runs made the map a tenth of a mixed-size pair's instructions), and
//! backward-shift deletion, so there are no
//! tombstones and a probe never walks past an empty slot. Address 0 is the empty-slot marker;
//! a block at address 0 (no real device hands one out) is kept aside in `zero`. The table
//! only grows (doubling, when it would pass a quarter full), so a warm allocator's inserts and
//! removes never touch the host allocator.

use crate::block::{BlockId, NIL};

const EMPTY: u64 = 0;
/// 2^64 / φ: Fibonacci hashing.
const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

pub struct PtrMap {
    slots: Box<[(u64, BlockId)]>,
    mask: usize,
    /// 64 - log2(slots.len()): the hash is the top bits of `key * MUL`.
    shift: u32,
    len: usize,
    /// The value for address 0, or `NIL`.
    zero: BlockId,
}

impl PtrMap {
    /// Room for `n` entries before the first growth.
    pub fn with_capacity(n: usize) -> Self {
        let cap = (n.max(4) * 4).next_power_of_two();
        PtrMap {
            slots: vec![(EMPTY, NIL); cap].into_boxed_slice(),
            mask: cap - 1,
            shift: 64 - cap.trailing_zeros(),
            len: 0,
            zero: NIL,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(MUL) >> self.shift) as usize
    }

    /// The slot holding `key`, or the empty slot where it would go.
    #[inline(always)]
    fn probe(&self, key: u64) -> usize {
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key || k == EMPTY {
                return i;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<BlockId> {
        if key == EMPTY {
            return (self.zero != NIL).then_some(self.zero);
        }
        let (k, v) = self.slots[self.probe(key)];
        (k == key).then_some(v)
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
        let mut i = self.probe(key);
        if self.slots[i].0 == EMPTY {
            if (self.len + 1) * 4 > self.slots.len() {
                self.grow();
                i = self.probe(key);
            }
            self.len += 1;
        }
        self.slots[i] = (key, id);
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
        let mut hole = self.probe(key);
        let (k, v) = self.slots[hole];
        if k != key {
            return None;
        }
        self.len -= 1;
        // Backward shift: pull later entries of the run into the hole when the hole lies
        // between their home slot and where they sit, so every run stays unbroken.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let kj = self.slots[j].0;
            if kj == EMPTY {
                break;
            }
            let home = self.home(kj);
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = (EMPTY, NIL);
        Some(v)
    }

    #[cold]
    fn grow(&mut self) {
        let cap = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, vec![(EMPTY, NIL); cap].into_boxed_slice());
        self.mask = cap - 1;
        self.shift = 64 - cap.trailing_zeros();
        for &(k, v) in old.iter() {
            if k != EMPTY {
                let i = self.probe(k);
                self.slots[i] = (k, v);
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
                        m.insert(key, v);
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
