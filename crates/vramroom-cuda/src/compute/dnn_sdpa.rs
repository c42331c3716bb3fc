//! The attention forward on cuDNN's fused flash-attention engine, for the f16/bf16 calls
//! PyTorch itself sends to cuDNN.
//!
//! Design note: on an H200, PyTorch 2.11's `scaled_dot_product_attention` runs f16/bf16 on
//! cuDNN's SDPA (Hopper wgmma kernels), about twice the speed of our `mma.sync` flash
//! kernel (GPT-2 32x1024 bf16: 152 against 320 µs a call). cuDNN exposes that engine only
//! through its graph API: a graph of matmul, pointwise and reduction ops that its runtime
//! fusion recognizes as attention. This module builds the graph cudnn-frontend's `sdpa` node
//! builds for cuDNN 9 (PyTorch's `MHA.cpp` goes through that node): `S = Q Kᵀ`, times the
//! scale (a by-value scalar), the causal mask as row/column indices, a `>=` and a select of
//! -inf, the softmax as max, subtract, exp, sum, log + max (the stats: the logsumexp,
//! written out when the caller wants it, else virtual as in the frontend's inference graph),
//! divide, and `O = P V` with P in the input dtype. Everything between Q, K, V and O is
//! virtual: the fused kernel keeps it on chip.
//!
//! Plans are built once per call shape (sizes, strides, alignments, causal, stats) and
//! cached, as `dnn_graph` does for convolutions; a call then only fills a variant pack. A
//! shape cuDNN declines caches "no plan" and the caller runs our own kernel instead.

use std::collections::HashMap;
use std::convert::Infallible;
use std::ffi::c_void;

use cudarc::cudnn::sys as dn;

use super::dnn_graph::{self, tensor_held, Desc, Held, Plan, Plans};
use super::Dt;
use crate::driver::CudaError;

use dn::cudnnBackendAttributeName_t as A;
use dn::cudnnBackendAttributeType_t as Ty;
use dn::cudnnBackendDescriptorType_t as D;
use dn::cudnnDataType_t as DataType;
use dn::cudnnPointwiseMode_t as Pw;

const UID_Q: i64 = 1;
const UID_K: i64 = 2;
const UID_V: i64 = 3;
const UID_O: i64 = 4;
const UID_STATS: i64 = 5;
const UID_SCALE: i64 = 6;
const UID_NEG_INF: i64 = 7;
/// Virtual tensors are numbered from here.
const UID_VIRTUAL: i64 = 100;
/// Shapes cached before the cache starts over (a server sees a new length per prompt).
const MAX_SHAPES: usize = 1024;

/// One attention call as cuDNN sees it: sizes, element strides, pointer alignments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SdpaShape {
    pub dt: Dt,
    /// b, query heads, key heads, query rows, keys, head dim of q/k, head dim of v.
    pub sizes: [i64; 7],
    pub q: [i64; 4],
    pub k: [i64; 4],
    pub v: [i64; 4],
    pub o: [i64; 4],
    /// The logsumexp's strides [B, H, T] when the caller wants it.
    pub stats: Option<[i64; 3]>,
    pub causal: bool,
    /// q, k, v, o, stats.
    pub align: [u8; 5],
}

/// Device pointers of one call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SdpaPtrs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub stats: u64,
    pub workspace: u64,
}

/// Built plans by shape.
#[derive(Default)]
pub(crate) struct SdpaCache {
    plans: HashMap<SdpaShape, Plans>,
}

impl SdpaCache {
    /// The best plan for `shape`, built on first use; `None` when cuDNN declines the shape.
    pub fn plan(&mut self, handle: dn::cudnnHandle_t, shape: &SdpaShape) -> Option<&Plan> {
        // A shape cuDNN declines is cached too, as "no plan".
        let Ok(plans) = super::cached(&mut self.plans, shape, MAX_SHAPES, || {
            Ok::<_, Infallible>(build(handle, shape).unwrap_or_else(|e| {
                tracing::debug!(?shape, error = %e, "no cuDNN attention plan");
                Plans::none()
            }))
        });
        plans.plans.first()
    }

    /// Forget `shape`'s plans (one that finalized but would not run).
    pub fn decline(&mut self, shape: &SdpaShape) {
        self.plans.insert(shape.clone(), Plans::none());
    }
}

/// The graph's tensors and ops under construction.
struct Graph {
    keep: Vec<Desc>,
    ops: Vec<Desc>,
    next_uid: i64,
}

impl Graph {
    /// A virtual tensor; its descriptor is kept, its index into `keep` returned.
    fn virt(&mut self, dt: DataType, dims: [i64; 4]) -> Result<usize, CudaError> {
        let strides = packed(dims);
        let uid = self.next_uid;
        self.next_uid += 1;
        self.keep
            .push(tensor_held(uid, dt, &dims, &strides, 16, Held::Virtual)?);
        Ok(self.keep.len() - 1)
    }

    fn push(&mut self, d: Desc) -> usize {
        self.keep.push(d);
        self.keep.len() - 1
    }

    /// `y = mode(x[, b[, t]])` in `math` precision, with `ins` = [x, b, t] as the mode takes.
    fn pointwise(
        &mut self,
        mode: Pw,
        math: DataType,
        axis: Option<i64>,
        ins: &[usize],
        y: usize,
    ) -> Result<(), CudaError> {
        let pw = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        pw.set(
            A::CUDNN_ATTR_POINTWISE_MODE,
            Ty::CUDNN_TYPE_POINTWISE_MODE,
            &[mode],
        )?;
        pw.set(
            A::CUDNN_ATTR_POINTWISE_MATH_PREC,
            Ty::CUDNN_TYPE_DATA_TYPE,
            &[math],
        )?;
        if let Some(axis) = axis {
            pw.set_i64(A::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        let pw = pw.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &pw)?;
        let ports = [
            A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
            A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
            A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        ];
        for (&port, &t) in ports.iter().zip(ins) {
            op.set_desc(port, &self.keep[t])?;
        }
        op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &self.keep[y])?;
        self.ops.push(op.finalize()?);
        self.keep.push(pw);
        Ok(())
    }

    /// `y = reduce(x)` over the last dim.
    fn reduction(
        &mut self,
        mode: dn::cudnnReduceTensorOp_t,
        x: usize,
        y: usize,
    ) -> Result<(), CudaError> {
        let r = Desc::new(D::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        r.set(
            A::CUDNN_ATTR_REDUCTION_OPERATOR,
            Ty::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
            &[mode],
        )?;
        r.set(
            A::CUDNN_ATTR_REDUCTION_COMP_TYPE,
            Ty::CUDNN_TYPE_DATA_TYPE,
            &[DataType::CUDNN_DATA_FLOAT],
        )?;
        let r = r.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &r)?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &self.keep[x])?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &self.keep[y])?;
        self.ops.push(op.finalize()?);
        self.keep.push(r);
        Ok(())
    }

    /// `c = a b` (batched over the leading dims), accumulated in f32.
    fn matmul(&mut self, a: usize, b: usize, c: usize) -> Result<(), CudaError> {
        let m = Desc::new(D::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        m.set(
            A::CUDNN_ATTR_MATMUL_COMP_TYPE,
            Ty::CUDNN_TYPE_DATA_TYPE,
            &[DataType::CUDNN_DATA_FLOAT],
        )?;
        let m = m.finalize()?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &self.keep[a])?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &self.keep[b])?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &self.keep[c])?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &m)?;
        self.ops.push(op.finalize()?);
        self.keep.push(m);
        Ok(())
    }
}

fn packed(d: [i64; 4]) -> [i64; 4] {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1]
}

fn build(handle: dn::cudnnHandle_t, s: &SdpaShape) -> Result<Plans, CudaError> {
    let io = dnn_graph::data_type(s.dt)
        .filter(|_| matches!(s.dt, Dt::BF16 | Dt::F16))
        .ok_or_else(|| CudaError::Invalid(format!("cuDNN attention on {:?}", s.dt)))?;
    let f32t = DataType::CUDNN_DATA_FLOAT;
    let [b, hq, hkv, tq, sk, d, dv] = s.sizes;
    let [aq, ak, av, ao, al] = s.align;
    let mut g = Graph {
        keep: Vec::new(),
        ops: Vec::new(),
        next_uid: UID_VIRTUAL,
    };
    let mem = |uid, dt, dims: [i64; 4], st: [i64; 4], align| {
        tensor_held(uid, dt, &dims, &st, align, Held::Memory)
    };
    let q = g.push(mem(UID_Q, io, [b, hq, tq, d], s.q, aq)?);
    // cuDNN's backend takes Kᵀ: K's view with the last two dims swapped.
    let kt = g.push(mem(
        UID_K,
        io,
        [b, hkv, d, sk],
        [s.k[0], s.k[1], s.k[3], s.k[2]],
        ak,
    )?);
    let v = g.push(mem(UID_V, io, [b, hkv, sk, dv], s.v, av)?);
    let o = g.push(mem(UID_O, io, [b, hq, tq, dv], s.o, ao)?);
    let one = [1, 1, 1, 1];
    let scale = g.push(tensor_held(UID_SCALE, f32t, &one, &one, 16, Held::ByValue)?);

    let scores = [b, hq, tq, sk];
    let rows = [b, hq, tq, 1];
    let s1 = g.virt(f32t, scores)?;
    g.matmul(q, kt, s1)?;
    let mut x = g.virt(f32t, scores)?;
    g.pointwise(Pw::CUDNN_POINTWISE_MUL, f32t, None, &[s1, scale], x)?;
    if s.causal {
        let neg_inf = g.push(tensor_held(
            UID_NEG_INF,
            f32t,
            &one,
            &one,
            16,
            Held::ByValue,
        )?);
        let row = g.virt(DataType::CUDNN_DATA_INT32, scores)?;
        g.pointwise(Pw::CUDNN_POINTWISE_GEN_INDEX, f32t, Some(2), &[x], row)?;
        let col = g.virt(DataType::CUDNN_DATA_INT32, scores)?;
        g.pointwise(Pw::CUDNN_POINTWISE_GEN_INDEX, f32t, Some(3), &[x], col)?;
        let keep = g.virt(DataType::CUDNN_DATA_BOOLEAN, scores)?;
        let boolean = DataType::CUDNN_DATA_BOOLEAN;
        g.pointwise(Pw::CUDNN_POINTWISE_CMP_GE, boolean, None, &[row, col], keep)?;
        let masked = g.virt(f32t, scores)?;
        let select = Pw::CUDNN_POINTWISE_BINARY_SELECT;
        g.pointwise(select, f32t, None, &[x, neg_inf, keep], masked)?;
        x = masked;
    }
    let max = g.virt(f32t, rows)?;
    g.reduction(dn::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX, x, max)?;
    let sub = g.virt(f32t, scores)?;
    g.pointwise(Pw::CUDNN_POINTWISE_SUB, f32t, None, &[x, max], sub)?;
    let exp = g.virt(f32t, scores)?;
    g.pointwise(Pw::CUDNN_POINTWISE_EXP, f32t, None, &[sub], exp)?;
    let sum = g.virt(f32t, rows)?;
    g.reduction(dn::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD, exp, sum)?;
    let log = g.virt(f32t, rows)?;
    g.pointwise(Pw::CUDNN_POINTWISE_LOG, f32t, None, &[sum], log)?;
    let stats = match s.stats {
        Some([s0, s1, s2]) => g.push(mem(UID_STATS, f32t, rows, [s0, s1, s2, 1], al)?),
        None => g.virt(f32t, rows)?,
    };
    g.pointwise(Pw::CUDNN_POINTWISE_ADD, f32t, None, &[max, log], stats)?;
    let p = g.virt(io, scores)?;
    g.pointwise(Pw::CUDNN_POINTWISE_DIV, f32t, None, &[exp, sum], p)?;
    g.matmul(p, v, o)?;

    dnn_graph::plans(handle, g.ops, g.keep, |_| false)
}

/// Run `plan` (built for `shape`) on `ptrs` with softmax scale `scale`.
pub(crate) fn execute(
    handle: dn::cudnnHandle_t,
    plan: &Plan,
    shape: &SdpaShape,
    ptrs: &SdpaPtrs,
    scale: f32,
) -> Result<(), CudaError> {
    let mut scale = scale;
    let mut neg_inf = f32::NEG_INFINITY;
    let mut uids = vec![UID_Q, UID_K, UID_V, UID_O, UID_SCALE];
    let mut p: Vec<*mut c_void> = [ptrs.q, ptrs.k, ptrs.v, ptrs.o]
        .iter()
        .map(|&x| x as *mut c_void)
        .collect();
    p.push(&mut scale as *mut f32 as *mut c_void);
    if shape.causal {
        uids.push(UID_NEG_INF);
        p.push(&mut neg_inf as *mut f32 as *mut c_void);
    }
    if shape.stats.is_some() {
        uids.push(UID_STATS);
        p.push(ptrs.stats as *mut c_void);
    }
    // SAFETY: the plan was built for `shape`, whose sizes, strides and alignments the caller
    // took from these pointers' views; the by-value scalars live on this stack frame until
    // cuDNN returns (it copies them at launch); the workspace holds `plan.workspace` bytes
    // (the caller checked).
    unsafe { dnn_graph::execute_pack(handle, plan, &uids, &p, ptrs.workspace) }
}
