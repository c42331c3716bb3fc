//! Optimizers: SGD (momentum), Adam, AdamW, as PyTorch's default CUDA path (`foreach=True`).
//!
//! Design note: memory is the point, so each step allocates what PyTorch's `_multi_tensor_*`
//! functions allocate, in their order: state lazily at the first step (SGD: one
//! `clone(grad)` momentum buffer per parameter; Adam: `exp_avg` then `exp_avg_sq`, zeros,
//! per parameter; `step` lives on the host as in PyTorch's non-capturable path), tagged
//! `optimizer_state`; Adam's `_foreach_sqrt(exp_avg_sq)` denominators, one per parameter,
//! held until the update ends, tagged `temporary`. PyTorch's fused in-place foreach kernels
//! (`lerp_`, `addcmul_`, `addcdiv_`) allocate nothing; here their arithmetic runs on host
//! copies on the cpu device (host memory is not device memory) and is skipped on meta.

use crate::autograd::no_grad;
use crate::error::{Result, TensorError};
use crate::memory::{category_scope, MemoryCategory};
use crate::tensor::Tensor;

pub trait Optimizer {
    fn step(&mut self) -> Result<()>;
    fn params(&self) -> &[Tensor];
    /// `optimizer.zero_grad(set_to_none)`: PyTorch's default is `set_to_none=True`, which
    /// frees the gradients; `false` zeroes them in place and keeps the memory.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        for p in self.params() {
            p.zero_grad(set_to_none)?;
        }
        Ok(())
    }
}

fn check_lr(lr: f64, op: &'static str) -> Result<()> {
    if !(lr.is_finite() && lr >= 0.0) {
        return Err(TensorError::invalid(
            op,
            format!("invalid learning rate {lr}"),
        ));
    }
    Ok(())
}

/// Updates `ts[0]` (and the others) elementwise on the host; a no-op on the meta device.
fn host_update(ts: &[&Tensor], f: impl Fn(&mut [Vec<f64>])) -> Result<()> {
    let Some(first) = ts.first() else {
        return Ok(());
    };
    if first.device().is_meta() {
        return Ok(());
    }
    let mut data = ts
        .iter()
        .map(|t| t.to_vec_f64())
        .collect::<Result<Vec<_>>>()?;
    f(&mut data);
    for (t, d) in ts.iter().zip(&data) {
        t.copy_from_f64(d)?;
    }
    Ok(())
}

fn zeros_like_state(p: &Tensor) -> Result<Tensor> {
    let _c = category_scope(MemoryCategory::OptimizerState);
    Tensor::zeros(p.shape(), p.dtype(), p.device())
}

/// `torch.optim.SGD(params, lr, momentum, dampening=0, weight_decay, nesterov=False)`.
pub struct Sgd {
    params: Vec<Tensor>,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    bufs: Vec<Option<Tensor>>,
}

impl Sgd {
    pub fn new(params: Vec<Tensor>, lr: f64, momentum: f64, weight_decay: f64) -> Result<Sgd> {
        check_lr(lr, "SGD")?;
        let n = params.len();
        Ok(Sgd {
            params,
            lr,
            momentum,
            weight_decay,
            bufs: vec![None; n],
        })
    }
    /// Bytes of momentum buffers (0 before the first step).
    pub fn state_tensors(&self) -> Vec<Tensor> {
        self.bufs.iter().flatten().cloned().collect()
    }
}

impl Optimizer for Sgd {
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        let idx: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].grad().is_some())
            .collect();
        let mut grads: Vec<Tensor> = idx.iter().filter_map(|&i| self.params[i].grad()).collect();
        if self.weight_decay != 0.0 {
            // `_foreach_add(grads, params, alpha=wd)`: new tensors, one per parameter.
            let _c = category_scope(MemoryCategory::Temporary);
            grads = idx
                .iter()
                .zip(&grads)
                .map(|(&i, g)| g.add_scaled(&self.params[i].detach(), self.weight_decay))
                .collect::<Result<_>>()?;
        }
        for (k, &i) in idx.iter().enumerate() {
            let p = &self.params[i];
            let g = &grads[k];
            if self.momentum != 0.0 {
                let buf = match &self.bufs[i] {
                    Some(b) => {
                        b.mul_scalar_(self.momentum)?;
                        b.add_scaled_(g, 1.0)?;
                        b.clone()
                    }
                    None => {
                        // First step: `torch.clone(grad).detach()`.
                        let _c = category_scope(MemoryCategory::OptimizerState);
                        let b = g.clone_tensor()?.detach();
                        self.bufs[i] = Some(b.clone());
                        b
                    }
                };
                p.add_scaled_(&buf, -self.lr)?;
            } else {
                p.add_scaled_(g, -self.lr)?;
            }
        }
        Ok(())
    }
}

/// Adam and AdamW (`decoupled`): betas, eps, weight_decay as in PyTorch.
pub struct Adam {
    params: Vec<Tensor>,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
    /// Per parameter: (step, exp_avg, exp_avg_sq), created at the first step.
    state: Vec<Option<(u64, Tensor, Tensor)>>,
}

impl Adam {
    /// `torch.optim.Adam(params, lr, weight_decay)` with betas (0.9, 0.999), eps 1e-8.
    #[allow(clippy::self_named_constructors)]
    pub fn adam(params: Vec<Tensor>, lr: f64, weight_decay: f64) -> Result<Adam> {
        Adam::new(params, lr, weight_decay, false)
    }
    /// `torch.optim.AdamW(params, lr, weight_decay=0.01)`.
    pub fn adamw(params: Vec<Tensor>, lr: f64, weight_decay: f64) -> Result<Adam> {
        Adam::new(params, lr, weight_decay, true)
    }
    fn new(params: Vec<Tensor>, lr: f64, weight_decay: f64, decoupled: bool) -> Result<Adam> {
        check_lr(lr, if decoupled { "AdamW" } else { "Adam" })?;
        let n = params.len();
        Ok(Adam {
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay,
            decoupled,
            state: vec![None; n],
        })
    }
    pub fn state_tensors(&self) -> Vec<Tensor> {
        self.state
            .iter()
            .flatten()
            .flat_map(|(_, m, v)| [m.clone(), v.clone()])
            .collect()
    }
}

impl Optimizer for Adam {
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        let idx: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].grad().is_some())
            .collect();
        // `_init_group`: lazy state, exp_avg then exp_avg_sq for each parameter in turn.
        for &i in &idx {
            if self.state[i].is_none() {
                let p = &self.params[i];
                let m = zeros_like_state(p)?;
                let v = zeros_like_state(p)?;
                self.state[i] = Some((0, m, v));
            }
        }
        let mut grads: Vec<Tensor> = idx.iter().filter_map(|&i| self.params[i].grad()).collect();
        let (b1, b2) = self.betas;
        let (lr, eps, wd) = (self.lr, self.eps, self.weight_decay);
        if wd != 0.0 && !self.decoupled {
            // Adam's L2 term: `_foreach_add(grads, params, alpha=wd)`, new tensors.
            let _c = category_scope(MemoryCategory::Temporary);
            grads = idx
                .iter()
                .zip(&grads)
                .map(|(&i, g)| g.add_scaled(&self.params[i].detach(), wd))
                .collect::<Result<_>>()?;
        }
        for &i in &idx {
            if let Some(s) = &mut self.state[i] {
                s.0 += 1;
            }
        }
        // `_foreach_sqrt(exp_avg_sqs)`: one denominator per parameter, all alive together.
        let denoms = {
            let _c = category_scope(MemoryCategory::Temporary);
            idx.iter()
                .map(|&i| {
                    let p = &self.params[i];
                    Tensor::empty(p.shape(), p.dtype(), p.device())
                })
                .collect::<Result<Vec<_>>>()?
        };
        for (k, &i) in idx.iter().enumerate() {
            let p = self.params[i].detach();
            let Some((step, m, v)) = &self.state[i] else {
                continue;
            };
            let step = *step as f64;
            let bc1 = 1.0 - b1.powf(step);
            let bc2 = 1.0 - b2.powf(step);
            let decoupled = self.decoupled;
            host_update(&[&p, m, v, &grads[k]], |d| {
                let (head, tail) = d.split_at_mut(3);
                let g = &tail[0];
                let [pp, mm, vv] = head else { return };
                for j in 0..pp.len() {
                    if decoupled && wd != 0.0 {
                        pp[j] *= 1.0 - lr * wd;
                    }
                    mm[j] += (1.0 - b1) * (g[j] - mm[j]);
                    vv[j] = b2 * vv[j] + (1.0 - b2) * g[j] * g[j];
                    let denom = vv[j].sqrt() / bc2.sqrt() + eps;
                    pp[j] -= lr / bc1 * mm[j] / denom;
                }
            })?;
        }
        drop(denoms);
        Ok(())
    }
}
