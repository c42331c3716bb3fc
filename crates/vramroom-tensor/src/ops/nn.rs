//! Softmax, log-softmax, cross-entropy, embedding, dropout.
//!
//! Design note: `cross_entropy` is PyTorch's composite `log_softmax` + `nll_loss`: the
//! log-probabilities [N, C] are saved, `nll_loss` allocates a scalar output and a scalar
//! total weight; backward allocates a zero-filled [N, C] for nll and a second [N, C] for
//! log-softmax. `dropout` in training allocates a bool mask and the output, and returns its
//! input untouched (no allocation) when not training or `p == 0`.

use super::*;
use crate::autograd::Saved;
use crate::layout::norm_dim;

impl Tensor {
    fn softmax_impl(&self, dim: isize, log: bool) -> Result<Tensor> {
        let name = if log {
            "LogSoftmaxBackward0"
        } else {
            "SoftmaxBackward0"
        };
        need_float(self, name)?;
        let d = norm_dim(dim, self.ndim(), "softmax")?;
        let x = self.contiguous()?;
        let out = Tensor::empty(x.shape(), x.dtype(), x.device())?;
        x.device().backend().softmax(x.kref(), d, log, out.kref())?;
        if crate::autograd::should_record(&[self]) {
            let sy = Saved::new(&out);
            record(name, &[Some(&x)], &[&out], move |g, _| {
                let gy = grad0(g, name)?.contiguous()?;
                let y = sy.get(name)?;
                let gx = Tensor::empty(y.shape(), y.dtype(), y.device())?;
                y.device()
                    .backend()
                    .softmax_backward(gy.kref(), y.kref(), d, log, gx.kref())?;
                Ok(vec![Some(gx)])
            });
        }
        Ok(out)
    }
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, false)
    }
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, true)
    }
}

/// How a loss reduces over the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    Mean,
    Sum,
}

/// `F.nll_loss(logp [N, C], target [N] int64, ignore_index)`.
pub fn nll_loss(
    logp: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    ignore_index: i64,
) -> Result<Tensor> {
    const OP: &str = "nll_loss";
    need_float(logp, OP)?;
    need_dtype(target, DType::I64, OP)?;
    same_device(logp, target, OP)?;
    need_ndim(logp, 2, OP)?;
    if target.shape() != [logp.shape()[0]] {
        return Err(TensorError::shape(
            OP,
            format!(
                "expected target of shape [{}], got {:?}",
                logp.shape()[0],
                target.shape()
            ),
        ));
    }
    let mean = reduction == Reduction::Mean;
    let out = Tensor::empty(&[], logp.dtype(), logp.device())?;
    let tw = Tensor::empty(&[], logp.dtype(), logp.device())?;
    logp.device().backend().nll_loss(
        logp.kref(),
        target.kref(),
        mean,
        ignore_index,
        out.kref(),
        tw.kref(),
    )?;
    if crate::autograd::should_record(&[logp]) {
        let sx = Saved::new(logp);
        let st = Saved::new(target);
        let stw = Saved::new(&tw);
        drop(tw);
        record("NllLossBackward0", &[Some(logp)], &[&out], move |g, _| {
            const N: &str = "NllLossBackward0";
            let gy = grad0(g, N)?;
            let x = sx.get(N)?;
            let gx = Tensor::zeros(x.shape(), x.dtype(), x.device())?;
            x.device().backend().nll_loss_backward(
                gy.kref(),
                st.get(N)?.kref(),
                stw.get(N)?.kref(),
                mean,
                ignore_index,
                gx.kref(),
            )?;
            Ok(vec![Some(gx)])
        });
    }
    Ok(out)
}

/// `F.cross_entropy(logits [N, C], target [N])`, mean over non-ignored targets.
pub fn cross_entropy(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    cross_entropy_with(logits, target, Reduction::Mean, -100)
}

pub fn cross_entropy_with(
    logits: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    ignore_index: i64,
) -> Result<Tensor> {
    need_ndim(logits, 2, "cross_entropy")?;
    let logp = logits.log_softmax(1)?;
    nll_loss(&logp, target, reduction, ignore_index)
}

/// `F.embedding(idx, weight)`: rows of `weight [V, D]` for int64 `idx` of any shape.
pub fn embedding(weight: &Tensor, idx: &Tensor) -> Result<Tensor> {
    const OP: &str = "embedding";
    need_ndim(weight, 2, OP)?;
    need_dtype(idx, DType::I64, OP)?;
    same_device(weight, idx, OP)?;
    let mut shape = idx.shape().to_vec();
    shape.push(weight.shape()[1]);
    // `embedding` is `weight.index_select(0, indices.reshape(-1))`: an expanded or strided
    // index is copied first and freed after the kernel (the backward keeps the original).
    let idx_c = idx.contiguous()?;
    let out = Tensor::empty(&shape, weight.dtype(), weight.device())?;
    weight
        .device()
        .backend()
        .embedding(weight.kref(), idx_c.kref(), out.kref())?;
    drop(idx_c);
    if crate::autograd::should_record(&[weight]) {
        let si = Saved::new(idx);
        let ws = weight.shape().to_vec();
        let (dt, dev) = (weight.dtype(), weight.device().clone());
        record(
            "EmbeddingBackward0",
            &[Some(weight)],
            &[&out],
            move |g, _| {
                const N: &str = "EmbeddingBackward0";
                let gy = grad0(g, N)?;
                let gw = Tensor::zeros(&ws, dt, &dev)?;
                dev.backend()
                    .embedding_backward(gy.kref(), si.get(N)?.kref(), gw.kref(), None)?;
                Ok(vec![Some(gw)])
            },
        );
    }
    Ok(out)
}

/// `F.dropout(x, p, training)`.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    const OP: &str = "dropout";
    if !(0.0..=1.0).contains(&p) {
        return Err(TensorError::invalid(
            OP,
            format!("dropout probability has to be between 0 and 1, but got {p}"),
        ));
    }
    if !training || p == 0.0 || x.numel() == 0 {
        return Ok(x.clone());
    }
    need_float(x, OP)?;
    // `dropout_cuda` allocates the mask first, then the output.
    let mask = Tensor::empty(x.shape(), DType::Bool, x.device())?;
    let out = Tensor::empty(x.shape(), x.dtype(), x.device())?;
    let dev = x.device();
    dev.backend()
        .dropout(x.kref(), p, dev.next_seed(), out.kref(), mask.kref())?;
    if crate::autograd::should_record(&[x]) {
        let sm = Saved::new(&mask);
        drop(mask);
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        record(
            "NativeDropoutBackward0",
            &[Some(x)],
            &[&out],
            move |g, _| {
                const N: &str = "NativeDropoutBackward0";
                let gy = grad0(g, N)?;
                let m = sm.get(N)?;
                // One fused kernel on CUDA (grad * mask * scale): one allocation.
                let gx = Tensor::empty(gy.shape(), gy.dtype(), gy.device())?;
                let be = gy.device().backend();
                be.masked_fill(gy.kref(), m.kref(), 0.0, gx.kref())?;
                // mask is "keep"; masked_fill zeroed the kept ones, so recompute: keep - zeroed.
                be.binary(
                    crate::backend::BinaryOp::Sub,
                    gy.kref(),
                    gx.kref(),
                    gx.kref(),
                )?;
                be.unary(
                    crate::backend::UnaryOp::MulScalar(scale),
                    gx.kref(),
                    gx.kref(),
                )?;
                Ok(vec![Some(gx)])
            },
        );
    }
    Ok(out)
}
