//! Differentiable operations, as methods on [`Tensor`].
//!
//! Design note: each op (1) checks shapes, dtypes and devices and returns an error before
//! touching memory, (2) allocates outputs, workspaces and saved buffers in the order and
//! with the byte sizes of PyTorch's CUDA kernel, (3) calls one backend kernel, and (4) when
//! grad mode is on and an input requires grad, records a node that saves exactly what
//! PyTorch's `*Backward0` node saves. Backward closures compute only the gradients the
//! engine asks for (`needs`), in PyTorch's order, so backward allocates as PyTorch does.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod linalg;
pub mod nn;
pub mod norm;
pub mod pool;
pub mod reduce;
pub mod shape;

use crate::autograd::{self, BackwardFn};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

pub use crate::backend::{Conv2dParams, Pool2dParams};
pub use attention::{scaled_dot_product_attention, sdpa_backend, SdpaArgs, SdpaBackend};
pub use conv::conv2d;
pub use linalg::linear;
pub use nn::{cross_entropy, cross_entropy_with, dropout, embedding, nll_loss, Reduction};
pub use norm::{batch_norm, batch_norm_relu, layer_norm};
pub use pool::{adaptive_avg_pool2d, max_pool2d};

struct ClosureBackward<F>(F);

impl<F> BackwardFn for ClosureBackward<F>
where
    F: FnMut(Vec<Option<Tensor>>, &[bool]) -> Result<Vec<Option<Tensor>>> + Send,
{
    fn backward(
        &mut self,
        grads: Vec<Option<Tensor>>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        (self.0)(grads, needs)
    }
}

/// Records `f` as the backward of an op with these inputs and outputs.
pub(crate) fn record<F>(name: &'static str, inputs: &[Option<&Tensor>], outputs: &[&Tensor], f: F)
where
    F: FnMut(Vec<Option<Tensor>>, &[bool]) -> Result<Vec<Option<Tensor>>> + Send + 'static,
{
    autograd::record(name, inputs, outputs, Box::new(ClosureBackward(f)));
}

/// The gradient of output 0 (always present for a single-output node that runs).
pub(crate) fn grad0(grads: Vec<Option<Tensor>>, op: &'static str) -> Result<Tensor> {
    grads
        .into_iter()
        .next()
        .flatten()
        .ok_or_else(|| TensorError::Autograd(format!("{op}: missing output gradient")))
}

pub(crate) fn same_device(a: &Tensor, b: &Tensor, op: &'static str) -> Result<()> {
    a.device().check_same(b.device(), op)
}

pub(crate) fn need_float(t: &Tensor, op: &'static str) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(TensorError::UnsupportedDType {
            op,
            dtype: t.dtype(),
        })
    }
}

pub(crate) fn same_dtype(a: &Tensor, b: &Tensor, op: &'static str) -> Result<()> {
    if a.dtype() == b.dtype() {
        Ok(())
    } else {
        Err(TensorError::DTypeMismatch {
            op,
            expected: a.dtype(),
            got: b.dtype(),
        })
    }
}

pub(crate) fn need_dtype(t: &Tensor, d: DType, op: &'static str) -> Result<()> {
    if t.dtype() == d {
        Ok(())
    } else {
        Err(TensorError::DTypeMismatch {
            op,
            expected: d,
            got: t.dtype(),
        })
    }
}

pub(crate) fn need_ndim(t: &Tensor, n: usize, op: &'static str) -> Result<()> {
    if t.ndim() == n {
        Ok(())
    } else {
        Err(TensorError::shape(
            op,
            format!("expected a {n}-d tensor, got shape {:?}", t.shape()),
        ))
    }
}
