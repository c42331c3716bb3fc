//! The cpu backend's fused attention: softmax(q k^T * scale + mask) v, row by row.
//!
//! Design note: what PyTorch's fused kernels (flash, memory-efficient, cuDNN) compute, in f64
//! on host copies of the inputs: the op layer has already allocated every output on the
//! device as the chosen CUDA kernel would, so the kernel itself needs no device memory and
//! its scratch (a row of scores) lives in plain `Vec`s. The backward recomputes the weights
//! from the saved log-sum-exp, as the fused backward kernels do, so nothing of size
//! [T, S] is ever saved. Dropout keeps a weight when a hash of its coordinates is above `p`
//! ([`keep`]), the same function the CUDA kernel evaluates, so forward and backward agree.

use super::cpu::{load_f64, set};
use super::*;
use crate::error::TensorError;
use crate::layout::for_each_offset;

/// Whether dropout keeps attention weight number `idx` (a flat [B, H, T, S] index): a
/// SplitMix64 hash (`vramroom_alloc::rng::mix`) of the seed and the index, as a uniform
/// number in [0, 1), against `p`.
pub(crate) fn keep(seed: u64, idx: u64, p: f64) -> bool {
    use vramroom_alloc::rng::{mix, GOLDEN_GAMMA};
    let z = mix(seed ^ idx.wrapping_mul(GOLDEN_GAMMA));
    ((z >> 11) as f64 / (1u64 << 53) as f64) >= p
}

struct Dims {
    b: usize,
    hq: usize,
    hkv: usize,
    t: usize,
    s: usize,
    d: usize,
    dv: usize,
}

fn dims(a: &AttentionArgs) -> Result<Dims> {
    let (q, k, v) = (&a.q.layout.shape, &a.k.layout.shape, &a.v.layout.shape);
    if q.len() != 4 || k.len() != 4 || v.len() != 4 {
        return Err(TensorError::invalid("attention", "q, k, v must be 4-d"));
    }
    let dm = Dims {
        b: q[0],
        hq: q[1],
        hkv: k[1],
        t: q[2],
        s: k[2],
        d: q[3],
        dv: v[3],
    };
    if dm.hkv == 0 || !dm.hq.is_multiple_of(dm.hkv) {
        return Err(TensorError::invalid(
            "attention",
            format!("{} query heads for {} key heads", dm.hq, dm.hkv),
        ));
    }
    Ok(dm)
}

/// Writes `vals` (logical order) into `r`.
fn store_all(r: TRef, vals: &[f64]) {
    let mut i = 0;
    for_each_offset(r.layout, |o| {
        set(r, o, vals[i]);
        i += 1;
    });
}

/// Host copies of one forward's inputs and the scores of a row.
struct Inputs {
    dm: Dims,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    mask: Option<Vec<f64>>,
}

impl Inputs {
    fn load(a: &AttentionArgs) -> Result<Inputs> {
        Ok(Inputs {
            dm: dims(a)?,
            q: load_f64(a.q),
            k: load_f64(a.k),
            v: load_f64(a.v),
            mask: a.mask.map(load_f64),
        })
    }
    fn q_row(&self, b: usize, h: usize, i: usize) -> &[f64] {
        let d = &self.dm;
        let o = ((b * d.hq + h) * d.t + i) * d.d;
        &self.q[o..o + d.d]
    }
    fn k_row(&self, b: usize, kh: usize, j: usize) -> &[f64] {
        let d = &self.dm;
        let o = ((b * d.hkv + kh) * d.s + j) * d.d;
        &self.k[o..o + d.d]
    }
    fn v_row(&self, b: usize, kh: usize, j: usize) -> &[f64] {
        let d = &self.dm;
        let o = ((b * d.hkv + kh) * d.s + j) * d.dv;
        &self.v[o..o + d.dv]
    }
    /// Scaled, masked scores of query row (b, h, i) against every key.
    fn scores(&self, b: usize, h: usize, i: usize, p: &AttentionParams, out: &mut [f64]) {
        let d = &self.dm;
        let kh = h / (d.hq / d.hkv);
        let q = self.q_row(b, h, i);
        for (j, sj) in out.iter_mut().enumerate() {
            if p.causal && j > i {
                *sj = f64::NEG_INFINITY;
                continue;
            }
            let k = self.k_row(b, kh, j);
            let mut acc: f64 = q.iter().zip(k).map(|(x, y)| x * y).sum();
            acc *= p.scale;
            if let Some(m) = &self.mask {
                acc += m[((b * d.hq + h) * d.t + i) * d.s + j];
            }
            *sj = acc;
        }
    }
    /// The dropout factor of weight (b, h, i, j): 0 when dropped, 1/(1-p) when kept.
    fn drop_scale(&self, b: usize, h: usize, i: usize, j: usize, p: &AttentionParams) -> f64 {
        if p.dropout <= 0.0 {
            return 1.0;
        }
        let d = &self.dm;
        let idx = (((b * d.hq + h) * d.t + i) * d.s + j) as u64;
        if keep(p.seed, idx, p.dropout) {
            1.0 / (1.0 - p.dropout)
        } else {
            0.0
        }
    }
}

/// Row log-sum-exp of `s` (-inf when every key is masked).
fn logsumexp(s: &[f64]) -> f64 {
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

pub(super) fn forward(a: &AttentionArgs, p: &AttentionParams) -> Result<()> {
    let x = Inputs::load(a)?;
    let d = &x.dm;
    let mut out = vec![0.0; d.b * d.hq * d.t * d.dv];
    let mut lse = vec![0.0; d.b * d.hq * d.t];
    let mut s = vec![0.0; d.s];
    for b in 0..d.b {
        for h in 0..d.hq {
            let kh = h / (d.hq / d.hkv);
            for i in 0..d.t {
                x.scores(b, h, i, p, &mut s);
                let l = logsumexp(&s);
                let row = (b * d.hq + h) * d.t + i;
                lse[row] = l;
                if l == f64::NEG_INFINITY {
                    continue;
                }
                let o = &mut out[row * d.dv..(row + 1) * d.dv];
                for (j, sj) in s.iter().enumerate() {
                    let w = (sj - l).exp() * x.drop_scale(b, h, i, j, p);
                    if w == 0.0 {
                        continue;
                    }
                    for (oe, ve) in o.iter_mut().zip(x.v_row(b, kh, j)) {
                        *oe += w * ve;
                    }
                }
            }
        }
    }
    store_all(a.out, &out);
    if let Some(l) = a.lse {
        store_all(l, &lse);
    }
    Ok(())
}

pub(super) fn backward(a: &AttentionGradArgs, p: &AttentionParams) -> Result<()> {
    let x = Inputs::load(&a.fwd)?;
    let d = &x.dm;
    let lse = match a.fwd.lse {
        Some(l) => load_f64(l),
        None => {
            return Err(TensorError::Autograd(
                "attention backward needs the forward's logsumexp".into(),
            ))
        }
    };
    let gout = load_f64(a.gout);
    let delta = match a.delta {
        Some(dl) => load_f64(dl),
        None => {
            let out = load_f64(a.fwd.out);
            gout.chunks(d.dv.max(1))
                .zip(out.chunks(d.dv.max(1)))
                .map(|(g, o)| g.iter().zip(o).map(|(x, y)| x * y).sum())
                .collect()
        }
    };
    let mut gq = vec![0.0; x.q.len()];
    let mut gk = vec![0.0; x.k.len()];
    let mut gv = vec![0.0; x.v.len()];
    let mut s = vec![0.0; d.s];
    for b in 0..d.b {
        for h in 0..d.hq {
            let kh = h / (d.hq / d.hkv);
            for i in 0..d.t {
                let row = (b * d.hq + h) * d.t + i;
                if lse[row] == f64::NEG_INFINITY {
                    continue;
                }
                x.scores(b, h, i, p, &mut s);
                let go = &gout[row * d.dv..(row + 1) * d.dv];
                let q = x.q_row(b, h, i).to_vec();
                for (j, sj) in s.iter().enumerate() {
                    let pij = (sj - lse[row]).exp();
                    if pij == 0.0 {
                        continue;
                    }
                    let z = x.drop_scale(b, h, i, j, p);
                    let v = x.v_row(b, kh, j);
                    let dp = z * go.iter().zip(v).map(|(g, ve)| g * ve).sum::<f64>();
                    let ds = pij * (dp - delta[row]) * p.scale;
                    let k = x.k_row(b, kh, j);
                    let kb = ((b * d.hkv + kh) * d.s + j) * d.d;
                    for e in 0..d.d {
                        gq[row * d.d + e] += ds * k[e];
                        gk[kb + e] += ds * q[e];
                    }
                    let vb = ((b * d.hkv + kh) * d.s + j) * d.dv;
                    for e in 0..d.dv {
                        gv[vb + e] += pij * z * go[e];
                    }
                }
            }
        }
    }
    store_all(a.gq, &gq);
    store_all(a.gk, &gk);
    store_all(a.gv, &gv);
    Ok(())
}
