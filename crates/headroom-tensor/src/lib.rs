pub mod autograd;
pub mod backend;
pub mod device;
pub mod dtype;
pub mod error;
pub mod gradcheck;
pub mod layout;
pub mod memory;
pub mod ops;
pub mod storage;
pub mod tensor;

pub use autograd::{enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled};
pub use device::{Device, DeviceKind};
pub use dtype::DType;
pub use error::{Result, TensorError};
pub use memory::{
    category_scope, Allocation, CategoryBreakdown, CountingAllocator, HostAllocator, MemEvent,
    MemoryCategory, RecordingAllocator, StorageAllocator,
};
pub use tensor::Tensor;
