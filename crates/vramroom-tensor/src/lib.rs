//! # vramroom-tensor
//!
//! The tensor runtime of Vramroom: tensors whose storage comes from a device's allocator
//! (vramroom-alloc's `CachingAllocator`, i.e. PyTorch's policy), an autograd that keeps and
//! frees exactly what PyTorch keeps and frees, grad modes, and two backends behind one trait:
//! `cpu` (real kernels) and `meta` (no data, same allocations). The point is memory fidelity:
//! on the meta device a model's allocation sequence — sizes, order, frees — is PyTorch's on
//! CUDA, so `memory_allocated()` at every moment is PyTorch's figure.
//!
//! Main types:
//! - [`Device`]: an allocator + a [`backend::Backend`] + category bookkeeping.
//!   [`Device::meta_caching`] / [`Device::cpu_caching`] build one on vramroom-alloc;
//!   [`Device::meta`] / [`Device::cpu`] take any [`StorageAllocator`] (e.g.
//!   [`CountingAllocator`], [`HostAllocator`], [`RecordingAllocator`] to log the sequence).
//!   Library workspaces (cuDNN, cuBLAS) come from a [`device::WorkspacePolicy`]:
//!   [`Device::meta_caching`] uses [`CudaLikeWorkspace`] (what PyTorch 2.11 allocated on an
//!   H200, read out of the real traces), the other constructors allocate none.
//! - [`Tensor`]: an `Arc` handle (shape, strides, offset, [`DType`], storage, autograd
//!   edge). Views share storage; the last handle to drop frees the block.
//! - Ops: methods on `Tensor` (`add`, `mul`, `matmul`, `relu`, `relu_`, `softmax`, `sum`,
//!   `reshape`, `transpose`, `narrow`, `cat`, ...) and functions in [`ops`] (`conv2d`,
//!   `linear`, `batch_norm`, `layer_norm`, `max_pool2d`, `adaptive_avg_pool2d`,
//!   `embedding`, `dropout`, `cross_entropy`). Each saves what PyTorch's backward node saves.
//! - Autograd: [`Tensor::backward`], [`Tensor::backward_with`] (`retain_graph`),
//!   [`Tensor::grad`], [`Tensor::detach`], [`Tensor::requires_grad_`]; grad modes
//!   [`no_grad`], [`inference_mode`], [`enable_grad`], [`set_grad_enabled`] are thread-local
//!   RAII guards. [`gradcheck`] checks gradients by finite differences.
//! - Memory categories: every storage is tagged [`MemoryCategory`] (parameter, gradient,
//!   optimizer_state, activation, temporary, input); [`Device::memory_by_category`] and
//!   [`Device::peak_memory_by_category`] give the breakdown now and at the peak. Tag what you
//!   create with [`category_scope`] or [`Tensor::set_category`]; ops tag their outputs
//!   `temporary`, saving for backward re-tags `activation`, `.grad` is `gradient`.
//! - Errors: every failure is a [`TensorError`] (shape, dtype, device, no grad, OOM, ...).
//!
//! ```
//! use vramroom_alloc::AllocatorConfig;
//! use vramroom_tensor::{ops, no_grad, DType, Device, MemoryCategory, Tensor, category_scope};
//!
//! let dev = Device::meta_caching(80 << 30, AllocatorConfig::default());
//! let w = {
//!     let _p = category_scope(MemoryCategory::Parameter);
//!     let w = Tensor::empty(&[4096, 4096], DType::F32, &dev)?;
//!     w.requires_grad_(true)?;
//!     w
//! };
//! let x = Tensor::empty(&[2048, 4096], DType::F32, &dev)?;
//! let base = dev.memory_allocated();
//! {
//!     let _g = no_grad();
//!     let y = ops::linear(&x, &w, None)?.relu()?; // the linear output dies inside relu
//!     // The 32 MiB output, plus what a process's first matmul takes on a (simulated) GPU:
//!     // the cuBLAS handle workspace (32 MiB), held from now on. A linear with a bias goes
//!     // through cuBLASLt, whose 1 MiB workspace comes at its first call.
//!     assert_eq!(dev.library_workspace_bytes(), 32 << 20);
//!     assert_eq!(dev.memory_allocated() - base, (32 << 20) + (32 << 20));
//! }
//! let y = ops::linear(&x, &w, None)?.relu()?;
//! let loss = y.sum()?;
//! loss.backward()?;
//! assert!(w.grad().is_some());
//! drop((y, loss));
//! assert_eq!(dev.memory_by_category().get(MemoryCategory::Gradient), 64 << 20);
//! # Ok::<(), vramroom_tensor::TensorError>(())
//! ```
//!
//! Limits: in-place ops on a *view* do not rewrite the base tensor's history (PyTorch's
//! view+inplace rebase); two threads writing one tensor is a data race, as in PyTorch.

pub mod autograd;
pub mod backend;
pub mod bench;
pub mod caching;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod gradcheck;
pub mod layout;
pub mod memory;
pub mod models;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod predict;
pub mod safetensors;
pub mod storage;
pub mod tensor;
pub mod vocab;
pub mod workspace;

pub use autograd::{enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled};
pub use cuda::{CudaAllocator, CudaRuntime, TensorGraph};
pub use device::{Device, DeviceKind};
pub use dtype::DType;
pub use error::{Result, TensorError};
pub use memory::{
    category_scope, Allocation, CategoryBreakdown, CountingAllocator, HostAllocator, MemEvent,
    MemoryCategory, RecordingAllocator, StorageAllocator,
};
pub use nn::Module;
pub use optim::{Adam, Optimizer, Sgd};
pub use predict::{predict, PredictOptions, Prediction};
pub use tensor::Tensor;
pub use workspace::CudaLikeWorkspace;
