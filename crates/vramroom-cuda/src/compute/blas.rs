//! Batched GEMM through cuBLAS, with workspaces from the caller.
//!
//! Design note: PyTorch keeps one cuBLAS handle per thread, and the forward (the calling
//! thread) and backward (autograd's device thread) each own one, each with a workspace it took
//! from the caching allocator (32 MiB on Hopper). Vramroom does the same: two handles, and
//! [`Gpu::bind_blas_workspace`] hands each the block the tensor runtime allocated for it, so
//! cuBLAS never allocates behind the allocator's back (and a GEMM is capturable into a CUDA
//! graph). fp32 GEMMs use `CUBLAS_COMPUTE_32F` without TF32, PyTorch's default
//! (`torch.backends.cuda.matmul.allow_tf32 = False`); bf16 and f16 accumulate in f32.
//!
//! Row-major `out[B,M,N] = a[B,M,K] @ b[B,K,N]` is computed as the column-major product
//! `out^T = b^T a^T`, which needs no copy for any view whose matrices have a unit stride on
//! one axis (transposes included); the runtime copies anything else before calling.

use cudarc::cublas::sys as cb;
use cudarc::driver::sys;

use super::libs::{ensure, Lib};
use super::{Dt, Gpu, Strided};
use crate::driver::{require_symbols, CudaError};

const SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetWorkspace_v2",
    "cublasGemmStridedBatchedEx",
];

fn status(call: &'static str, s: cb::cublasStatus_t) -> Result<(), CudaError> {
    if s == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::LibraryCall {
            call,
            status: format!("{s:?}"),
        })
    }
}

pub struct Blas {
    handles: [cb::cublasHandle_t; 2],
}

impl Blas {
    pub(crate) fn new(stream: sys::CUstream) -> Result<Blas, CudaError> {
        ensure(Lib::Cublas)?;
        // SAFETY: the library is loaded (ensure).
        require_symbols(unsafe { cb::culib() }, "cuBLAS", SYMBOLS)?;
        let mut b = Blas {
            handles: [std::ptr::null_mut(); 2],
        };
        for h in b.handles.iter_mut() {
            // SAFETY: out-pointer; the context is current (Gpu::with_blas binds it).
            status("cublasCreate", unsafe { cb::cublasCreate_v2(h) })?;
            // SAFETY: live handle and stream.
            status("cublasSetStream", unsafe {
                cb::cublasSetStream_v2(*h, stream as cb::cudaStream_t)
            })?;
        }
        Ok(b)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        for h in self.handles {
            if !h.is_null() {
                // SAFETY: created in new, destroyed once.
                unsafe { cb::cublasDestroy_v2(h) };
            }
        }
    }
}

/// How a row-major-indexed matrix X (r×c, element (i,j) at i*rs + j*cs) enters cuBLAS as the
/// column-major operand op(A) = X^T: `(transpose, leading dimension)`, or `None` when no unit
/// stride exists.
pub fn transposed_operand(r: i64, c: i64, rs: i64, cs: i64) -> Option<(bool, i64)> {
    // X^T (c×r) column-major with ld L puts (j,i) at j + i*L: needs cs == 1 and L = rs >= c.
    if cs == 1 || c == 1 {
        let ld = if r <= 1 { c.max(1) } else { rs };
        if ld >= c.max(1) {
            return Some((false, ld));
        }
    }
    // X stored column-major (r×c) with ld L puts (i,j) at i + j*L: op = transpose.
    if rs == 1 || r == 1 {
        let ld = if c <= 1 { r.max(1) } else { cs };
        if ld >= r.max(1) {
            return Some((true, ld));
        }
    }
    None
}

fn cuda_type(dt: Dt) -> Result<cb::cudaDataType_t, CudaError> {
    Ok(match dt {
        Dt::F32 => cb::cudaDataType_t::CUDA_R_32F,
        Dt::BF16 => cb::cudaDataType_t::CUDA_R_16BF,
        Dt::F16 => cb::cudaDataType_t::CUDA_R_16F,
        other => {
            return Err(CudaError::Invalid(format!(
                "matmul on {other:?} is not supported on CUDA"
            )))
        }
    })
}

impl Gpu {
    /// Give handle `which` (0 forward, 1 backward) its workspace: `size` bytes at `ptr`;
    /// [`super::blas_lt::LT_WORKSPACE`] names the cuBLASLt workspace instead.
    pub fn bind_blas_workspace(&self, which: usize, ptr: u64, size: u64) -> Result<(), CudaError> {
        if which == super::blas_lt::LT_WORKSPACE {
            return self.bind_lt_workspace(ptr, size);
        }
        self.with_blas(|b| {
            let h = b.handles[which.min(1)];
            // SAFETY: the caller owns ptr..ptr+size for as long as the handle may use it.
            status("cublasSetWorkspace", unsafe {
                cb::cublasSetWorkspace_v2(h, ptr as *mut std::ffi::c_void, size as usize)
            })
        })
    }

    /// Batched `out = a @ b (+ out)`: `a` [B,M,K], `b` [B,K,N], `out` [B,M,N], on handle
    /// `which`. Returns `Invalid` for a layout cuBLAS cannot take without a copy.
    pub fn matmul(
        &self,
        a: &Strided,
        b: &Strided,
        out: &Strided,
        accumulate: bool,
        which: usize,
    ) -> Result<(), CudaError> {
        for t in [a, b, out] {
            if t.ndim != 3 {
                return Err(CudaError::Invalid(format!(
                    "matmul takes 3-d views, got {:?}",
                    t.dims()
                )));
            }
        }
        let (bs, m, k) = (a.shape[0], a.shape[1], a.shape[2]);
        let n = b.shape[2];
        if b.shape[0] != bs || b.shape[1] != k || out.dims() != [bs, m, n] {
            return Err(CudaError::Invalid(format!(
                "matmul shapes {:?} @ {:?} -> {:?}",
                a.dims(),
                b.dims(),
                out.dims()
            )));
        }
        if bs * m * n == 0 {
            return Ok(());
        }
        if k == 0 {
            return if accumulate {
                Ok(())
            } else {
                self.fill(out, 0.0)
            };
        }
        let bad = |what: &str| {
            CudaError::Invalid(format!(
                "matmul: {what} has no unit stride (copy it to a contiguous tensor first)"
            ))
        };
        // op(A) = b^T (N×K), op(B) = a^T (K×M), C = out^T (N×M).
        let (ta, lda) = transposed_operand(k, n, b.strides[1], b.strides[2]).ok_or(bad("mat2"))?;
        let (tb, ldb) = transposed_operand(m, k, a.strides[1], a.strides[2]).ok_or(bad("mat1"))?;
        let (tc, ldc) =
            transposed_operand(m, n, out.strides[1], out.strides[2]).ok_or(bad("the output"))?;
        if tc {
            return Err(bad("the output (column-major)"));
        }
        let dt = out.dt();
        if a.dt() != dt || b.dt() != dt {
            return Err(CudaError::Invalid(
                "matmul operands must share a dtype".into(),
            ));
        }
        let ty = cuda_type(dt)?;
        let bstride = |t: &Strided| if bs == 1 { 0 } else { t.strides[0] };
        let alpha = 1f32;
        let beta = if accumulate { 1f32 } else { 0f32 };
        let op = |t: bool| {
            if t {
                cb::cublasOperation_t::CUBLAS_OP_T
            } else {
                cb::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let too_big = [m, n, k, lda, ldb, ldc, bs]
            .iter()
            .any(|&v| v > i32::MAX as i64);
        if too_big {
            return Err(CudaError::Invalid(
                "matmul dimensions exceed cuBLAS's 32-bit limits".into(),
            ));
        }
        self.with_blas(|bl| {
            let h = bl.handles[which.min(1)];
            // SAFETY: the three views lie inside live allocations (checked by the runtime);
            // the leading dimensions and strides were derived from those views above; alpha
            // and beta are f32 as CUBLAS_COMPUTE_32F requires.
            status("cublasGemmStridedBatchedEx", unsafe {
                cb::cublasGemmStridedBatchedEx(
                    h,
                    op(ta),
                    op(tb),
                    n as i32,
                    m as i32,
                    k as i32,
                    &alpha as *const f32 as *const std::ffi::c_void,
                    b.addr() as *const std::ffi::c_void,
                    ty,
                    lda as i32,
                    bstride(b),
                    a.addr() as *const std::ffi::c_void,
                    ty,
                    ldb as i32,
                    bstride(a),
                    &beta as *const f32 as *const std::ffi::c_void,
                    out.addr() as *mut std::ffi::c_void,
                    ty,
                    ldc as i32,
                    bstride(out),
                    bs as i32,
                    cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::transposed_operand;

    #[test]
    fn operands_for_row_major_column_major_and_vectors() {
        // Row-major 3×4 (rs 4, cs 1): X^T is column-major 4×3 with ld 4.
        assert_eq!(transposed_operand(3, 4, 4, 1), Some((false, 4)));
        // Its transpose view, 4×3 with (rs 1, cs 4): stored column-major, op = T, ld 4.
        assert_eq!(transposed_operand(4, 3, 1, 4), Some((true, 4)));
        // A row vector with any row stride.
        assert_eq!(transposed_operand(1, 5, 99, 1), Some((false, 5)));
        // A column vector with unit row stride.
        assert_eq!(transposed_operand(5, 1, 1, 7), Some((false, 1)));
        // Neither stride is 1.
        assert_eq!(transposed_operand(3, 4, 8, 2), None);
        // Overlapping rows (ld smaller than the row) are not BLAS operands.
        assert_eq!(transposed_operand(3, 4, 2, 1), None);
    }
}
