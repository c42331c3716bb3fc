//! Views and shape ops: reshape/view, transpose, permute, narrow, expand, squeeze,
//! unsqueeze, flatten, contiguous, cat, split/chunk.
//!
//! Design note: views allocate nothing and their backward is again a view whenever
//! PyTorch's is (transpose, permute, view); `narrow` backward allocates a zero tensor of the
//! input's size, as `SliceBackward0` does.

use super::*;
use crate::layout::{norm_dim, numel, Layout};

impl Tensor {
    /// A view over the same storage with another layout, no autograd.
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor::from_parts(self.storage().clone(), layout, self.dtype())
    }

    pub(crate) fn view_raw(&self, shape: &[usize]) -> Result<Tensor> {
        let l = self.layout().view(shape).ok_or_else(|| {
            TensorError::shape(
                "view",
                format!(
                    "view size {shape:?} is not compatible with input size {:?} and stride {:?}; use reshape",
                    self.shape(),
                    self.strides()
                ),
            )
        })?;
        Ok(self.with_layout(l))
    }

    fn resolve_shape(&self, shape: &[isize]) -> Result<Vec<usize>> {
        let known: usize = shape
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .product();
        let infer = shape.iter().filter(|&&d| d < 0).count();
        if infer > 1 {
            return Err(TensorError::invalid(
                "view",
                "only one dimension can be inferred",
            ));
        }
        let mut out = Vec::with_capacity(shape.len());
        for &d in shape {
            if d < 0 {
                if known == 0 || !self.numel().is_multiple_of(known) {
                    return Err(TensorError::shape(
                        "view",
                        format!(
                            "shape {shape:?} is invalid for input of size {}",
                            self.numel()
                        ),
                    ));
                }
                out.push(self.numel() / known);
            } else {
                out.push(d as usize);
            }
        }
        if numel(&out) != self.numel() {
            return Err(TensorError::shape(
                "view",
                format!(
                    "shape {shape:?} is invalid for input of size {}",
                    self.numel()
                ),
            ));
        }
        Ok(out)
    }

    /// `view` with `-1` allowed for one dim; errors when the strides do not allow a view.
    pub fn view(&self, shape: &[isize]) -> Result<Tensor> {
        let shape = self.resolve_shape(shape)?;
        let out = self.view_raw(&shape)?;
        self.record_view(&out);
        Ok(out)
    }

    fn record_view(&self, out: &Tensor) {
        if crate::autograd::should_record(&[self]) {
            let shape = self.shape().to_vec();
            record("ViewBackward0", &[Some(self)], &[out], move |g, _| {
                Ok(vec![Some(grad0(g, "ViewBackward0")?.reshape(&shape)?)])
            });
        }
    }

    /// `reshape`: a view when possible, otherwise a contiguous copy first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape) != self.numel() {
            return Err(TensorError::shape(
                "reshape",
                format!(
                    "shape {shape:?} is invalid for input of size {}",
                    self.numel()
                ),
            ));
        }
        if self.shape() == shape {
            return Ok(self.clone());
        }
        match self.layout().view(shape) {
            Some(l) => {
                let out = self.with_layout(l);
                self.record_view(&out);
                Ok(out)
            }
            // Copy, then view the copy: never recurse (a zero-element tensor's layout may
            // refuse the view even when contiguous, and recursing overflowed the stack on
            // a config with `n_inner` = 0).
            None => {
                let c = self.contiguous()?;
                let l = match c.layout().view(shape) {
                    Some(l) => l,
                    None if c.numel() == 0 => crate::layout::Layout::contiguous(shape),
                    None => {
                        return Err(TensorError::shape(
                            "reshape",
                            format!("cannot view {:?} as {shape:?}", c.shape()),
                        ))
                    }
                };
                let out = c.with_layout(l);
                c.record_view(&out);
                Ok(out)
            }
        }
    }
    /// `reshape` with `-1` allowed for one dim.
    pub fn reshape_infer(&self, shape: &[isize]) -> Result<Tensor> {
        let s = self.resolve_shape(shape)?;
        self.reshape(&s)
    }

    /// `flatten(start_dim, end_dim)` (inclusive, negative allowed).
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.ndim() == 0 {
            return self.reshape(&[1]);
        }
        let s = norm_dim(start, self.ndim(), "flatten")?;
        let e = norm_dim(end, self.ndim(), "flatten")?;
        if s > e {
            return Err(TensorError::invalid("flatten", "start_dim after end_dim"));
        }
        let mut shape: Vec<usize> = self.shape()[..s].to_vec();
        shape.push(self.shape()[s..=e].iter().product());
        shape.extend_from_slice(&self.shape()[e + 1..]);
        self.reshape(&shape)
    }

    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let out = self.with_layout(self.layout().permute(dims)?);
        if crate::autograd::should_record(&[self]) {
            let mut inv = vec![0; dims.len()];
            for (i, &d) in dims.iter().enumerate() {
                inv[d] = i;
            }
            record("PermuteBackward0", &[Some(self)], &[&out], move |g, _| {
                Ok(vec![Some(grad0(g, "PermuteBackward0")?.permute(&inv)?)])
            });
        }
        Ok(out)
    }
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let a = norm_dim(d0, self.ndim(), "transpose")?;
        let b = norm_dim(d1, self.ndim(), "transpose")?;
        let mut dims: Vec<usize> = (0..self.ndim()).collect();
        dims.swap(a, b);
        let out = self.with_layout(self.layout().permute(&dims)?);
        if crate::autograd::should_record(&[self]) {
            record("TransposeBackward0", &[Some(self)], &[&out], move |g, _| {
                Ok(vec![Some(
                    grad0(g, "TransposeBackward0")?.transpose(a as isize, b as isize)?,
                )])
            });
        }
        Ok(out)
    }
    /// Matrix transpose of a 2-d tensor.
    pub fn t(&self) -> Result<Tensor> {
        need_ndim(self, 2, "t")?;
        self.transpose(0, 1)
    }

    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let out = self.with_layout(self.layout().expand(shape)?);
        if crate::autograd::should_record(&[self]) {
            let s = self.shape().to_vec();
            record("ExpandBackward0", &[Some(self)], &[&out], move |g, _| {
                Ok(vec![Some(grad0(g, "ExpandBackward0")?.sum_to(&s)?)])
            });
        }
        Ok(out)
    }

    /// `narrow(dim, start, len)`: the slice `[start, start+len)` along `dim`.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = norm_dim(dim, self.ndim(), "narrow")?;
        let out = self.with_layout(self.layout().narrow(d, start, len)?);
        if crate::autograd::should_record(&[self]) {
            let shape = self.shape().to_vec();
            let dtype = self.dtype();
            let device = self.device().clone();
            record("SliceBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "SliceBackward0")?;
                let gx = Tensor::zeros(&shape, dtype, &device)?;
                let l = gx.layout().narrow(d, start, len)?;
                gx.with_layout(l).copy_(&g)?;
                Ok(vec![Some(gx)])
            });
        }
        Ok(out)
    }
    /// `x[..., i, ...]` along `dim`, removing it.
    pub fn select(&self, dim: isize, index: usize) -> Result<Tensor> {
        let d = norm_dim(dim, self.ndim(), "select")?;
        self.narrow(d as isize, index, 1)?.squeeze_dim(d as isize)
    }
    /// Splits into pieces of `size` along `dim` (views).
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = norm_dim(dim, self.ndim(), "split")?;
        if size == 0 {
            return Err(TensorError::invalid("split", "split size 0"));
        }
        let n = self.shape()[d];
        (0..n.div_ceil(size))
            .map(|i| self.narrow(d as isize, i * size, size.min(n - i * size)))
            .collect()
    }
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = norm_dim(dim, self.ndim(), "chunk")?;
        let n = self.shape()[d];
        self.split(n.div_ceil(chunks.max(1)).max(1), dim)
    }

    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let d = norm_dim(dim, self.ndim() + 1, "unsqueeze")?;
        let mut shape = self.shape().to_vec();
        shape.insert(d, 1);
        self.reshape(&shape)
    }
    pub(crate) fn unsqueeze_dims(&self, dims: &[usize]) -> Result<Tensor> {
        let mut sorted = dims.to_vec();
        sorted.sort_unstable();
        let mut shape = self.shape().to_vec();
        for d in sorted {
            if d > shape.len() {
                return Err(TensorError::invalid("unsqueeze", format!("dim {d}")));
            }
            shape.insert(d, 1);
        }
        self.reshape(&shape)
    }
    pub fn squeeze_dim(&self, dim: isize) -> Result<Tensor> {
        let d = norm_dim(dim, self.ndim(), "squeeze")?;
        if self.shape()[d] != 1 {
            return Ok(self.clone());
        }
        let mut shape = self.shape().to_vec();
        shape.remove(d);
        self.reshape(&shape)
    }

    /// A contiguous tensor: `self` when already contiguous, else a copy (`CloneBackward`).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.clone_tensor()
    }
    /// `torch.clone`: always a new contiguous copy.
    pub fn clone_tensor(&self) -> Result<Tensor> {
        let out = self.deep_copy()?;
        if crate::autograd::should_record(&[self]) {
            record("CloneBackward0", &[Some(self)], &[&out], move |g, _| {
                Ok(vec![Some(grad0(g, "CloneBackward0")?)])
            });
        }
        Ok(out)
    }
    /// A copy converted to `dtype` (`.to(dtype)`); the same tensor when already that dtype.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        // `_to_copy` allocates `empty_like(self)`: a dense input keeps its memory order.
        let out = Tensor::empty_dense(self.layout().like_preserve(), dtype, self.device())?;
        self.device().backend().copy(self.kref(), out.kref())?;
        if dtype.is_float() && crate::autograd::should_record(&[self]) {
            let src = self.dtype();
            record("ToCopyBackward0", &[Some(self)], &[&out], move |g, _| {
                Ok(vec![Some(grad0(g, "ToCopyBackward0")?.to_dtype(src)?)])
            });
        }
        Ok(out)
    }

    /// `torch.cat(tensors, dim)`.
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| TensorError::invalid("cat", "expected a non-empty list of tensors"))?;
        let d = norm_dim(dim, first.ndim(), "cat")?;
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for t in tensors {
            same_device(first, t, "cat")?;
            same_dtype(first, t, "cat")?;
            if t.ndim() != first.ndim()
                || t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .any(|(i, (a, b))| i != d && a != b)
            {
                return Err(TensorError::shape(
                    "cat",
                    format!(
                        "sizes {:?} and {:?} differ outside dim {d}",
                        first.shape(),
                        t.shape()
                    ),
                ));
            }
            shape[d] += t.shape()[d];
        }
        let out = Tensor::empty(&shape, first.dtype(), first.device())?;
        let mut at = 0;
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in tensors {
            let n = t.shape()[d];
            let l = out.layout().narrow(d, at, n)?;
            out.device()
                .backend()
                .copy(t.kref(), out.with_layout(l).kref())?;
            sizes.push(n);
            at += n;
        }
        let ins: Vec<&Tensor> = tensors.to_vec();
        if crate::autograd::should_record(&ins) {
            let inputs: Vec<Option<&Tensor>> = ins.iter().map(|t| Some(*t)).collect();
            record("CatBackward0", &inputs, &[&out], move |g, needs| {
                let g = grad0(g, "CatBackward0")?;
                let mut at = 0;
                let mut res = Vec::with_capacity(sizes.len());
                for (i, &n) in sizes.iter().enumerate() {
                    res.push(if needs[i] {
                        Some(g.narrow(d as isize, at, n)?)
                    } else {
                        None
                    });
                    at += n;
                }
                Ok(res)
            });
        }
        Ok(out)
    }
}
