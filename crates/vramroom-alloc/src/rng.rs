//! The one seeded random generator of the workspace: SplitMix64.
//!
//! Design note: everything Vramroom draws at random (input sizes, request bodies, arrival
//! gaps, which recorded requests a what-if replays, dropout masks) must come out the same
//! for the same seed on every machine and every run, because a result that changes between
//! two runs of one command cannot be trusted. SplitMix64 is one add and two multiplies per
//! draw, passes BigCrush, and is trivially reproducible; nothing here needs more. It lives in
//! the lowest crate so every crate above shares it.

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

/// The golden-ratio increment of SplitMix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The generator of item `seq` of a seeded stream (a request, a worker), with a `salt`
    /// for independent streams of the same items: a pure function of the three, so any
    /// interleaving of the items draws the same values.
    pub fn for_request(seed: u64, seq: u64, salt: u64) -> Rng {
        let mut r = Rng(seed ^ seq.wrapping_mul(GOLDEN) ^ salt.rotate_left(29));
        r.next_u64();
        r
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo;
        if span == u64::MAX {
            return self.next_u64();
        }
        lo + self.next_u64() % (span + 1)
    }

    /// Uniform in `0..n` by multiply-shift (Lemire), without the modulo's division: the
    /// allocator benchmark draws in its timed loop. A different stream from [`Rng::below`].
    #[inline]
    pub fn below_fast(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// A standard normal draw (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// SplitMix64's mix of one value: a hash for "the draw of item `z`".
pub fn splitmix64(z: u64) -> u64 {
    Rng::new(z).next_u64()
}

/// SplitMix64's finalizer alone (no increment): the per-element hash the dropout kernels
/// compute on the GPU (`kernels.cu`), so the cpu backend's masks match them bit for bit.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The increment of the stream, for hashes that index it directly (`seed ^ k * GOLDEN`).
pub const GOLDEN_GAMMA: u64 = GOLDEN;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // The reference SplitMix64 stream from seed 0.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn ranges_stay_in_range() {
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            let v = r.range(3, 9);
            assert!((3..=9).contains(&v));
            assert!(r.below(5) < 5);
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(r.range(5, 5), 5);
        assert_eq!(r.below(0), 0);
    }
}
