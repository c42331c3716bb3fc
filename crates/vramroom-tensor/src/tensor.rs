//! The `Tensor` handle: storage + layout + dtype + autograd metadata.
//!
//! Design note: `Tensor` is a cheap `Arc` handle like a Python reference to a
//! `torch.Tensor`: cloning it shares everything, including the `.grad` cell and in-place
//! changes to its `grad_fn`. Views make a new handle over the same `Storage`. Memory is
//! released when the last handle, view, saved copy or gradient referring to the storage
//! drops. Mutating methods take `&self` (the data lives on the device; Rust's borrow rules
//! cannot see it anyway), and as in PyTorch, two threads writing one tensor is a race.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::autograd::{self, edge_name, Edge, LeafGrad};
use crate::backend::TRef;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::{checked_numel, numel, Layout};
use crate::memory::MemoryCategory;
use crate::storage::Storage;

pub(crate) struct TensorImpl {
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
    edge: Mutex<Option<Edge>>,
}

#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorImpl>);

/// The bytes of a contiguous `shape` of `dtype`, checked: a shape whose bytes pass the
/// 64-bit address space is an out-of-memory answer saying what it needs, never a wrapped
/// (small) allocation.
fn alloc_bytes(shape: &[usize], dtype: DType) -> Result<u64> {
    checked_numel(shape)
        .and_then(|n| (n as u64).checked_mul(dtype.size() as u64))
        .ok_or_else(|| {
            let need = shape
                .iter()
                .fold(dtype.size() as u128, |a, &d| a.saturating_mul(d as u128));
            TensorError::oom(format!(
                "a tensor of shape {shape:?} ({dtype}) needs {}, more than a 64-bit address \
                 space holds",
                crate::models::hf::footprint::human_bytes_u128(need)
            ))
        })
}

impl Tensor {
    // ---- construction -----------------------------------------------------------------

    pub(crate) fn from_parts(storage: Arc<Storage>, layout: Layout, dtype: DType) -> Tensor {
        Tensor(Arc::new(TensorImpl {
            storage,
            layout,
            dtype,
            edge: Mutex::new(None),
        }))
    }

    /// Uninitialised (zeroed on the host allocators) contiguous tensor: one allocation of
    /// `numel * dtype.size()` bytes, none for an empty tensor.
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let bytes = alloc_bytes(shape, dtype)?;
        let storage = Storage::new(device, bytes)?;
        Ok(Tensor::from_parts(
            storage,
            Layout::contiguous(shape),
            dtype,
        ))
    }
    /// A fresh tensor with a dense `layout` (any dim order, offset 0): one allocation of
    /// `numel * dtype.size()` bytes. Elementwise ops allocate their outputs this way, in the
    /// memory order PyTorch's TensorIterator picks ([`Layout::iter_output`]).
    pub(crate) fn empty_dense(layout: Layout, dtype: DType, device: &Device) -> Result<Tensor> {
        debug_assert!(layout.offset == 0 && layout.is_non_overlapping_and_dense());
        let bytes = alloc_bytes(&layout.shape, dtype)?;
        let storage = Storage::new(device, bytes)?;
        Ok(Tensor::from_parts(storage, layout, dtype))
    }
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let t = Tensor::empty(shape, dtype, device)?;
        device.backend().fill(t.kref(), value)?;
        Ok(t)
    }
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }
    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }
    /// From host values, converted to `dtype`.
    pub fn from_f64(
        data: &[f64],
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if data.len() != numel(shape) {
            return Err(TensorError::shape(
                "from_f64",
                format!("{} values for shape {shape:?}", data.len()),
            ));
        }
        let t = Tensor::empty(shape, dtype, device)?;
        device.backend().write_f64(t.kref(), data)?;
        Ok(t)
    }
    pub fn from_f32(data: &[f32], shape: &[usize], device: &Device) -> Result<Tensor> {
        let v: Vec<f64> = data.iter().map(|x| *x as f64).collect();
        Tensor::from_f64(&v, shape, DType::F32, device)
    }
    pub fn from_i64(data: &[i64], shape: &[usize], device: &Device) -> Result<Tensor> {
        let v: Vec<f64> = data.iter().map(|x| *x as f64).collect();
        Tensor::from_f64(&v, shape, DType::I64, device)
    }
    pub fn scalar(v: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(&[], v, dtype, device)
    }
    /// `torch.arange(n)`.
    pub fn arange(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let t = Tensor::empty(&[n], dtype, device)?;
        device.backend().arange(t.kref(), 0.0, 1.0)?;
        Ok(t)
    }
    /// Uniform in [low, high), from the device's generator.
    pub fn rand(
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let t = Tensor::empty(shape, dtype, device)?;
        device
            .backend()
            .uniform(t.kref(), low, high, device.next_seed())?;
        Ok(t)
    }
    pub fn randn(
        shape: &[usize],
        mean: f64,
        std: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let t = Tensor::empty(shape, dtype, device)?;
        device
            .backend()
            .normal(t.kref(), mean, std, device.next_seed())?;
        Ok(t)
    }
    /// In-place re-initialisation (no allocation): `nn.init.uniform_`.
    pub fn uniform_(&self, low: f64, high: f64) -> Result<()> {
        self.check_inplace("uniform_")?;
        let d = self.device();
        d.backend().uniform(self.kref(), low, high, d.next_seed())?;
        self.storage().bump_version();
        Ok(())
    }
    pub fn normal_(&self, mean: f64, std: f64) -> Result<()> {
        self.check_inplace("normal_")?;
        let d = self.device();
        d.backend().normal(self.kref(), mean, std, d.next_seed())?;
        self.storage().bump_version();
        Ok(())
    }
    pub fn fill_(&self, v: f64) -> Result<()> {
        self.check_inplace("fill_")?;
        self.device().backend().fill(self.kref(), v)?;
        self.storage().bump_version();
        Ok(())
    }
    /// Overwrites the data from host values (weight loading, tests). Bypasses autograd and
    /// the leaf check, like assigning `param.data`; bumps the version.
    pub fn copy_from_f64(&self, data: &[f64]) -> Result<()> {
        if data.len() != self.numel() {
            return Err(TensorError::shape(
                "copy_from_f64",
                format!("{} values for shape {:?}", data.len(), self.shape()),
            ));
        }
        self.device().backend().write_f64(self.kref(), data)?;
        self.storage().bump_version();
        Ok(())
    }
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0.0)
    }

    // ---- accessors ----------------------------------------------------------------

    pub fn shape(&self) -> &[usize] {
        &self.0.layout.shape
    }
    pub fn dims(&self) -> &[usize] {
        self.shape()
    }
    pub fn size(&self, dim: isize) -> Result<usize> {
        let d = crate::layout::norm_dim(dim, self.ndim(), "size")?;
        Ok(self.shape()[d])
    }
    pub fn strides(&self) -> &[usize] {
        &self.0.layout.strides
    }
    pub fn offset(&self) -> usize {
        self.0.layout.offset
    }
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    pub fn ndim(&self) -> usize {
        self.0.layout.ndim()
    }
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    pub fn device(&self) -> &Device {
        self.0.storage.device()
    }
    pub fn storage(&self) -> &Arc<Storage> {
        &self.0.storage
    }
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }
    /// Bytes of this view's elements (not of the whole storage).
    pub fn nbytes(&self) -> u64 {
        (self.numel() * self.dtype().size()) as u64
    }
    pub fn category(&self) -> MemoryCategory {
        self.storage().category()
    }
    /// Re-tags the whole storage (e.g. parameters after construction, optimizer state).
    pub fn set_category(&self, c: MemoryCategory) {
        self.storage().set_category(c)
    }
    /// True when two handles share a storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }
    pub(crate) fn kref(&self) -> TRef<'_> {
        self.kref_as(&self.0.layout)
    }
    /// This tensor's storage seen through another layout of it: a broadcast, or a view
    /// folded for a kernel.
    pub(crate) fn kref_as<'a>(&self, layout: &'a Layout) -> TRef<'a> {
        TRef {
            ptr: self.0.storage.ptr(),
            layout,
            dtype: self.0.dtype,
        }
    }
    /// Only this handle refers to the memory: safe to update in place unseen.
    pub(crate) fn is_exclusive(&self) -> bool {
        Arc::strong_count(&self.0) == 1 && Arc::strong_count(&self.0.storage) == 1
    }

    /// Data as f64, in logical order. Errors on the meta device.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        self.device().backend().read_f64(self.kref())
    }
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        Ok(self.to_vec_f64()?.into_iter().map(|x| x as f32).collect())
    }
    pub fn to_vec_i64(&self) -> Result<Vec<i64>> {
        Ok(self.to_vec_f64()?.into_iter().map(|x| x as i64).collect())
    }
    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(TensorError::invalid(
                "item",
                format!("a tensor with {} elements", self.numel()),
            ));
        }
        Ok(self.to_vec_f64()?[0])
    }

    // ---- autograd -------------------------------------------------------------------

    pub(crate) fn edge(&self) -> Option<Edge> {
        self.0.edge.lock().clone()
    }
    pub(crate) fn set_edge(&self, e: Option<Edge>) {
        *self.0.edge.lock() = e;
    }
    pub fn requires_grad(&self) -> bool {
        self.0.edge.lock().is_some()
    }
    /// A leaf is a tensor no recorded op produced.
    pub fn is_leaf(&self) -> bool {
        !matches!(*self.0.edge.lock(), Some(Edge::Node(..)))
    }
    /// Name of the backward node, e.g. `"ConvolutionBackward0"`.
    pub fn grad_fn_name(&self) -> Option<&'static str> {
        match &*self.0.edge.lock() {
            Some(e @ Edge::Node(..)) => Some(edge_name(e)),
            _ => None,
        }
    }
    /// `requires_grad_()`: only leaves can change it.
    pub fn requires_grad_(&self, requires: bool) -> Result<&Tensor> {
        let mut e = self.0.edge.lock();
        match (&*e, requires) {
            (Some(Edge::Node(..)), false) => {
                return Err(TensorError::Autograd(
                    "you can only change requires_grad flags of leaf variables. If you want to use a computed variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach().".into(),
                ))
            }
            (Some(Edge::Node(..)), true) | (Some(Edge::Leaf(_)), true) => {}
            (None, true) => {
                if !self.dtype().is_float() {
                    return Err(TensorError::Autograd(
                        "only tensors of floating point dtype can require gradients".into(),
                    ));
                }
                *e = Some(Edge::Leaf(Arc::new(LeafGrad::default())));
            }
            (_, false) => *e = None,
        }
        Ok(self)
    }
    /// The accumulated gradient of a leaf.
    pub fn grad(&self) -> Option<Tensor> {
        match &*self.0.edge.lock() {
            Some(Edge::Leaf(l)) => l.grad.lock().clone(),
            _ => None,
        }
    }
    /// Replaces `.grad` (None: `zero_grad(set_to_none=True)`).
    pub fn set_grad(&self, g: Option<Tensor>) -> Result<()> {
        match &*self.0.edge.lock() {
            Some(Edge::Leaf(l)) => {
                if let Some(g) = &g {
                    if g.shape() != self.shape() {
                        return Err(TensorError::shape(
                            "set_grad",
                            format!("grad {:?} for tensor {:?}", g.shape(), self.shape()),
                        ));
                    }
                    g.set_category(MemoryCategory::Gradient);
                }
                *l.grad.lock() = g;
                Ok(())
            }
            _ => Err(TensorError::Autograd(
                "only leaf tensors that require grad have .grad".into(),
            )),
        }
    }
    /// `zero_grad(set_to_none)`: drop the gradient, or zero it in place.
    pub fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        if set_to_none {
            if self.grad().is_some() {
                self.set_grad(None)?;
            }
            Ok(())
        } else {
            match self.grad() {
                Some(g) => {
                    let _ng = autograd::no_grad();
                    g.zero_()
                }
                None => Ok(()),
            }
        }
    }
    /// Same data, no history.
    pub fn detach(&self) -> Tensor {
        Tensor::from_parts(self.0.storage.clone(), self.0.layout.clone(), self.0.dtype)
    }
    /// `loss.backward()`.
    pub fn backward(&self) -> Result<()> {
        autograd::run_backward(self, None, false)
    }
    /// `t.backward(gradient, retain_graph=...)`.
    pub fn backward_with(&self, grad: Option<Tensor>, retain_graph: bool) -> Result<()> {
        autograd::run_backward(self, grad, retain_graph)
    }

    /// Errors like PyTorch when an in-place op would hit a leaf that requires grad.
    pub(crate) fn check_inplace(&self, op: &'static str) -> Result<()> {
        if autograd::is_grad_enabled() && matches!(*self.0.edge.lock(), Some(Edge::Leaf(_))) {
            return Err(TensorError::Autograd(format!(
                "{op}: a leaf Variable that requires grad is being used in an in-place operation."
            )));
        }
        Ok(())
    }

    /// A new contiguous tensor with the same data (no autograd).
    pub(crate) fn deep_copy(&self) -> Result<Tensor> {
        let out = Tensor::empty(self.shape(), self.dtype(), self.device())?;
        self.device().backend().copy(self.kref(), out.kref())?;
        Ok(out)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor(shape={:?}, dtype={}, device={}",
            self.shape(),
            self.dtype(),
            self.device()
        )?;
        if let Some(n) = self.grad_fn_name() {
            write!(f, ", grad_fn={n}")?;
        } else if self.requires_grad() {
            write!(f, ", requires_grad=True")?;
        }
        write!(f, ")")
    }
}
