//! Forward convolutions through cuDNN's backend (graph) API, with execution plans cached per
//! shape.
//!
//! Design note: cuDNN 9 implements the legacy `cudnnConvolutionForward` on top of its graph
//! API and redoes much of that work on every call: on the H200 host it cost about 67 µs of
//! CPU per convolution, which made ResNet-50 at batch 1 (53 convolutions) CPU-bound. PyTorch
//! builds an operation graph once per shape, asks the heuristics (mode A) for engine
//! configs, finalizes an execution plan and caches it; a call then only builds a variant
//! pack (three pointers and a workspace) and executes. This module does the same. The cache
//! key includes each pointer's alignment (up to 16 bytes), as PyTorch's does, because a plan
//! may assume it. Plans keep every descriptor they were built from alive. With
//! `allow_tf32` off, fp32 engines that use tensor cores are skipped, as PyTorch skips them.
//! Anything the backend API cannot do (or a cuDNN without it) reports "no plan" and the
//! caller uses the legacy API.

use std::ffi::c_void;

use cudarc::cudnn::sys as dn;

use super::dnn::ConvSpec;
use super::Dt;
use crate::driver::CudaError;

use dn::cudnnBackendAttributeName_t as A;
use dn::cudnnBackendAttributeType_t as Ty;
use dn::cudnnBackendDescriptorType_t as D;

/// Symbols this module calls: checked before the first call, because a missing one would
/// panic in the dynamic loader.
pub(crate) const SYMBOLS: &[&str] = &[
    "cudnnBackendCreateDescriptor",
    "cudnnBackendDestroyDescriptor",
    "cudnnBackendSetAttribute",
    "cudnnBackendGetAttribute",
    "cudnnBackendFinalize",
    "cudnnBackendExecute",
];

/// At most this many engine configs are tried per shape, and this many plans kept.
const MAX_CONFIGS: usize = 8;
const MAX_PLANS: usize = 3;
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_Y: i64 = 3;

pub(super) fn check(call: &'static str, s: dn::cudnnStatus_t) -> Result<(), CudaError> {
    if s == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::LibraryCall {
            call,
            status: format!("{s:?}"),
        })
    }
}

/// One backend descriptor, destroyed on drop.
pub(super) struct Desc(pub(super) dn::cudnnBackendDescriptor_t);

impl Desc {
    pub(super) fn new(ty: D) -> Result<Desc, CudaError> {
        let mut d: dn::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: out-pointer.
        check("cudnnBackendCreateDescriptor", unsafe {
            dn::cudnnBackendCreateDescriptor(ty, &mut d)
        })?;
        Ok(Desc(d))
    }

    /// Set attribute `name` to `n` elements of type `ty` at `v`.
    pub(super) fn set<T>(&self, name: A, ty: Ty, v: &[T]) -> Result<(), CudaError> {
        // SAFETY: `v` holds `v.len()` elements of the type `ty` names (every caller pairs
        // them); cuDNN copies them before returning.
        check("cudnnBackendSetAttribute", unsafe {
            dn::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                v.len() as i64,
                v.as_ptr() as *const c_void,
            )
        })
    }

    pub(super) fn set_i64(&self, name: A, v: &[i64]) -> Result<(), CudaError> {
        self.set(name, Ty::CUDNN_TYPE_INT64, v)
    }

    pub(super) fn set_desc(&self, name: A, d: &Desc) -> Result<(), CudaError> {
        self.set(name, Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR, &[d.0])
    }

    pub(super) fn finalize(self) -> Result<Desc, CudaError> {
        // SAFETY: live descriptor.
        check("cudnnBackendFinalize", unsafe {
            dn::cudnnBackendFinalize(self.0)
        })?;
        Ok(self)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by `Desc::new`, destroyed once.
            unsafe { dn::cudnnBackendDestroyDescriptor(self.0) };
        }
    }
}

// SAFETY: descriptors are plain host objects; the `Dnn` that owns them is used under the
// device's lock, one thread at a time.
unsafe impl Send for Desc {}

/// An execution plan and the descriptors it was built from.
pub(crate) struct Plan {
    plan: Desc,
    pub workspace: u64,
}

/// The plans of one (shape, tf32, alignment), best first, and what they were built from.
pub(crate) struct Plans {
    pub plans: Vec<Plan>,
    _graph: Vec<Desc>,
}

impl Plans {
    /// No plans: the caller uses the legacy API.
    pub fn none() -> Plans {
        Plans {
            plans: Vec::new(),
            _graph: Vec::new(),
        }
    }
}

/// The largest power of two, up to 16, that divides `ptr`.
pub(crate) fn alignment(ptr: u64) -> u8 {
    1u8 << (ptr | 16).trailing_zeros().min(4)
}

pub(super) fn data_type(dt: Dt) -> Option<dn::cudnnDataType_t> {
    match dt {
        Dt::F32 => Some(dn::cudnnDataType_t::CUDNN_DATA_FLOAT),
        Dt::F16 => Some(dn::cudnnDataType_t::CUDNN_DATA_HALF),
        Dt::BF16 => Some(dn::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        _ => None,
    }
}

/// How a graph tensor is held: in device memory (a variant-pack pointer), only inside the
/// fused kernel (virtual), or as a host scalar passed by value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    Memory,
    Virtual,
    ByValue,
}

fn tensor(
    uid: i64,
    dt: dn::cudnnDataType_t,
    dims: &[i64; 4],
    strides: &[i64; 4],
    align: u8,
) -> Result<Desc, CudaError> {
    tensor_held(uid, dt, dims, strides, align, Held::Memory)
}

pub(super) fn tensor_held(
    uid: i64,
    dt: dn::cudnnDataType_t,
    dims: &[i64; 4],
    strides: &[i64; 4],
    align: u8,
    held: Held,
) -> Result<Desc, CudaError> {
    let d = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    d.set(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[dt],
    )?;
    d.set_i64(A::CUDNN_ATTR_TENSOR_DIMENSIONS, dims)?;
    // cuDNN wants a positive stride even on size-1 dims.
    let s: Vec<i64> = strides.iter().map(|&s| s.max(1)).collect();
    d.set_i64(A::CUDNN_ATTR_TENSOR_STRIDES, &s)?;
    d.set_i64(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    d.set_i64(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[align as i64])?;
    if held != Held::Memory {
        let attr = if held == Held::Virtual {
            A::CUDNN_ATTR_TENSOR_IS_VIRTUAL
        } else {
            A::CUDNN_ATTR_TENSOR_IS_BY_VALUE
        };
        d.set(attr, Ty::CUDNN_TYPE_BOOLEAN, &[true])?;
    }
    d.finalize()
}

/// Whether engine config `cfg` carries numerical note `note`.
fn has_note(cfg: &Desc, note: dn::cudnnBackendNumericalNote_t) -> Result<bool, CudaError> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut n = 0i64;
    // SAFETY: `engine` receives the config's engine (one descriptor).
    check("cudnnBackendGetAttribute", unsafe {
        dn::cudnnBackendGetAttribute(
            cfg.0,
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            1,
            &mut n,
            &engine.0 as *const _ as *mut c_void,
        )
    })?;
    // Read as u32s: a note this binding does not know must not become an invalid enum.
    let mut notes = [u32::MAX; 16];
    // SAFETY: room for 16 notes of 4 bytes (the enum is repr(u32)).
    check("cudnnBackendGetAttribute", unsafe {
        dn::cudnnBackendGetAttribute(
            engine.0,
            A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
            Ty::CUDNN_TYPE_NUMERICAL_NOTE,
            16,
            &mut n,
            notes.as_mut_ptr() as *mut c_void,
        )
    })?;
    Ok(notes[..(n.clamp(0, 16) as usize)].contains(&(note as u32)))
}

/// Build the forward plans of `s` for pointers of the given alignments (x, w, y).
pub(crate) fn build_forward(
    handle: dn::cudnnHandle_t,
    s: &ConvSpec,
    tf32: bool,
    align: [u8; 3],
) -> Result<Plans, CudaError> {
    let dt =
        data_type(s.dtype).ok_or_else(|| CudaError::Invalid(format!("conv2d on {:?}", s.dtype)))?;
    let w_strides = super::dnn::contiguous4(s.w);
    let x = tensor(UID_X, dt, &s.x, &s.x_strides, align[0])?;
    let w = tensor(UID_W, dt, &s.w, &w_strides, align[1])?;
    let y = tensor(UID_Y, dt, &s.y, &s.y_strides, align[2])?;

    let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    // Accumulate in f32 for every input type, as PyTorch does.
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[dn::cudnnDataType_t::CUDNN_DATA_FLOAT],
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        Ty::CUDNN_TYPE_CONVOLUTION_MODE,
        &[dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
    )?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &s.dilation)?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &s.stride)?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &s.padding)?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &s.padding)?;
    let conv = conv.finalize()?;

    let op = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &x)?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &w)?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &y)?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, &conv)?;
    op.set(
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
        Ty::CUDNN_TYPE_FLOAT,
        &[1f32],
    )?;
    op.set(
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
        Ty::CUDNN_TYPE_FLOAT,
        &[0f32],
    )?;
    let op = op.finalize()?;

    let skip_tensor_cores = s.dtype == Dt::F32 && !tf32;
    plans(handle, vec![op], vec![x, w, y, conv], |cfg| {
        skip_tensor_cores
            && has_note(
                cfg,
                dn::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
            )
            .unwrap_or(true)
    })
}

/// The execution plans of the graph of `ops` (best first, at most [`MAX_PLANS`]), from the
/// heuristics' engine configs less those `skip` rejects. The ops, and `keep` (what they
/// were built from), live as long as the plans.
pub(super) fn plans(
    handle: dn::cudnnHandle_t,
    ops: Vec<Desc>,
    mut keep: Vec<Desc>,
    skip: impl Fn(&Desc) -> bool,
) -> Result<Plans, CudaError> {
    let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    let raw_ops: Vec<dn::cudnnBackendDescriptor_t> = ops.iter().map(|o| o.0).collect();
    graph.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_OPS,
        Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
        &raw_ops,
    )?;
    graph.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        Ty::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    let graph = graph.finalize()?;
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &graph)?;
    heur.set(
        A::CUDNN_ATTR_ENGINEHEUR_MODE,
        Ty::CUDNN_TYPE_HEUR_MODE,
        &[dn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
    )?;
    let heur = heur.finalize()?;

    let cfgs = (0..MAX_CONFIGS)
        .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>, _>>()?;
    let raw: Vec<dn::cudnnBackendDescriptor_t> = cfgs.iter().map(|c| c.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds MAX_CONFIGS created engine-config descriptors for cuDNN to fill.
    check("cudnnBackendGetAttribute", unsafe {
        dn::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            MAX_CONFIGS as i64,
            &mut got,
            raw.as_ptr() as *mut c_void,
        )
    })?;

    let mut plans = Vec::new();
    for cfg in cfgs.iter().take(got.clamp(0, MAX_CONFIGS as i64) as usize) {
        if plans.len() == MAX_PLANS {
            break;
        }
        if skip(cfg) {
            continue;
        }
        let Ok(plan) = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) else {
            continue;
        };
        let built = plan
            .set(
                A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                Ty::CUDNN_TYPE_HANDLE,
                &[handle],
            )
            .and_then(|_| plan.set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg))
            .and_then(|_| plan.finalize());
        // Engines the heuristics list may still fail to finalize on this shape: skip them.
        let Ok(plan) = built else { continue };
        let mut ws = 0i64;
        let mut n = 0i64;
        // SAFETY: one int64 out.
        let r = check("cudnnBackendGetAttribute", unsafe {
            dn::cudnnBackendGetAttribute(
                plan.0,
                A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                Ty::CUDNN_TYPE_INT64,
                1,
                &mut n,
                &mut ws as *mut i64 as *mut c_void,
            )
        });
        if r.is_ok() && ws >= 0 {
            plans.push(Plan {
                plan,
                workspace: ws as u64,
            });
        }
    }
    keep.extend(ops);
    keep.extend([graph, heur]);
    keep.extend(cfgs);
    Ok(Plans {
        plans,
        _graph: keep,
    })
}

/// Run `plan` on the given device pointers (y = conv(x, w)).
pub(crate) fn execute(
    handle: dn::cudnnHandle_t,
    plan: &Plan,
    x: u64,
    w: u64,
    y: u64,
    workspace: u64,
) -> Result<(), CudaError> {
    let ptrs = [x, w, y].map(|p| p as *mut c_void);
    // SAFETY: the plan was finalized for tensors of these shapes, strides and alignments;
    // the pointers lie in live allocations of those sizes and the workspace holds at least
    // `plan.workspace` bytes (the caller checked).
    unsafe { execute_pack(handle, plan, &[UID_X, UID_W, UID_Y], &ptrs, workspace) }
}

/// Run `plan` with the tensor of `uids[i]` at `ptrs[i]`.
///
/// # Safety
/// Each pointer holds its tensor as the plan was built for it (device memory of that shape,
/// strides and alignment, or a host scalar for a by-value tensor), and `workspace` at least
/// `plan.workspace` bytes.
pub(super) unsafe fn execute_pack(
    handle: dn::cudnnHandle_t,
    plan: &Plan,
    uids: &[i64],
    ptrs: &[*mut c_void],
    workspace: u64,
) -> Result<(), CudaError> {
    let vp = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    vp.set_i64(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?;
    vp.set(
        A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        Ty::CUDNN_TYPE_VOID_PTR,
        ptrs,
    )?;
    vp.set(
        A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
        Ty::CUDNN_TYPE_VOID_PTR,
        &[workspace as *mut c_void],
    )?;
    let vp = vp.finalize()?;
    // SAFETY: the caller's contract.
    check("cudnnBackendExecute", unsafe {
        dn::cudnnBackendExecute(handle, plan.plan.0, vp.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_16() {
        assert_eq!(alignment(0), 16);
        assert_eq!(alignment(512), 16);
        assert_eq!(alignment(8), 8);
        assert_eq!(alignment(4 + 1024), 4);
        assert_eq!(alignment(2), 2);
        assert_eq!(alignment(3), 1);
    }
}
