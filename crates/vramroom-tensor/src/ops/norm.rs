//! Batch norm and layer norm.
//!
//! Design note: batch norm in training allocates the output, then `save_mean` and
//! `save_invstd` of C floats (cuDNN's order), updates the running stats in place, and saves
//! input, weight and the two statistics. In eval it allocates only the output and its
//! backward reads the running stats. Layer norm allocates output, mean and rstd (one f32
//! per normalised row, also for f16/bf16 inputs, as PyTorch's accumulate type).

use super::*;
use crate::autograd::Saved;

fn opt_ref(t: Option<&Tensor>) -> Option<crate::backend::TRef<'_>> {
    t.map(|t| t.kref())
}

/// `F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    batch_norm_act(
        x,
        [running_mean, running_var, weight, bias],
        training,
        momentum,
        eps,
        false,
    )
}

/// `batch_norm` followed by an in-place ReLU (`nn.ReLU(inplace=True)`), as ResNet applies
/// after most batch norms. Same results, allocations and autograd graph as the two ops;
/// in eval without autograd the backend may do both in one pass.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_relu(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    batch_norm_act(
        x,
        [running_mean, running_var, weight, bias],
        training,
        momentum,
        eps,
        true,
    )
}

/// `[running_mean, running_var, weight, bias]`.
fn batch_norm_act(
    x: &Tensor,
    [running_mean, running_var, weight, bias]: [Option<&Tensor>; 4],
    training: bool,
    momentum: f64,
    eps: f64,
    relu: bool,
) -> Result<Tensor> {
    const OP: &str = "batch_norm";
    need_float(x, OP)?;
    if x.ndim() < 2 {
        return Err(TensorError::shape(
            OP,
            format!("expected 2-d or more input, got {:?}", x.shape()),
        ));
    }
    let c = x.shape()[1];
    for t in [running_mean, running_var, weight, bias]
        .into_iter()
        .flatten()
    {
        same_device(x, t, OP)?;
        if t.shape() != [c] {
            return Err(TensorError::shape(
                OP,
                format!("per-channel tensor {:?} for {c} channels", t.shape()),
            ));
        }
    }
    let be = x.device().backend().clone();
    let out = Tensor::empty(x.shape(), x.dtype(), x.device())?;
    let recording = crate::autograd::should_record(
        &[Some(x), weight, bias]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
    );
    if training {
        let per_elem = x.numel() / c.max(1);
        if per_elem <= 1 {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "expected more than 1 value per channel when training, got input size {:?}",
                    x.shape()
                ),
            ));
        }
        let stat_dtype = DType::F32;
        let save_mean = Tensor::empty(&[c], stat_dtype, x.device())?;
        let save_invstd = Tensor::empty(&[c], stat_dtype, x.device())?;
        be.batch_norm_train(
            x.kref(),
            opt_ref(weight),
            opt_ref(bias),
            opt_ref(running_mean),
            opt_ref(running_var),
            momentum,
            eps,
            out.kref(),
            save_mean.kref(),
            save_invstd.kref(),
        )?;
        for t in [running_mean, running_var].into_iter().flatten() {
            t.storage().bump_version();
        }
        if recording {
            let sx = Saved::new(x);
            let sw = weight.map(Saved::new);
            let sm = Saved::new(&save_mean);
            let si = Saved::new(&save_invstd);
            drop((save_mean, save_invstd));
            record(
                "CudnnBatchNormBackward0",
                &[Some(x), weight, bias],
                &[&out],
                move |g, needs| {
                    const N: &str = "CudnnBatchNormBackward0";
                    let gy = grad0(g, N)?;
                    let x = sx.get(N)?;
                    let w = match &sw {
                        Some(s) => Some(s.get(N)?),
                        None => None,
                    };
                    bn_backward(&gy, x, w, sm.get(N)?, si.get(N)?, true, eps, needs)
                },
            );
        }
    } else {
        let (Some(rm), Some(rv)) = (running_mean, running_var) else {
            return Err(TensorError::invalid(
                OP,
                "running_mean and running_var are required in eval mode",
            ));
        };
        if relu && !recording {
            // Nothing saves the batch norm's own output, so ReLU can be applied on the way out.
            be.batch_norm_eval_relu(
                x.kref(),
                opt_ref(weight),
                opt_ref(bias),
                rm.kref(),
                rv.kref(),
                eps,
                out.kref(),
            )?;
            return Ok(out);
        }
        be.batch_norm_eval(
            x.kref(),
            opt_ref(weight),
            opt_ref(bias),
            rm.kref(),
            rv.kref(),
            eps,
            out.kref(),
        )?;
        if recording {
            let sx = Saved::new(x);
            let sw = weight.map(Saved::new);
            let sm = Saved::new(rm);
            let sv = Saved::new(rv);
            record(
                "NativeBatchNormBackward0",
                &[Some(x), weight, bias],
                &[&out],
                move |g, needs| {
                    const N: &str = "NativeBatchNormBackward0";
                    let gy = grad0(g, N)?;
                    let w = match &sw {
                        Some(s) => Some(s.get(N)?),
                        None => None,
                    };
                    bn_backward(
                        &gy,
                        sx.get(N)?,
                        w,
                        sm.get(N)?,
                        sv.get(N)?,
                        false,
                        eps,
                        needs,
                    )
                },
            );
        }
    }
    if relu {
        out.relu_()?;
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn bn_backward(
    gy: &Tensor,
    x: &Tensor,
    w: Option<&Tensor>,
    m: &Tensor,
    s: &Tensor,
    train: bool,
    eps: f64,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let c = x.shape()[1];
    let gx = if needs[0] {
        Some(Tensor::empty(x.shape(), x.dtype(), x.device())?)
    } else {
        None
    };
    let gw = if needs[1] {
        Some(Tensor::empty(&[c], x.dtype(), x.device())?)
    } else {
        None
    };
    let gb = if needs[2] {
        Some(Tensor::empty(&[c], x.dtype(), x.device())?)
    } else {
        None
    };
    x.device().backend().batch_norm_backward(
        gy.kref(),
        x.kref(),
        opt_ref(w),
        m.kref(),
        s.kref(),
        train,
        eps,
        opt_ref(gx.as_ref()),
        opt_ref(gw.as_ref()),
        opt_ref(gb.as_ref()),
    )?;
    Ok(vec![gx, gw, gb])
}

/// `F.layer_norm(x, normalized_shape, weight, bias, eps)`.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "layer_norm";
    need_float(x, OP)?;
    let k = normalized_shape.len();
    if k == 0 || k > x.ndim() || &x.shape()[x.ndim() - k..] != normalized_shape {
        return Err(TensorError::shape(
            OP,
            format!(
                "normalized_shape {normalized_shape:?} does not match input {:?}",
                x.shape()
            ),
        ));
    }
    for t in [weight, bias].into_iter().flatten() {
        same_device(x, t, OP)?;
        if t.shape() != normalized_shape {
            return Err(TensorError::shape(
                OP,
                format!("affine {:?} for {normalized_shape:?}", t.shape()),
            ));
        }
    }
    let x = x.contiguous()?;
    let rows = x.numel() / normalized_shape.iter().product::<usize>().max(1);
    let out = Tensor::empty(x.shape(), x.dtype(), x.device())?;
    let mean = Tensor::empty(&[rows], DType::F32, x.device())?;
    let rstd = Tensor::empty(&[rows], DType::F32, x.device())?;
    x.device().backend().layer_norm(
        x.kref(),
        opt_ref(weight),
        opt_ref(bias),
        eps,
        out.kref(),
        mean.kref(),
        rstd.kref(),
    )?;
    let ins = [Some(&x), weight, bias];
    if crate::autograd::should_record(&ins.into_iter().flatten().collect::<Vec<_>>()) {
        let sx = Saved::new(&x);
        let sw = weight.map(Saved::new);
        let sm = Saved::new(&mean);
        let sr = Saved::new(&rstd);
        drop((mean, rstd));
        let ns = normalized_shape.to_vec();
        record(
            "NativeLayerNormBackward0",
            &ins,
            &[&out],
            move |g, needs| {
                const N: &str = "NativeLayerNormBackward0";
                let gy = grad0(g, N)?;
                let x = sx.get(N)?;
                let w = match &sw {
                    Some(s) => Some(s.get(N)?),
                    None => None,
                };
                let gx = if needs[0] {
                    Some(Tensor::empty(x.shape(), x.dtype(), x.device())?)
                } else {
                    None
                };
                let gw = if needs[1] {
                    Some(Tensor::empty(&ns, x.dtype(), x.device())?)
                } else {
                    None
                };
                let gb = if needs[2] {
                    Some(Tensor::empty(&ns, x.dtype(), x.device())?)
                } else {
                    None
                };
                x.device().backend().layer_norm_backward(
                    gy.kref(),
                    x.kref(),
                    opt_ref(w),
                    sm.get(N)?.kref(),
                    sr.get(N)?.kref(),
                    opt_ref(gx.as_ref()),
                    opt_ref(gw.as_ref()),
                    opt_ref(gb.as_ref()),
                )?;
                Ok(vec![gx, gw, gb])
            },
        );
    }
    Ok(out)
}
