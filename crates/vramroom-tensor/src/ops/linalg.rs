//! Matrix products: `mm`, `bmm`, `addmm`, `matmul`, `linear`.
//!
//! Design note: `linear` follows `F.linear` on CUDA: a 2-d (or flattened contiguous N-d)
//! input with bias is one `addmm` whose output is allocated once and written by one GEMM
//! with the bias in its epilogue (cuBLASLt, where the backend has it; otherwise the bias is
//! copied in and the GEMM accumulates); the weight enters through `w.t()` so the graph is
//! AddmmBackward0 → TBackward0 → AccumulateGrad, and the weight gradient comes out
//! contiguous (computed as `(g.t() @ x).t()`, like `mm_mat2_backward` for a column-major
//! operand).

use super::*;
use crate::autograd::Saved;
use crate::layout::Layout;

fn as3(t: &Tensor) -> Layout {
    let l = t.layout();
    Layout {
        shape: vec![1, l.shape[0], l.shape[1]],
        strides: vec![0, l.strides[0], l.strides[1]],
        offset: l.offset,
    }
}

fn check_mm(a: &Tensor, b: &Tensor, op: &'static str) -> Result<()> {
    same_device(a, b, op)?;
    same_dtype(a, b, op)?;
    need_float(a, op)?;
    need_ndim(a, 2, op)?;
    need_ndim(b, 2, op)?;
    if a.shape()[1] != b.shape()[0] {
        return Err(TensorError::shape(
            op,
            format!(
                "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
                a.shape()[0],
                a.shape()[1],
                b.shape()[0],
                b.shape()[1]
            ),
        ));
    }
    Ok(())
}

/// Gradient of `mat2` in `mat1 @ mat2`, laid out like `mat2`.
fn mm_mat2_backward(g: &Tensor, mat1: &Tensor, mat2_strides: &[usize]) -> Result<Tensor> {
    if mat2_strides[0] == 1 && mat2_strides[1] != 1 {
        g.t()?.mm(mat1)?.t()
    } else {
        mat1.t()?.mm(g)
    }
}

impl Tensor {
    /// `out (+)= a @ b`; `lt`: the call goes through cuBLASLt (addmm with a 1-d bias).
    fn gemm_into(a: &Tensor, b: &Tensor, out: &Tensor, accumulate: bool, lt: bool) -> Result<()> {
        a.device().ensure_blas_handle(lt)?;
        let (la, lb, lo) = (as3(a), as3(b), as3(out));
        a.device()
            .backend()
            .matmul(a.kref_as(&la), b.kref_as(&lb), out.kref_as(&lo), accumulate)
    }

    /// `out = a @ b + bias` in one backend call (cuBLASLt's bias epilogue); false: the
    /// backend does not take it and nothing was written.
    fn gemm_bias_into(a: &Tensor, b: &Tensor, bias: &Tensor, out: &Tensor) -> Result<bool> {
        a.device().ensure_blas_handle(true)?;
        let (la, lb, lo) = (as3(a), as3(b), as3(out));
        a.device().backend().matmul_bias(
            a.kref_as(&la),
            b.kref_as(&lb),
            bias.kref(),
            out.kref_as(&lo),
        )
    }

    /// `self @ other` for 2-d tensors.
    pub fn mm(&self, other: &Tensor) -> Result<Tensor> {
        check_mm(self, other, "mm")?;
        let out = Tensor::empty(
            &[self.shape()[0], other.shape()[1]],
            self.dtype(),
            self.device(),
        )?;
        Tensor::gemm_into(self, other, &out, false, false)?;
        if crate::autograd::should_record(&[self, other]) {
            let s1 = other.requires_grad().then(|| Saved::new(self));
            let s2 = self.requires_grad().then(|| Saved::new(other));
            let st2 = other.strides().to_vec();
            record(
                "MmBackward0",
                &[Some(self), Some(other)],
                &[&out],
                move |g, needs| {
                    let g = grad0(g, "MmBackward0")?;
                    let g1 = match (&s2, needs[0]) {
                        (Some(m2), true) => Some(g.mm(&m2.get("MmBackward0")?.t()?)?),
                        _ => None,
                    };
                    let g2 = match (&s1, needs[1]) {
                        (Some(m1), true) => {
                            Some(mm_mat2_backward(&g, m1.get("MmBackward0")?, &st2)?)
                        }
                        _ => None,
                    };
                    Ok(vec![g1, g2])
                },
            );
        }
        Ok(out)
    }

    /// `bias + self @ other` with `bias` broadcast to the output (`torch.addmm`).
    pub fn addmm(bias: &Tensor, mat1: &Tensor, mat2: &Tensor) -> Result<Tensor> {
        check_mm(mat1, mat2, "addmm")?;
        same_device(bias, mat1, "addmm")?;
        same_dtype(bias, mat1, "addmm")?;
        let shape = [mat1.shape()[0], mat2.shape()[1]];
        let bl = bias.layout().expand(&shape).map_err(|_| {
            TensorError::shape(
                "addmm",
                format!("bias {:?} for output {shape:?}", bias.shape()),
            )
        })?;
        let out = Tensor::empty(&shape, mat1.dtype(), mat1.device())?;
        let lt = bias.ndim() == 1;
        if !(lt && Tensor::gemm_bias_into(mat1, mat2, bias, &out)?) {
            out.device().backend().copy(bias.kref_as(&bl), out.kref())?;
            Tensor::gemm_into(mat1, mat2, &out, true, lt)?;
        }
        if crate::autograd::should_record(&[bias, mat1, mat2]) {
            let s1 = mat2.requires_grad().then(|| Saved::new(mat1));
            let s2 = mat1.requires_grad().then(|| Saved::new(mat2));
            let st2 = mat2.strides().to_vec();
            let bshape = bias.shape().to_vec();
            record(
                "AddmmBackward0",
                &[Some(bias), Some(mat1), Some(mat2)],
                &[&out],
                move |g, needs| {
                    let g = grad0(g, "AddmmBackward0")?;
                    let g1 = match (&s2, needs[1]) {
                        (Some(m2), true) => Some(g.mm(&m2.get("AddmmBackward0")?.t()?)?),
                        _ => None,
                    };
                    let g2 = match (&s1, needs[2]) {
                        (Some(m1), true) => {
                            Some(mm_mat2_backward(&g, m1.get("AddmmBackward0")?, &st2)?)
                        }
                        _ => None,
                    };
                    // PyTorch reduces the bias gradient last, in validate_outputs.
                    let gb = if needs[0] {
                        Some(g.sum_to(&bshape)?)
                    } else {
                        None
                    };
                    Ok(vec![gb, g1, g2])
                },
            );
        }
        Ok(out)
    }

    /// Batched `[B,M,K] @ [B,K,N]`.
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        same_device(self, other, "bmm")?;
        same_dtype(self, other, "bmm")?;
        need_float(self, "bmm")?;
        need_ndim(self, 3, "bmm")?;
        need_ndim(other, 3, "bmm")?;
        let (a, b) = (self.shape(), other.shape());
        if a[0] != b[0] || a[2] != b[1] {
            return Err(TensorError::shape("bmm", format!("{a:?} @ {b:?}")));
        }
        let out = Tensor::empty(&[a[0], a[1], b[2]], self.dtype(), self.device())?;
        self.device().ensure_blas_handle(false)?;
        self.device()
            .backend()
            .matmul(self.kref(), other.kref(), out.kref(), false)?;
        if crate::autograd::should_record(&[self, other]) {
            let s1 = other.requires_grad().then(|| Saved::new(self));
            let s2 = self.requires_grad().then(|| Saved::new(other));
            record(
                "BmmBackward0",
                &[Some(self), Some(other)],
                &[&out],
                move |g, needs| {
                    let g = grad0(g, "BmmBackward0")?;
                    let g1 = match (&s2, needs[0]) {
                        (Some(m2), true) => Some(g.bmm(&m2.get("BmmBackward0")?.transpose(1, 2)?)?),
                        _ => None,
                    };
                    let g2 = match (&s1, needs[1]) {
                        (Some(m1), true) => Some(m1.get("BmmBackward0")?.transpose(1, 2)?.bmm(&g)?),
                        _ => None,
                    };
                    Ok(vec![g1, g2])
                },
            );
        }
        Ok(out)
    }

    /// `torch.matmul` for 2-d and batched (≥3-d, broadcast batch dims) operands.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let (da, db) = (self.ndim(), other.ndim());
        if da == 0 || db == 0 {
            return Err(TensorError::shape(
                "matmul",
                "both arguments need at least 1 dimension",
            ));
        }
        if da == 1 && db == 1 {
            return self.unsqueeze(0)?.mm(&other.unsqueeze(1)?)?.reshape(&[]);
        }
        if da <= 2 && db <= 2 {
            let a = if da == 1 {
                self.unsqueeze(0)?
            } else {
                self.clone()
            };
            let b = if db == 1 {
                other.unsqueeze(1)?
            } else {
                other.clone()
            };
            let mut out = a.mm(&b)?;
            if da == 1 {
                out = out.squeeze_dim(0)?;
            }
            if db == 1 {
                out = out.squeeze_dim(-1)?;
            }
            return Ok(out);
        }
        if db <= 2 {
            // Fold the batch into M, as PyTorch does: one GEMM, one output allocation.
            let k = self.shape()[da - 1];
            let lead: Vec<usize> = self.shape()[..da - 1].to_vec();
            let b = if db == 1 {
                other.unsqueeze(1)?
            } else {
                other.clone()
            };
            let out = self.reshape(&[lead.iter().product(), k])?.mm(&b)?;
            let mut shape = lead;
            if db == 2 {
                shape.push(b.shape()[1]);
            }
            return out.reshape(&shape);
        }
        let a = if da == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = other.clone();
        let (m, k) = (a.shape()[a.ndim() - 2], a.shape()[a.ndim() - 1]);
        let (k2, n) = (b.shape()[b.ndim() - 2], b.shape()[b.ndim() - 1]);
        if k != k2 {
            return Err(TensorError::shape(
                "matmul",
                format!("{:?} @ {:?}", a.shape(), b.shape()),
            ));
        }
        let batch = crate::layout::broadcast_shapes(
            &a.shape()[..a.ndim() - 2],
            &b.shape()[..b.ndim() - 2],
            "matmul",
        )?;
        let bn: usize = batch.iter().product();
        let mut sa = batch.clone();
        sa.extend([m, k]);
        let mut sb = batch.clone();
        sb.extend([k, n]);
        let a3 = a.expand(&sa)?.reshape(&[bn, m, k])?;
        let b3 = b.expand(&sb)?.reshape(&[bn, k, n])?;
        let mut shape = batch;
        shape.extend([m, n]);
        let out = a3.bmm(&b3)?.reshape(&shape)?;
        if da == 1 {
            return out.squeeze_dim(-2);
        }
        Ok(out)
    }
}

/// `F.linear(x, weight, bias)`: `x @ weight.t() + bias`, weight `[out, in]`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    need_ndim(weight, 2, "linear")?;
    if x.ndim() == 0 || x.shape()[x.ndim() - 1] != weight.shape()[1] {
        return Err(TensorError::shape(
            "linear",
            format!(
                "mat1 and mat2 shapes cannot be multiplied (input {:?}, weight {:?})",
                x.shape(),
                weight.shape()
            ),
        ));
    }
    let wt = weight.t()?;
    match bias {
        Some(b) if x.ndim() == 2 => Tensor::addmm(b, x, &wt),
        Some(b) if x.ndim() > 2 && x.is_contiguous() => {
            let lead: Vec<usize> = x.shape()[..x.ndim() - 1].to_vec();
            let k = x.shape()[x.ndim() - 1];
            let out = Tensor::addmm(b, &x.reshape(&[lead.iter().product(), k])?, &wt)?;
            let mut shape = lead;
            shape.push(weight.shape()[0]);
            out.reshape(&shape)
        }
        Some(b) => x.matmul(&wt)?.add(b),
        None => x.matmul(&wt),
    }
}
