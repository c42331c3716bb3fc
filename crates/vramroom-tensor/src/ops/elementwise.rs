//! Element-wise ops with NumPy broadcasting, scalar ops and activations.
//!
//! Design note: backward of a broadcast op reduces the gradient back to each input's shape
//! (`sum_to`, as PyTorch's `validate_outputs` does); when shapes already match, `add` passes
//! the very same gradient tensor on without allocating, like `AddBackward0`.

use super::*;
use crate::autograd::Saved;
use crate::backend::{BinaryOp, UnaryOp};
use crate::layout::{broadcast_shapes, Layout};

/// The backward of `self + alpha * other` (`AddBackward0`), shared by `add_scaled` and
/// `add_scaled_`: `sa`, `sb` are the input shapes the gradient is reduced back to.
#[allow(clippy::type_complexity)]
fn add_backward(
    sa: Vec<usize>,
    sb: Vec<usize>,
    alpha: f64,
) -> impl FnMut(Vec<Option<Tensor>>, &[bool]) -> Result<Vec<Option<Tensor>>> + Send + 'static {
    move |g: Vec<Option<Tensor>>, needs: &[bool]| {
        let g = grad0(g, "AddBackward0")?;
        let gb = if needs[1] {
            let gb = if alpha == 1.0 {
                g.clone()
            } else {
                g.mul_scalar(alpha)?
            };
            Some(gb.sum_to(&sb)?)
        } else {
            None
        };
        let ga = if needs[0] { Some(g.sum_to(&sa)?) } else { None };
        Ok(vec![ga, gb])
    }
}

impl Tensor {
    fn binary_op(&self, other: &Tensor, op: BinaryOp, name: &'static str) -> Result<Tensor> {
        same_device(self, other, name)?;
        same_dtype(self, other, name)?;
        need_float(self, name)?;
        let shape = broadcast_shapes(self.shape(), other.shape(), name)?;
        let a = self.layout().expand(&shape)?;
        let b = other.layout().expand(&shape)?;
        let out = Tensor::empty_dense(
            Layout::iter_output(&shape, &[&a, &b]),
            self.dtype(),
            self.device(),
        )?;
        self.device()
            .backend()
            .binary(op, self.kref_as(&a), other.kref_as(&b), out.kref())?;
        Ok(out)
    }

    /// `self + other`.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.add_scaled(other, 1.0)
    }
    /// `self + alpha * other` (`torch.add(a, b, alpha=)`).
    pub fn add_scaled(&self, other: &Tensor, alpha: f64) -> Result<Tensor> {
        let out = self.binary_op(other, BinaryOp::Add { alpha }, "add")?;
        if autograd::should_record(&[self, other]) {
            let (sa, sb) = (self.shape().to_vec(), other.shape().to_vec());
            record(
                "AddBackward0",
                &[Some(self), Some(other)],
                &[&out],
                add_backward(sa, sb, alpha),
            );
        }
        Ok(out)
    }
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        let out = self.binary_op(other, BinaryOp::Sub, "sub")?;
        if autograd::should_record(&[self, other]) {
            let (sa, sb) = (self.shape().to_vec(), other.shape().to_vec());
            record(
                "SubBackward0",
                &[Some(self), Some(other)],
                &[&out],
                move |g, needs| {
                    let g = grad0(g, "SubBackward0")?;
                    let ga = if needs[0] { Some(g.sum_to(&sa)?) } else { None };
                    let gb = if needs[1] {
                        Some(g.neg()?.sum_to(&sb)?)
                    } else {
                        None
                    };
                    Ok(vec![ga, gb])
                },
            );
        }
        Ok(out)
    }
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        let out = self.binary_op(other, BinaryOp::Mul, "mul")?;
        if autograd::should_record(&[self, other]) {
            let (sa, sb) = (self.shape().to_vec(), other.shape().to_vec());
            // PyTorch saves `other` when self needs grad and `self` when other does.
            let so = self.requires_grad().then(|| Saved::new(other));
            let ss = other.requires_grad().then(|| Saved::new(self));
            record(
                "MulBackward0",
                &[Some(self), Some(other)],
                &[&out],
                move |g, needs| {
                    let g = grad0(g, "MulBackward0")?;
                    let ga = match (&so, needs[0]) {
                        (Some(o), true) => Some(g.mul(o.get("MulBackward0")?)?.sum_to(&sa)?),
                        _ => None,
                    };
                    let gb = match (&ss, needs[1]) {
                        (Some(s), true) => Some(g.mul(s.get("MulBackward0")?)?.sum_to(&sb)?),
                        _ => None,
                    };
                    Ok(vec![ga, gb])
                },
            );
        }
        Ok(out)
    }
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        let out = self.binary_op(other, BinaryOp::Div, "div")?;
        if autograd::should_record(&[self, other]) {
            let (sa, sb) = (self.shape().to_vec(), other.shape().to_vec());
            let so = Saved::new(other);
            let ss = other.requires_grad().then(|| Saved::new(self));
            record(
                "DivBackward0",
                &[Some(self), Some(other)],
                &[&out],
                move |g, needs| {
                    let g = grad0(g, "DivBackward0")?;
                    let o = so.get("DivBackward0")?;
                    let ga = if needs[0] {
                        Some(g.div(o)?.sum_to(&sa)?)
                    } else {
                        None
                    };
                    let gb = match (&ss, needs[1]) {
                        (Some(s), true) => {
                            let s = s.get("DivBackward0")?;
                            // -g * self / other^2
                            Some(g.neg()?.mul(s)?.div(&o.square()?)?.sum_to(&sb)?)
                        }
                        _ => None,
                    };
                    Ok(vec![ga, gb])
                },
            );
        }
        Ok(out)
    }
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        // No gradient: used for masks and clamping in optimizers.
        let _g = autograd::no_grad();
        self.binary_op(other, BinaryOp::Maximum, "maximum")
    }

    fn unary_raw(&self, op: UnaryOp) -> Result<Tensor> {
        let out = Tensor::empty_dense(
            Layout::iter_output(self.shape(), &[self.layout()]),
            self.dtype(),
            self.device(),
        )?;
        self.device().backend().unary(op, self.kref(), out.kref())?;
        Ok(out)
    }

    /// Unary op whose backward is `g * f'(saved)` computed by one binary kernel.
    fn unary_with(
        &self,
        op: UnaryOp,
        name: &'static str,
        save_output: bool,
        bwd: BinaryOp,
    ) -> Result<Tensor> {
        need_float(self, name)?;
        let out = self.unary_raw(op)?;
        if autograd::should_record(&[self]) {
            let saved = Saved::new(if save_output { &out } else { self });
            record(name, &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, name)?;
                let s = saved.get(name)?;
                Ok(vec![Some(g.binary_op(s, bwd, name)?)])
            });
        }
        Ok(out)
    }

    pub fn relu(&self) -> Result<Tensor> {
        self.unary_with(
            UnaryOp::Relu,
            "ReluBackward0",
            true,
            BinaryOp::ThresholdBackward,
        )
    }
    /// `approximate="tanh"` when `tanh` (GPT-2's `gelu_new`), erf otherwise.
    pub fn gelu(&self, tanh: bool) -> Result<Tensor> {
        self.unary_with(
            UnaryOp::Gelu { tanh },
            "GeluBackward0",
            false,
            BinaryOp::GeluBackward { tanh },
        )
    }
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary_with(UnaryOp::Tanh, "TanhBackward0", true, BinaryOp::TanhBackward)
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary_with(
            UnaryOp::Sigmoid,
            "SigmoidBackward0",
            true,
            BinaryOp::SigmoidBackward,
        )
    }
    /// `F.silu` (SiLU / swish): one kernel, `SiluBackward0` saves the input.
    pub fn silu(&self) -> Result<Tensor> {
        self.unary_with(
            UnaryOp::Silu,
            "SiluBackward0",
            false,
            BinaryOp::SiluBackward,
        )
    }
    /// `torch.cos`; backward `grad * -self.sin()` (saves the input).
    pub fn cos(&self) -> Result<Tensor> {
        need_float(self, "cos")?;
        let out = self.unary_raw(UnaryOp::Cos)?;
        if autograd::should_record(&[self]) {
            let s = Saved::new(self);
            record("CosBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "CosBackward0")?;
                let x = s.get("CosBackward0")?;
                Ok(vec![Some(g.mul(&x.sin()?.neg()?)?)])
            });
        }
        Ok(out)
    }
    /// `torch.sin`; backward `grad * self.cos()` (saves the input).
    pub fn sin(&self) -> Result<Tensor> {
        need_float(self, "sin")?;
        let out = self.unary_raw(UnaryOp::Sin)?;
        if autograd::should_record(&[self]) {
            let s = Saved::new(self);
            record("SinBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "SinBackward0")?;
                let x = s.get("SinBackward0")?;
                Ok(vec![Some(g.mul(&x.cos()?)?)])
            });
        }
        Ok(out)
    }
    /// `torch.rsqrt`; `RsqrtBackward0` saves the result and computes
    /// `-0.5 * grad * result.pow(3)` in that order (three tensors, as PyTorch's formula).
    pub fn rsqrt(&self) -> Result<Tensor> {
        need_float(self, "rsqrt")?;
        let out = self.unary_raw(UnaryOp::Rsqrt)?;
        if autograd::should_record(&[self]) {
            let s = Saved::new(&out);
            record("RsqrtBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "RsqrtBackward0")?;
                let y = s.get("RsqrtBackward0")?;
                let a = g.mul_scalar(-0.5)?;
                Ok(vec![Some(a.mul(&y.pow_scalar(3.0)?)?)])
            });
        }
        Ok(out)
    }
    pub fn exp(&self) -> Result<Tensor> {
        self.unary_with(UnaryOp::Exp, "ExpBackward0", true, BinaryOp::Mul)
    }
    pub fn log(&self) -> Result<Tensor> {
        need_float(self, "log")?;
        let out = self.unary_raw(UnaryOp::Log)?;
        if autograd::should_record(&[self]) {
            let s = Saved::new(self);
            record("LogBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "LogBackward0")?;
                Ok(vec![Some(g.div(s.get("LogBackward0")?)?)])
            });
        }
        Ok(out)
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        need_float(self, "sqrt")?;
        let out = self.unary_raw(UnaryOp::Sqrt)?;
        if autograd::should_record(&[self]) {
            let s = Saved::new(&out);
            record("SqrtBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "SqrtBackward0")?;
                Ok(vec![Some(
                    g.div(&s.get("SqrtBackward0")?.mul_scalar(2.0)?)?,
                )])
            });
        }
        Ok(out)
    }
    pub fn square(&self) -> Result<Tensor> {
        self.pow_scalar(2.0)
    }
    pub fn pow_scalar(&self, p: f64) -> Result<Tensor> {
        need_float(self, "pow")?;
        let out = self.unary_raw(UnaryOp::PowScalar(p))?;
        if autograd::should_record(&[self]) {
            let s = Saved::new(self);
            record("PowBackward0", &[Some(self)], &[&out], move |g, _| {
                let g = grad0(g, "PowBackward0")?;
                let x = s.get("PowBackward0")?;
                Ok(vec![Some(g.mul(&x.pow_scalar(p - 1.0)?.mul_scalar(p)?)?)])
            });
        }
        Ok(out)
    }
    pub fn neg(&self) -> Result<Tensor> {
        self.mul_scalar(-1.0)
    }
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        need_float(self, "mul")?;
        let out = self.unary_raw(UnaryOp::MulScalar(s))?;
        if autograd::should_record(&[self]) {
            record("MulBackward1", &[Some(self)], &[&out], move |g, _| {
                Ok(vec![Some(grad0(g, "MulBackward1")?.mul_scalar(s)?)])
            });
        }
        Ok(out)
    }
    pub fn div_scalar(&self, s: f64) -> Result<Tensor> {
        self.mul_scalar(1.0 / s)
    }
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        need_float(self, "add")?;
        let out = self.unary_raw(UnaryOp::AddScalar(s))?;
        if autograd::should_record(&[self]) {
            record("AddBackward1", &[Some(self)], &[&out], move |g, _| {
                Ok(vec![Some(grad0(g, "AddBackward1")?)])
            });
        }
        Ok(out)
    }
    /// Raw unary kernel without autograd, for optimizers (`sqrt`, `abs`, ...).
    pub fn map_no_grad(&self, op: UnaryOp) -> Result<Tensor> {
        self.unary_raw(op)
    }

    // ---- in place ------------------------------------------------------------------

    fn inplace_binary(&self, other: &Tensor, op: BinaryOp, name: &'static str) -> Result<()> {
        same_device(self, other, name)?;
        same_dtype(self, other, name)?;
        let b = other.layout().expand(self.shape()).map_err(|_| {
            TensorError::shape(
                name,
                format!(
                    "output with shape {:?} doesn't match the broadcast shape with {:?}",
                    self.shape(),
                    other.shape()
                ),
            )
        })?;
        self.device()
            .backend()
            .binary(op, self.kref(), other.kref_as(&b), self.kref())?;
        self.storage().bump_version();
        Ok(())
    }

    /// In-place add without autograd and without the leaf check: gradient accumulation.
    pub(crate) fn add_raw_(&self, other: &Tensor) -> Result<()> {
        self.inplace_binary(other, BinaryOp::Add { alpha: 1.0 }, "add_")
    }

    /// `self += alpha * other`, recorded by autograd (the residual `out += identity`).
    pub fn add_scaled_(&self, other: &Tensor, alpha: f64) -> Result<()> {
        self.check_inplace("add_")?;
        let record_it = autograd::should_record(&[self, other]);
        let prev = self.detach();
        if record_it {
            // The node's first input is the tensor *before* the op: its old history.
            prev.set_edge(self.edge());
        }
        self.inplace_binary(other, BinaryOp::Add { alpha }, "add_")?;
        if record_it {
            let (sa, sb) = (self.shape().to_vec(), other.shape().to_vec());
            record(
                "AddBackward0",
                &[Some(&prev), Some(other)],
                &[self],
                add_backward(sa, sb, alpha),
            );
        }
        Ok(())
    }
    pub fn add_(&self, other: &Tensor) -> Result<()> {
        self.add_scaled_(other, 1.0)
    }
    /// `self *= other` (no autograd: optimizer and buffer updates under no_grad).
    pub fn mul_(&self, other: &Tensor) -> Result<()> {
        self.check_inplace("mul_")?;
        self.inplace_binary(other, BinaryOp::Mul, "mul_")
    }
    pub fn div_(&self, other: &Tensor) -> Result<()> {
        self.check_inplace("div_")?;
        self.inplace_binary(other, BinaryOp::Div, "div_")
    }
    /// `self *= s` (no autograd).
    pub fn mul_scalar_(&self, s: f64) -> Result<()> {
        self.check_inplace("mul_")?;
        self.device()
            .backend()
            .unary(UnaryOp::MulScalar(s), self.kref(), self.kref())?;
        self.storage().bump_version();
        Ok(())
    }
    pub fn add_scalar_(&self, s: f64) -> Result<()> {
        self.check_inplace("add_")?;
        self.device()
            .backend()
            .unary(UnaryOp::AddScalar(s), self.kref(), self.kref())?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self.copy_(src)` with broadcasting and dtype conversion (no autograd).
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        self.check_inplace("copy_")?;
        same_device(self, src, "copy_")?;
        let l = src.layout().expand(self.shape())?;
        self.device().backend().copy(src.kref_as(&l), self.kref())?;
        self.storage().bump_version();
        Ok(())
    }

    /// `relu_()`: in place, saves its output, as torchvision's `ReLU(inplace=True)`.
    pub fn relu_(&self) -> Result<()> {
        self.check_inplace("relu_")?;
        need_float(self, "relu_")?;
        let record_it = autograd::should_record(&[self]);
        let prev = self.detach();
        if record_it {
            prev.set_edge(self.edge());
        }
        self.device()
            .backend()
            .unary(UnaryOp::Relu, self.kref(), self.kref())?;
        self.storage().bump_version();
        if record_it {
            let saved = Saved::new(self);
            record("ReluBackward0", &[Some(&prev)], &[self], move |g, _| {
                let g = grad0(g, "ReluBackward0")?;
                let s = saved.get("ReluBackward0")?;
                Ok(vec![Some(g.binary_op(
                    s,
                    BinaryOp::ThresholdBackward,
                    "relu",
                )?)])
            });
        }
        Ok(())
    }

    /// `masked_fill(mask, value)`; `mask` is bool and broadcasts to self.
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        same_device(self, mask, "masked_fill")?;
        need_dtype(mask, DType::Bool, "masked_fill")?;
        let ml = mask.layout().expand(self.shape()).map_err(|_| {
            TensorError::shape(
                "masked_fill",
                format!(
                    "mask {:?} does not broadcast to {:?}",
                    mask.shape(),
                    self.shape()
                ),
            )
        })?;
        let out = Tensor::empty_dense(
            Layout::iter_output(self.shape(), &[self.layout(), &ml]),
            self.dtype(),
            self.device(),
        )?;
        // need_dtype above: the mask is bool.
        self.device()
            .backend()
            .masked_fill(self.kref(), mask.kref_as(&ml), value, out.kref())?;
        if autograd::should_record(&[self]) {
            let m = Saved::new(mask);
            record(
                "MaskedFillBackward0",
                &[Some(self)],
                &[&out],
                move |g, _| {
                    let g = grad0(g, "MaskedFillBackward0")?;
                    Ok(vec![Some(
                        g.masked_fill(m.get("MaskedFillBackward0")?, 0.0)?,
                    )])
                },
            );
        }
        Ok(out)
    }

    /// Sums `self` down to `shape` (the reverse of broadcasting). No copy when equal.
    pub fn sum_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let lead = self.ndim().checked_sub(shape.len()).ok_or_else(|| {
            TensorError::shape("sum_to", format!("{:?} to {:?}", self.shape(), shape))
        })?;
        let mut dims: Vec<usize> = (0..lead).collect();
        for (i, &d) in shape.iter().enumerate() {
            if d == 1 && self.shape()[lead + i] != 1 {
                dims.push(lead + i);
            }
        }
        let s = self.sum_dims(&dims, true)?;
        s.reshape(shape)
    }
}
