//! Finite-difference gradient checking.
//!
//! Design note: the ops run in f32, so the check projects the output on a fixed random
//! vector (one backward with that vector as the output gradient), perturbs one input element
//! at a time by ±eps with central differences, and accumulates the projections in f64.
//! Tolerances are for f32 ops: `|analytic - numeric| <= atol + rtol * |numeric|`.

use crate::autograd::no_grad;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

#[derive(Debug, Clone, Copy)]
pub struct GradcheckOptions {
    pub eps: f64,
    pub atol: f64,
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-2,
            atol: 2e-3,
            rtol: 2e-2,
        }
    }
}

fn projection(n: usize) -> Vec<f64> {
    // Deterministic, non-symmetric weights so that errors cannot cancel out.
    (0..n)
        .map(|i| ((i as f64 * 0.618_034 + 0.3).fract() - 0.5) * 2.0 + 0.1)
        .collect()
}

/// Checks the gradients of `f` w.r.t. every input that requires grad. `f` must be
/// deterministic (reseed inside it for random ops).
pub fn gradcheck<F>(f: F, inputs: &[Tensor], opts: GradcheckOptions) -> Result<()>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    for x in inputs {
        if x.requires_grad() {
            x.set_grad(None)?;
        }
    }
    let out = f(inputs)?;
    let r = projection(out.numel());
    let rt = Tensor::from_f64(&r, out.shape(), out.dtype(), out.device())?;
    out.backward_with(Some(rt), false)?;
    drop(out);

    let eval = |inputs: &[Tensor]| -> Result<f64> {
        let _g = no_grad();
        let y = f(inputs)?.to_vec_f64()?;
        Ok(y.iter().zip(&r).map(|(a, b)| a * b).sum())
    };
    for (k, x) in inputs.iter().enumerate() {
        if !x.requires_grad() {
            continue;
        }
        let analytic = match x.grad() {
            Some(g) => g.to_vec_f64()?,
            None => vec![0.0; x.numel()],
        };
        let base = x.to_vec_f64()?;
        for j in 0..base.len() {
            let mut v = base.clone();
            v[j] = base[j] + opts.eps;
            x.copy_from_f64(&v)?;
            let up = eval(inputs)?;
            v[j] = base[j] - opts.eps;
            x.copy_from_f64(&v)?;
            let down = eval(inputs)?;
            x.copy_from_f64(&base)?;
            let numeric = (up - down) / (2.0 * opts.eps);
            let a = analytic[j];
            if (a - numeric).abs() > opts.atol + opts.rtol * numeric.abs() {
                return Err(TensorError::Autograd(format!(
                    "gradcheck failed for input {k} element {j}: analytic {a}, numeric {numeric}"
                )));
            }
        }
    }
    Ok(())
}
