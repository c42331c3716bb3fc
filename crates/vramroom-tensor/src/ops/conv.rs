//! 2-d convolution.
//!
//! Design note: allocation order is PyTorch's cuDNN path: the output, then the algorithm's
//! workspace (size from the device's [`crate::device::WorkspacePolicy`]), freed before the
//! op returns; the bias is added into the output in place. Backward allocates grad_input
//! (+ workspace), grad_weight (+ workspace), grad_bias, skipping what is not needed — the
//! first conv of a network computes no input gradient.

use super::*;
use crate::autograd::Saved;
use crate::backend::Workspace;
use crate::device::{ConvPass, ConvWorkspaceQuery};

/// Output size of a conv or pool along one dim (floor mode).
pub(crate) fn out_dim(
    n: usize,
    k: usize,
    s: usize,
    p: usize,
    d: usize,
    op: &'static str,
) -> Result<usize> {
    let eff = d * (k.max(1) - 1) + 1;
    if n + 2 * p < eff || s == 0 {
        return Err(TensorError::shape(
            op,
            format!("input size {n} (padding {p}) is smaller than the kernel extent {eff}"),
        ));
    }
    Ok((n + 2 * p - eff) / s + 1)
}

/// The workspace the device's policy asks for, allocated after the op's output, as PyTorch's
/// cuDNN path does. The caller keeps the tensor alive across the kernel and drops it right
/// after, which is the moment PyTorch frees it. A workspace that does not fit is no OOM:
/// PyTorch catches it (its allocator has emptied the cache by then) and runs a plan that
/// needs none, and so does this (the CUDA backend picks an algorithm for a zero workspace).
/// PyTorch also keeps that plan for the conv's later calls; here each call asks again.
fn workspace(t: &Tensor, q: ConvWorkspaceQuery) -> Result<(Option<Tensor>, Workspace)> {
    let n = t.device().workspace_policy().conv2d(&q);
    if n == 0 {
        return Ok((None, Workspace::default()));
    }
    let ws = match Tensor::empty(&[n as usize], DType::U8, t.device()) {
        Ok(ws) => ws,
        Err(TensorError::OutOfMemory { .. }) => {
            return Ok((None, Workspace::default()));
        }
        Err(e) => return Err(e),
    };
    let w = Workspace {
        ptr: ws.storage().ptr(),
        size: n,
    };
    Ok((Some(ws), w))
}

fn query(
    pass: ConvPass,
    x: &[usize],
    w: &[usize],
    y: &[usize],
    p: &Conv2dParams,
    dtype: DType,
) -> ConvWorkspaceQuery {
    ConvWorkspaceQuery {
        pass,
        input: [x[0], x[1], x[2], x[3]],
        weight: [w[0], w[1], w[2], w[3]],
        output: [y[0], y[1], y[2], y[3]],
        stride: p.stride,
        padding: p.padding,
        dilation: p.dilation,
        groups: p.groups,
        dtype,
    }
}

impl Conv2dParams {
    pub fn new(stride: usize, padding: usize) -> Self {
        Conv2dParams {
            stride: [stride; 2],
            padding: [padding; 2],
            dilation: [1; 2],
            groups: 1,
        }
    }
}

/// `F.conv2d(x, weight, bias, stride, padding, dilation, groups)`.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    p: &Conv2dParams,
) -> Result<Tensor> {
    const OP: &str = "conv2d";
    same_device(x, weight, OP)?;
    same_dtype(x, weight, OP)?;
    need_float(x, OP)?;
    need_ndim(x, 4, OP)?;
    need_ndim(weight, 4, OP)?;
    let (xs, ws) = (x.shape().to_vec(), weight.shape().to_vec());
    let g = p.groups;
    if g == 0 || xs[1] != ws[1] * g || ws[0] % g != 0 {
        return Err(TensorError::shape(
            OP,
            format!(
                "weight {ws:?} with groups={g} expects {} input channels, got input {xs:?}",
                ws[1] * g
            ),
        ));
    }
    if let Some(b) = bias {
        same_device(x, b, OP)?;
        same_dtype(x, b, OP)?;
        if b.shape() != [ws[0]] {
            return Err(TensorError::shape(
                OP,
                format!("bias {:?} for {} output channels", b.shape(), ws[0]),
            ));
        }
    }
    let oh = out_dim(xs[2], ws[2], p.stride[0], p.padding[0], p.dilation[0], OP)?;
    let ow = out_dim(xs[3], ws[3], p.stride[1], p.padding[1], p.dilation[1], OP)?;
    let ys = [xs[0], ws[0], oh, ow];
    let out = Tensor::empty(&ys, x.dtype(), x.device())?;
    let (held, wsp) = workspace(x, query(ConvPass::Forward, &xs, &ws, &ys, p, x.dtype()))?;
    x.device().backend().conv2d(
        x.kref(),
        weight.kref(),
        bias.map(|b| b.kref()),
        out.kref(),
        p,
        wsp,
    )?;
    drop(held);
    let ins = [Some(x), Some(weight), bias];
    let any = [x, weight].into_iter().chain(bias).collect::<Vec<_>>();
    if crate::autograd::should_record(&any) {
        let sx = Saved::new(x);
        let sw = Saved::new(weight);
        let p = *p;
        record(
            "ConvolutionBackward0",
            &ins,
            &[&out],
            move |grads, needs| {
                const N: &str = "ConvolutionBackward0";
                let gy = grad0(grads, N)?;
                let x = sx.get(N)?;
                let w = sw.get(N)?;
                let ys = gy.shape().to_vec();
                let gx = if needs[0] {
                    let gx = Tensor::empty(x.shape(), x.dtype(), x.device())?;
                    let (held, wsp) = workspace(
                        x,
                        query(
                            ConvPass::BackwardInput,
                            x.shape(),
                            w.shape(),
                            &ys,
                            &p,
                            x.dtype(),
                        ),
                    )?;
                    x.device().backend().conv2d_backward_input(
                        gy.kref(),
                        w.kref(),
                        gx.kref(),
                        &p,
                        wsp,
                    )?;
                    drop(held);
                    Some(gx)
                } else {
                    None
                };
                let gw = if needs[1] {
                    let gw = Tensor::empty(w.shape(), w.dtype(), w.device())?;
                    let (held, wsp) = workspace(
                        x,
                        query(
                            ConvPass::BackwardWeight,
                            x.shape(),
                            w.shape(),
                            &ys,
                            &p,
                            x.dtype(),
                        ),
                    )?;
                    x.device().backend().conv2d_backward_weight(
                        gy.kref(),
                        x.kref(),
                        gw.kref(),
                        &p,
                        wsp,
                    )?;
                    drop(held);
                    Some(gw)
                } else {
                    None
                };
                let gb = if needs.get(2).copied().unwrap_or(false) {
                    Some(gy.sum_dims(&[0, 2, 3], false)?)
                } else {
                    None
                };
                Ok(vec![gx, gw, gb])
            },
        );
    }
    Ok(out)
}
