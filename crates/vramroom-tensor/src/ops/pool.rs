//! Pooling.
//!
//! Design note: `max_pool2d` always runs PyTorch's CUDA `max_pool2d_with_indices`: output,
//! then int64 indices. Without a graph the indices die at once (the no_grad trace shows the
//! alloc/free pair); with one they are saved with the input. `adaptive_avg_pool2d` saves
//! only the input (for its shape).

use super::*;
use crate::autograd::Saved;
use crate::ops::conv::out_dim;

impl Pool2dParams {
    /// Square kernel, `stride` (0 = kernel size), `padding`, no dilation.
    pub fn new(kernel: usize, stride: usize, padding: usize) -> Self {
        let s = if stride == 0 { kernel } else { stride };
        Pool2dParams {
            kernel: [kernel; 2],
            stride: [s; 2],
            padding: [padding; 2],
            dilation: [1; 2],
        }
    }
}

/// `F.max_pool2d(x, kernel, stride, padding, dilation)` (floor mode).
pub fn max_pool2d(x: &Tensor, p: &Pool2dParams) -> Result<Tensor> {
    const OP: &str = "max_pool2d";
    need_float(x, OP)?;
    need_ndim(x, 4, OP)?;
    for i in 0..2 {
        if p.padding[i] * 2 > p.kernel[i] {
            return Err(TensorError::invalid(
                OP,
                "pad should be at most half of effective kernel size",
            ));
        }
    }
    let s = x.shape();
    let oh = out_dim(
        s[2],
        p.kernel[0],
        p.stride[0],
        p.padding[0],
        p.dilation[0],
        OP,
    )?;
    let ow = out_dim(
        s[3],
        p.kernel[1],
        p.stride[1],
        p.padding[1],
        p.dilation[1],
        OP,
    )?;
    let shape = [s[0], s[1], oh, ow];
    let out = Tensor::empty(&shape, x.dtype(), x.device())?;
    let idx = Tensor::empty(&shape, DType::I64, x.device())?;
    x.device()
        .backend()
        .max_pool2d(x.kref(), out.kref(), idx.kref(), p)?;
    if crate::autograd::should_record(&[x]) {
        let sx = Saved::new(x);
        let si = Saved::new(&idx);
        drop(idx);
        record(
            "MaxPool2DWithIndicesBackward0",
            &[Some(x)],
            &[&out],
            move |g, _| {
                const N: &str = "MaxPool2DWithIndicesBackward0";
                let gy = grad0(g, N)?;
                let x = sx.get(N)?;
                let gx = Tensor::zeros(x.shape(), x.dtype(), x.device())?;
                x.device().backend().max_pool2d_backward(
                    gy.kref(),
                    si.get(N)?.kref(),
                    gx.kref(),
                )?;
                Ok(vec![Some(gx)])
            },
        );
    }
    Ok(out)
}

/// `F.adaptive_avg_pool2d(x, (oh, ow))`.
pub fn adaptive_avg_pool2d(x: &Tensor, out_hw: [usize; 2]) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool2d";
    need_float(x, OP)?;
    need_ndim(x, 4, OP)?;
    if out_hw[0] == 0 || out_hw[1] == 0 {
        return Err(TensorError::invalid(OP, "output size must be positive"));
    }
    let s = x.shape();
    let out = Tensor::empty(&[s[0], s[1], out_hw[0], out_hw[1]], x.dtype(), x.device())?;
    x.device()
        .backend()
        .adaptive_avg_pool2d(x.kref(), out.kref())?;
    if crate::autograd::should_record(&[x]) {
        let sx = Saved::new(x);
        record(
            "AdaptiveAvgPool2DBackward0",
            &[Some(x)],
            &[&out],
            move |g, _| {
                const N: &str = "AdaptiveAvgPool2DBackward0";
                let gy = grad0(g, N)?;
                let x = sx.get(N)?;
                let gx = Tensor::empty(x.shape(), x.dtype(), x.device())?;
                x.device()
                    .backend()
                    .adaptive_avg_pool2d_backward(gy.kref(), gx.kref())?;
                Ok(vec![Some(gx)])
            },
        );
    }
    Ok(out)
}
