//! Reductions.
//!
//! Design note: as PyTorch, `SumBackward` hands back an expanded *view* of the gradient (no
//! allocation) while `MeanBackward` divides and so allocates one tensor of the input size.

use super::*;
use crate::backend::ReduceOp;
use crate::layout::norm_dim;

impl Tensor {
    fn reduce_raw(&self, op: ReduceOp, dims: &[usize], keepdim: bool) -> Result<Tensor> {
        need_float(self, "reduce")?;
        let mut kshape = self.shape().to_vec();
        for &d in dims {
            if d >= kshape.len() {
                return Err(TensorError::IndexOutOfRange {
                    op: "reduce",
                    msg: format!("dim {d} for shape {:?}", self.shape()),
                });
            }
            kshape[d] = 1;
        }
        let out = Tensor::empty(&kshape, self.dtype(), self.device())?;
        self.device()
            .backend()
            .reduce(op, self.kref(), dims, out.kref())?;
        if keepdim {
            Ok(out)
        } else {
            let shape: Vec<usize> = self
                .shape()
                .iter()
                .enumerate()
                .filter(|(i, _)| !dims.contains(i))
                .map(|(_, d)| *d)
                .collect();
            out.view_raw(&shape)
        }
    }

    /// Sum over `dims` (negative allowed via [`Tensor::sum_dim`]).
    pub fn sum_dims(&self, dims: &[usize], keepdim: bool) -> Result<Tensor> {
        let out = self.reduce_raw(ReduceOp::Sum, dims, keepdim)?;
        if crate::autograd::should_record(&[self]) {
            let shape = self.shape().to_vec();
            let dims = dims.to_vec();
            record("SumBackward1", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "SumBackward1")?;
                let g = if keepdim { g } else { g.unsqueeze_dims(&dims)? };
                Ok(vec![Some(g.expand(&shape)?)])
            });
        }
        Ok(out)
    }
    pub fn sum_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = norm_dim(dim, self.ndim(), "sum")?;
        self.sum_dims(&[d], keepdim)
    }
    /// Sum of all elements, a 0-d tensor.
    pub fn sum(&self) -> Result<Tensor> {
        let dims: Vec<usize> = (0..self.ndim()).collect();
        let out = self.reduce_raw(ReduceOp::Sum, &dims, false)?;
        if crate::autograd::should_record(&[self]) {
            let shape = self.shape().to_vec();
            record("SumBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "SumBackward0")?;
                Ok(vec![Some(g.expand(&shape)?)])
            });
        }
        Ok(out)
    }
    pub fn mean_dims(&self, dims: &[usize], keepdim: bool) -> Result<Tensor> {
        let out = self.reduce_raw(ReduceOp::Mean, dims, keepdim)?;
        if crate::autograd::should_record(&[self]) {
            let shape = self.shape().to_vec();
            let dims = dims.to_vec();
            let count: usize = dims.iter().map(|&d| shape[d]).product();
            record("MeanBackward1", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "MeanBackward1")?;
                let g = if keepdim { g } else { g.unsqueeze_dims(&dims)? };
                Ok(vec![Some(g.expand(&shape)?.div_scalar(count as f64)?)])
            });
        }
        Ok(out)
    }
    pub fn mean_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = norm_dim(dim, self.ndim(), "mean")?;
        self.mean_dims(&[d], keepdim)
    }
    pub fn mean(&self) -> Result<Tensor> {
        let dims: Vec<usize> = (0..self.ndim()).collect();
        let out = self.reduce_raw(ReduceOp::Mean, &dims, false)?;
        if crate::autograd::should_record(&[self]) {
            let shape = self.shape().to_vec();
            let n = self.numel().max(1);
            record("MeanBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "MeanBackward0")?;
                Ok(vec![Some(g.expand(&shape)?.div_scalar(n as f64)?)])
            });
        }
        Ok(out)
    }
    /// Max over one dim (values only, no gradient).
    pub fn amax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = norm_dim(dim, self.ndim(), "amax")?;
        let _g = crate::autograd::no_grad();
        self.reduce_raw(ReduceOp::Max, &[d], keepdim)
    }
    /// `torch.argmax(x, dim, keepdim)`: int64 indices of the first maximum (no gradient).
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        need_float(self, "argmax")?;
        let d = norm_dim(dim, self.ndim(), "argmax")?;
        let mut kshape = self.shape().to_vec();
        kshape[d] = 1;
        let out = Tensor::empty(&kshape, DType::I64, self.device())?;
        self.device()
            .backend()
            .reduce(ReduceOp::ArgMax, self.kref(), &[d], out.kref())?;
        if keepdim {
            return Ok(out);
        }
        let mut shape = self.shape().to_vec();
        shape.remove(d);
        out.view_raw(&shape)
    }
    pub fn amin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = norm_dim(dim, self.ndim(), "amin")?;
        let _g = crate::autograd::no_grad();
        self.reduce_raw(ReduceOp::Min, &[d], keepdim)
    }
}
