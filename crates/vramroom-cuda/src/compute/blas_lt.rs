//! `out = a @ b + bias` in one cuBLASLt call: the bias is added in the GEMM's epilogue.
//!
//! Design note: PyTorch's `addmm` with a 1-d bias (every `nn.Linear` on CUDA, GPT-2's
//! `Conv1D`) goes to cuBLASLt (`gemm_and_bias`, `CUBLASLT_EPILOGUE_BIAS`) with the 1 MiB
//! per-device workspace it takes from the caching allocator. Vramroom did the same sum as a
//! bias copy into the output and a GEMM with beta = 1: 48 more launches per bf16 GPT-2
//! forward at 32×1024, 1.4 ms of 59. Here the tensor runtime's per-device workspace
//! ([`Gpu::bind_blas_workspace`] with `which` = [`LT_WORKSPACE`]) is cuBLASLt's, so cuBLASLt
//! allocates nothing behind the allocator's back. The heuristic's first algorithm is
//! cached per problem (sizes, transposes, dtype and each pointer's alignment, which the
//! heuristic must be told: by default it assumes 256-byte alignment); only the bias
//! pointer is set per call. A problem cuBLASLt has no algorithm for returns `Ok(false)`
//! and the caller falls back to copy + GEMM, as PyTorch does when Lt declines.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::sys as lt;

use super::blas::transposed_operand;
use super::libs::{ensure, Lib};
use super::{Dt, Gpu, Strided};
use crate::driver::{require_symbols, CudaError};

/// Plans kept per device before the cache starts over.
const MAX_PLANS: usize = 1024;

/// `which` of [`Gpu::bind_blas_workspace`] that names the cuBLASLt workspace.
pub const LT_WORKSPACE: usize = 2;

const SYMBOLS: &[&str] = &[
    "cublasLtCreate",
    "cublasLtDestroy",
    "cublasLtMatmulDescCreate",
    "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute",
    "cublasLtMatrixLayoutCreate",
    "cublasLtMatrixLayoutDestroy",
    "cublasLtMatmulPreferenceCreate",
    "cublasLtMatmulPreferenceDestroy",
    "cublasLtMatmulPreferenceSetAttribute",
    "cublasLtMatmulAlgoGetHeuristic",
    "cublasLtMatmul",
];

fn status(call: &'static str, s: lt::cublasStatus_t) -> Result<(), CudaError> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::LibraryCall {
            call,
            status: format!("{s:?}"),
        })
    }
}

/// What the heuristic's answer depends on.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    dt: i32,
    ta: bool,
    tb: bool,
    m: i64,
    n: i64,
    k: i64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    align: [u32; 4],
    workspace: u64,
}

/// Descriptors and algorithm for one [`Key`]; `None` algo: cuBLASLt has none.
struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: Option<lt::cublasLtMatmulAlgo_t>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by Plan::new, destroyed once.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    lt::cublasLtMatrixLayoutDestroy(l);
                }
            }
            if !self.desc.is_null() {
                lt::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

pub struct BlasLt {
    handle: lt::cublasLtHandle_t,
    workspace: (u64, u64),
    plans: HashMap<Key, Plan>,
}

// SAFETY: the handle and descriptors are used under the Gpu's mutex only.
unsafe impl Send for BlasLt {}

impl Drop for BlasLt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created in new, destroyed once, after its plans.
        unsafe { lt::cublasLtDestroy(self.handle) };
    }
}

fn lt_type(dt: Dt) -> Option<lt::cudaDataType> {
    match dt {
        Dt::F32 => Some(lt::cudaDataType::CUDA_R_32F),
        Dt::BF16 => Some(lt::cudaDataType::CUDA_R_16BF),
        Dt::F16 => Some(lt::cudaDataType::CUDA_R_16F),
        _ => None,
    }
}

/// The largest power of two (up to 256) that divides `addr`, as PyTorch's `_getAlignment`
/// (dnn_graph.rs's `alignment` caps at cuDNN's 16).
fn alignment(addr: u64) -> u32 {
    1u32 << (addr | 256).trailing_zeros().min(8)
}

impl BlasLt {
    pub(crate) fn new() -> Result<BlasLt, CudaError> {
        ensure(Lib::Cublas)?;
        // SAFETY: a presence check (dlopen by name); cuBLAS's loading opened cuBLASLt first.
        if !unsafe { lt::is_culib_present() } {
            return Err(CudaError::Library {
                lib: "cuBLASLt",
                why: "libcublasLt.so.13 not found".into(),
            });
        }
        // SAFETY: the library is present (checked above).
        require_symbols(unsafe { lt::culib() }, "cuBLASLt", SYMBOLS)?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer; the context is current (Gpu::with_blas_lt binds it).
        status("cublasLtCreate", unsafe { lt::cublasLtCreate(&mut handle) })?;
        Ok(BlasLt {
            handle,
            workspace: (0, 0),
            plans: HashMap::new(),
        })
    }

    fn plan(&mut self, key: Key) -> Result<&Plan, CudaError> {
        // A server sees a new M per prompt length (a miss costs one heuristic query, tens
        // of microseconds).
        let handle = self.handle;
        super::cached(&mut self.plans, &key, MAX_PLANS, || Plan::new(handle, &key))
    }
}

fn set_desc<V>(
    desc: lt::cublasLtMatmulDesc_t,
    attr: lt::cublasLtMatmulDescAttributes_t,
    v: &V,
) -> Result<(), CudaError> {
    // SAFETY: v is a live value of the attribute's type and size.
    status("cublasLtMatmulDescSetAttribute", unsafe {
        lt::cublasLtMatmulDescSetAttribute(
            desc,
            attr,
            v as *const V as *const c_void,
            std::mem::size_of::<V>(),
        )
    })
}

impl Plan {
    fn new(handle: lt::cublasLtHandle_t, key: &Key) -> Result<Plan, CudaError> {
        use lt::cublasLtMatmulDescAttributes_t as DA;
        use lt::cublasLtMatmulPreferenceAttributes_t as PA;
        let ty = lt_type(match key.dt {
            0 => Dt::F32,
            1 => Dt::F16,
            _ => Dt::BF16,
        })
        .ok_or_else(|| CudaError::Invalid("cuBLASLt: not a float dtype".into()))?;
        let mut plan = Plan {
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: None,
        };
        // SAFETY: out-pointer.
        status("cublasLtMatmulDescCreate", unsafe {
            lt::cublasLtMatmulDescCreate(
                &mut plan.desc,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt::cudaDataType::CUDA_R_32F,
            )
        })?;
        set_desc(plan.desc, DA::CUBLASLT_MATMUL_DESC_TRANSA, &(key.ta as i32))?;
        set_desc(plan.desc, DA::CUBLASLT_MATMUL_DESC_TRANSB, &(key.tb as i32))?;
        set_desc(
            plan.desc,
            DA::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        )?;
        // Column-major: A = op(b^T) is n×k, B = op(a^T) is k×m, D = out^T is n×m.
        let (ar, ac) = if key.ta {
            (key.k, key.n)
        } else {
            (key.n, key.k)
        };
        let (br, bc) = if key.tb {
            (key.m, key.k)
        } else {
            (key.k, key.m)
        };
        let dims = [
            (ar, ac, key.lda),
            (br, bc, key.ldb),
            (key.n, key.m, key.ldc),
        ];
        for (l, (r, c, ld)) in plan.layouts.iter_mut().zip(dims) {
            // SAFETY: out-pointer; sizes are positive and checked against i32 by the caller.
            status("cublasLtMatrixLayoutCreate", unsafe {
                lt::cublasLtMatrixLayoutCreate(l, ty, r as u64, c as u64, ld)
            })?;
        }
        let mut pref = std::ptr::null_mut();
        // SAFETY: out-pointer.
        status("cublasLtMatmulPreferenceCreate", unsafe {
            lt::cublasLtMatmulPreferenceCreate(&mut pref)
        })?;
        struct Pref(lt::cublasLtMatmulPreference_t);
        impl Drop for Pref {
            fn drop(&mut self) {
                // SAFETY: created above, destroyed once.
                unsafe { lt::cublasLtMatmulPreferenceDestroy(self.0) };
            }
        }
        let pref = Pref(pref);
        fn set_pref<V>(
            pref: lt::cublasLtMatmulPreference_t,
            attr: PA,
            v: V,
        ) -> Result<(), CudaError> {
            // SAFETY: v is a live value of the attribute's type and size.
            status("cublasLtMatmulPreferenceSetAttribute", unsafe {
                lt::cublasLtMatmulPreferenceSetAttribute(
                    pref,
                    attr,
                    &v as *const V as *const c_void,
                    std::mem::size_of::<V>(),
                )
            })
        }
        // The workspace size is a uint64_t, the alignments uint32_t.
        set_pref(
            pref.0,
            PA::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            key.workspace,
        )?;
        set_pref(
            pref.0,
            PA::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            key.align[0],
        )?;
        set_pref(
            pref.0,
            PA::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            key.align[1],
        )?;
        set_pref(
            pref.0,
            PA::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            key.align[2],
        )?;
        set_pref(
            pref.0,
            PA::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
            key.align[2],
        )?;
        // SAFETY: a zeroed result is a valid out-value (plain data).
        let mut result: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let mut count = 0i32;
        let [a, b, d] = plan.layouts;
        // SAFETY: live handle, descriptors and preference; one result slot.
        let s = unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(
                handle,
                plan.desc,
                a,
                b,
                d,
                d,
                pref.0,
                1,
                &mut result,
                &mut count,
            )
        };
        if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS && count > 0 {
            plan.algo = Some(result.algo);
        }
        Ok(plan)
    }
}

impl Gpu {
    /// `out = a @ b + bias` (bias broadcast over rows) with the bias in cuBLASLt's epilogue:
    /// `a` [1,M,K], `b` [1,K,N], `out` [1,M,N] row-major, `bias` [N] contiguous, one float
    /// dtype. `Ok(false)`: cuBLASLt takes no such problem (a layout, a dtype, no algorithm);
    /// nothing was written and the caller computes it another way.
    pub fn matmul_bias(
        &self,
        a: &Strided,
        b: &Strided,
        bias: &Strided,
        out: &Strided,
    ) -> Result<bool, CudaError> {
        if [a, b, out].iter().any(|t| t.ndim != 3 || t.shape[0] != 1) || bias.ndim != 1 {
            return Ok(false);
        }
        let (m, k, n) = (a.shape[1], a.shape[2], b.shape[2]);
        let dt = out.dt();
        if b.shape[1] != k
            || out.dims() != [1, m, n]
            || bias.shape[0] != n
            || (bias.strides[0] != 1 && n > 1)
            || lt_type(dt).is_none()
            || [a, b, bias].iter().any(|t| t.dtype != out.dtype)
            || m * n * k == 0
        {
            return Ok(false);
        }
        let Some((ta, lda)) = transposed_operand(k, n, b.strides[1], b.strides[2]) else {
            return Ok(false);
        };
        let Some((tb, ldb)) = transposed_operand(m, k, a.strides[1], a.strides[2]) else {
            return Ok(false);
        };
        let (tc, ldc) = match transposed_operand(m, n, out.strides[1], out.strides[2]) {
            Some(v) => v,
            None => return Ok(false),
        };
        // The epilogue reads the bias with vector loads.
        if tc
            || alignment(bias.addr()) < 16
            || [m, n, k, lda, ldb, ldc]
                .iter()
                .any(|&v| v > i32::MAX as i64)
        {
            return Ok(false);
        }
        let stream = self.stream;
        self.with_blas_lt(|l| {
            let key = Key {
                dt: out.dtype,
                ta,
                tb,
                m,
                n,
                k,
                lda,
                ldb,
                ldc,
                align: [
                    alignment(b.addr()),
                    alignment(a.addr()),
                    alignment(out.addr()),
                    alignment(bias.addr()),
                ],
                workspace: l.workspace.1,
            };
            let ws = l.workspace;
            let handle = l.handle;
            let plan = l.plan(key)?;
            let Some(algo) = plan.algo else {
                return Ok(false);
            };
            let ptr = bias.addr() as *const c_void;
            set_desc(
                plan.desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &ptr,
            )?;
            let (alpha, beta) = (1f32, 0f32);
            let [ad, bd, dd] = plan.layouts;
            // SAFETY: the views lie inside live allocations (checked by the runtime); the
            // layouts were built from these sizes and strides; the workspace is the
            // runtime's, bound for this device; alpha and beta are f32 as the scale type.
            status("cublasLtMatmul", unsafe {
                lt::cublasLtMatmul(
                    handle,
                    plan.desc,
                    &alpha as *const f32 as *const c_void,
                    b.addr() as *const c_void,
                    ad,
                    a.addr() as *const c_void,
                    bd,
                    &beta as *const f32 as *const c_void,
                    out.addr() as *const c_void,
                    dd,
                    out.addr() as *mut c_void,
                    dd,
                    &algo,
                    ws.0 as *mut c_void,
                    ws.1 as usize,
                    stream as lt::cudaStream_t,
                )
            })?;
            Ok(true)
        })
    }

    /// Run `f` with this device's cuBLASLt handle (created on first use).
    fn with_blas_lt<R>(
        &self,
        f: impl FnOnce(&mut BlasLt) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        self.bind()?;
        let mut g = self.blas_lt.lock();
        if g.is_none() {
            *g = Some(BlasLt::new()?);
        }
        f(g.as_mut().expect("created above"))
    }

    /// The cuBLASLt workspace: `size` bytes at `ptr`, owned by the caller.
    pub(crate) fn bind_lt_workspace(&self, ptr: u64, size: u64) -> Result<(), CudaError> {
        self.with_blas_lt(|l| {
            l.workspace = (ptr, size);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0), 256);
        assert_eq!(alignment(512), 256);
        assert_eq!(alignment(2), 2);
        assert_eq!(alignment(6), 2);
        assert_eq!(alignment(48), 16);
        assert_eq!(alignment(1), 1);
    }
}
