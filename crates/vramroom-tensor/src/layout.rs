//! Shapes, strides and offsets.
//!
//! Design note: strides are in elements and never negative (as in PyTorch). Views are pure
//! layout arithmetic here; whether two layouts may alias is the op layer's business.

use crate::error::{Result, TensorError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1].max(1);
    }
    s
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The element count of `shape`, or `None` when it does not fit in `usize`. Every
/// allocation goes through this ([`crate::Tensor::empty`]): a shape that wraps (a config's
/// `vocab_size` = 2^58 + 1000 times a hidden size) must be refused, not sized as its
/// remainder.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize], op: &'static str) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(TensorError::shape(
                op,
                format!("shapes {a:?} and {b:?} cannot be broadcast"),
            ));
        };
    }
    Ok(out)
}

impl Layout {
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= self.shape[i];
        }
        true
    }
    /// Highest element index touched + 1 (relative to the storage start).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(d, s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }
    /// Broadcast to `shape` with zero strides (PyTorch's `expand`).
    pub fn expand(&self, shape: &[usize]) -> Result<Layout> {
        if shape.len() < self.shape.len() {
            return Err(TensorError::shape(
                "expand",
                format!("cannot expand {:?} to {:?}", self.shape, shape),
            ));
        }
        let lead = shape.len() - self.shape.len();
        let mut strides = vec![0; shape.len()];
        for i in 0..shape.len() {
            if i < lead {
                continue;
            }
            let d = self.shape[i - lead];
            if d == shape[i] {
                strides[i] = self.strides[i - lead];
            } else if d == 1 {
                strides[i] = 0;
            } else {
                return Err(TensorError::shape(
                    "expand",
                    format!("cannot expand {:?} to {:?}", self.shape, shape),
                ));
            }
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }
    pub fn permute(&self, dims: &[usize]) -> Result<Layout> {
        let n = self.ndim();
        let mut seen = vec![false; n];
        if dims.len() != n {
            return Err(TensorError::invalid(
                "permute",
                format!("{} dims for a {n}-d tensor", dims.len()),
            ));
        }
        for &d in dims {
            if d >= n || seen[d] {
                return Err(TensorError::invalid(
                    "permute",
                    format!("bad permutation {dims:?}"),
                ));
            }
            seen[d] = true;
        }
        Ok(Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        })
    }
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        if dim >= self.ndim() || start + len > self.shape[dim] {
            return Err(TensorError::IndexOutOfRange {
                op: "narrow",
                msg: format!(
                    "dim {dim}, start {start}, length {len} for shape {:?}",
                    self.shape
                ),
            });
        }
        let mut l = self.clone();
        l.offset += start * self.strides[dim];
        l.shape[dim] = len;
        Ok(l)
    }
    /// A view with a new shape without copying, when the strides allow it (`Tensor.view`).
    pub fn view(&self, shape: &[usize]) -> Option<Layout> {
        if numel(shape) != self.numel() {
            return None;
        }
        if self.is_contiguous() {
            return Some(Layout {
                shape: shape.to_vec(),
                strides: contiguous_strides(shape),
                offset: self.offset,
            });
        }
        // PyTorch's computeStride: split the old dims into chunks of contiguous memory and
        // map the new dims onto them.
        let old: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(d, _)| **d != 1)
            .map(|(d, s)| (*d, *s))
            .collect();
        let mut new_strides = vec![0usize; shape.len()];
        let mut oi = 0usize;
        let mut ni = 0usize;
        while ni < shape.len() {
            if shape[ni] == 1 {
                new_strides[ni] = 1;
                ni += 1;
                continue;
            }
            if oi >= old.len() {
                return None;
            }
            // A chunk of old dims that are mutually contiguous.
            let chunk_start = oi;
            let mut chunk_numel = old[oi].0;
            while oi + 1 < old.len() && old[oi].1 == old[oi + 1].0 * old[oi + 1].1 {
                oi += 1;
                chunk_numel *= old[oi].0;
            }
            let base_stride = old[oi].1;
            oi += 1;
            let _ = chunk_start;
            // New dims must multiply up to exactly this chunk.
            let mut acc = 1usize;
            let first = ni;
            while ni < shape.len() && acc < chunk_numel {
                acc *= shape[ni];
                ni += 1;
            }
            if acc != chunk_numel {
                return None;
            }
            let mut s = base_stride;
            for k in (first..ni).rev() {
                new_strides[k] = s;
                s *= shape[k];
            }
        }
        if oi != old.len() {
            return None;
        }
        Some(Layout {
            shape: shape.to_vec(),
            strides: new_strides,
            offset: self.offset,
        })
    }
}

impl Layout {
    /// Whether the elements fill `numel` consecutive slots exactly once in some dim order
    /// (PyTorch's `is_non_overlapping_and_dense`).
    pub fn is_non_overlapping_and_dense(&self) -> bool {
        let mut dims: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(d, _)| **d != 1)
            .map(|(d, s)| (*d, *s))
            .collect();
        dims.sort_by_key(|&(d, s)| (s, d));
        let mut expected = 1;
        for (d, s) in dims {
            if s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// A dense layout of `shape` whose dims are laid out in `perm` order, fastest first.
    fn dense_in_order(shape: &[usize], perm: &[usize]) -> Layout {
        let mut strides = vec![0; shape.len()];
        let mut s = 1;
        for &d in perm {
            strides[d] = s;
            s *= shape[d].max(1);
        }
        Layout {
            shape: shape.to_vec(),
            strides,
            offset: 0,
        }
    }

    /// The layout PyTorch's TensorIterator allocates for the output of an elementwise op of
    /// `shape` over `inputs` (each already expanded to `shape`): contiguous when every input
    /// is; the inputs' own strides when they all share them and are dense; otherwise dense,
    /// with the dims ordered by the inputs' strides (the first input that orders two dims
    /// decides; broadcast dims do not vote). So `q * cos` of a transposed `q` comes out in
    /// `q`'s memory order, which decides whether a later `.contiguous()` copies.
    pub fn iter_output(shape: &[usize], inputs: &[&Layout]) -> Layout {
        if inputs.iter().all(|l| l.is_contiguous()) {
            return Layout::contiguous(shape);
        }
        if let Some(first) = inputs.first() {
            if first.shape == shape
                && first.is_non_overlapping_and_dense()
                && inputs.iter().all(|l| l.strides == first.strides)
            {
                return Layout {
                    shape: shape.to_vec(),
                    strides: first.strides.clone(),
                    offset: 0,
                };
            }
        }
        let nd = shape.len();
        // 1: dim a goes after (is slower than) dim b; -1: before; 0: no opinion.
        let should_swap = |a: usize, b: usize| -> i32 {
            for l in inputs {
                let (sa, sb) = (l.strides[a], l.strides[b]);
                if sa == 0 || sb == 0 {
                    continue;
                }
                if sa < sb {
                    return -1;
                }
                if sa > sb {
                    return 1;
                }
                if shape[a] > shape[b] {
                    return 1;
                }
            }
            0
        };
        // PyTorch's insertion sort that tolerates ambiguous comparisons.
        let mut perm: Vec<usize> = (0..nd).rev().collect();
        for i in 1..nd {
            let mut d1 = i;
            for d0 in (0..i).rev() {
                match should_swap(perm[d0], perm[d1]) {
                    c if c > 0 => {
                        perm.swap(d0, d1);
                        d1 = d0;
                    }
                    c if c < 0 => break,
                    _ => {}
                }
            }
        }
        Layout::dense_in_order(shape, &perm)
    }

    /// The layout `empty_like(x)` (memory format `preserve`) gives: `x`'s strides when `x`
    /// is dense, contiguous otherwise. `.to(dtype)` allocates this way.
    pub fn like_preserve(&self) -> Layout {
        if self.is_non_overlapping_and_dense() {
            Layout {
                shape: self.shape.clone(),
                strides: self.strides.clone(),
                offset: 0,
            }
        } else {
            Layout::contiguous(&self.shape)
        }
    }
}

/// Calls `f` with the element offset of every element, in row-major logical order.
#[inline]
pub fn for_each_offset(l: &Layout, mut f: impl FnMut(usize)) {
    let n = l.numel();
    if n == 0 {
        return;
    }
    if l.is_contiguous() {
        for i in 0..n {
            f(l.offset + i);
        }
        return;
    }
    let nd = l.ndim();
    if nd == 0 {
        f(l.offset);
        return;
    }
    let last = nd - 1;
    let (ld, ls) = (l.shape[last], l.strides[last]);
    let mut idx = vec![0usize; nd];
    let mut base = l.offset;
    loop {
        let mut o = base;
        for _ in 0..ld {
            f(o);
            o += ls;
        }
        // Odometer over the outer dims.
        let mut d = last;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            base += l.strides[d];
            if idx[d] < l.shape[d] {
                break;
            }
            base -= l.strides[d] * l.shape[d];
            idx[d] = 0;
        }
    }
}

/// Normalises a possibly negative dim.
pub fn norm_dim(dim: isize, ndim: usize, op: &'static str) -> Result<usize> {
    let n = ndim as isize;
    let d = if dim < 0 { dim + n } else { dim };
    if d < 0 || d >= n.max(1) {
        return Err(TensorError::IndexOutOfRange {
            op,
            msg: format!("dim {dim} for a {ndim}-d tensor"),
        });
    }
    Ok(d as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_follows_pytorch_stride_rules() {
        let l = Layout::contiguous(&[2, 3, 4]);
        // A transposed tensor can merge only the dims that stay contiguous.
        let t = l.permute(&[1, 0, 2]).unwrap();
        assert!(t.view(&[6, 4]).is_none());
        assert_eq!(t.view(&[3, 2, 2, 2]).unwrap().strides, vec![4, 12, 2, 1]);
        let n = l.narrow(2, 1, 2).unwrap();
        assert!(n.view(&[12]).is_none());
        assert_eq!(n.view(&[2, 3, 2, 1]).unwrap().offset, 1);
        assert_eq!(l.view(&[4, 6]).unwrap().strides, vec![6, 1]);
    }

    #[test]
    fn broadcast_and_expand() {
        assert_eq!(
            broadcast_shapes(&[3, 1], &[2, 1, 4], "t").unwrap(),
            vec![2, 3, 4]
        );
        assert!(broadcast_shapes(&[3], &[4], "t").is_err());
        let e = Layout::contiguous(&[3, 1]).expand(&[2, 3, 4]).unwrap();
        assert_eq!(e.strides, vec![0, 1, 0]);
        let mut offs = vec![];
        for_each_offset(&e, |o| offs.push(o));
        assert_eq!(offs.len(), 24);
        assert_eq!(&offs[..8], &[0, 0, 0, 0, 1, 1, 1, 1]);
    }

    #[test]
    fn elementwise_outputs_follow_the_inputs_memory_order() {
        // q: [B, H, T, D] viewed from a [B, T, H, D] buffer (a transpose).
        let q = Layout::contiguous(&[2, 5, 3, 4])
            .permute(&[0, 2, 1, 3])
            .unwrap();
        let cos = Layout::contiguous(&[1, 1, 5, 4])
            .expand(&[2, 3, 5, 4])
            .unwrap();
        let out = Layout::iter_output(&[2, 3, 5, 4], &[&q, &cos]);
        assert_eq!(out.strides, q.strides);
        // Broadcast first, transposed second: the transposed input still decides.
        let out = Layout::iter_output(&[2, 3, 5, 4], &[&cos, &q]);
        assert_eq!(out.strides, q.strides);
        // All contiguous: contiguous.
        let c = Layout::contiguous(&[2, 3, 5, 4]);
        assert!(Layout::iter_output(&[2, 3, 5, 4], &[&c, &cos]).is_contiguous());
        // A contiguous first input decides over a transposed second one.
        assert!(Layout::iter_output(&[2, 3, 5, 4], &[&c, &q]).is_contiguous());
        // A slice of a transposed tensor (not dense) keeps the order, densely.
        let half = q.narrow(3, 0, 2).unwrap();
        let o = Layout::iter_output(&[2, 3, 5, 2], &[&half]);
        assert_eq!(o.strides, vec![30, 2, 6, 1]);
        assert!(!half.is_non_overlapping_and_dense());
        assert!(q.is_non_overlapping_and_dense());
    }
}
