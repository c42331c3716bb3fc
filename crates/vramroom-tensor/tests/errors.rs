//! Errors, not panics; an OOM inside an op leaves the runtime usable.

use std::sync::Arc;

use vramroom_tensor::ops::{self, Conv2dParams};
use vramroom_tensor::{CountingAllocator, DType, Device, HostAllocator, Tensor, TensorError};

fn cpu() -> Device {
    Device::cpu(Arc::new(HostAllocator::new(1 << 30)))
}

#[test]
fn shape_mismatches() {
    let d = cpu();
    let a = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[4, 3], DType::F32, &d).unwrap();
    assert!(matches!(a.add(&b), Err(TensorError::ShapeMismatch { .. })));
    assert!(matches!(a.mm(&b), Err(TensorError::ShapeMismatch { .. })));
    assert!(matches!(
        a.view(&[5, -1]),
        Err(TensorError::ShapeMismatch { .. })
    ));
    let x = Tensor::zeros(&[1, 3, 8, 8], DType::F32, &d).unwrap();
    let w = Tensor::zeros(&[4, 2, 3, 3], DType::F32, &d).unwrap();
    assert!(matches!(
        ops::conv2d(&x, &w, None, &Conv2dParams::new(1, 1)),
        Err(TensorError::ShapeMismatch { .. })
    ));
    let w = Tensor::zeros(&[4, 3, 9, 9], DType::F32, &d).unwrap();
    assert!(matches!(
        ops::conv2d(&x, &w, None, &Conv2dParams::new(1, 0)),
        Err(TensorError::ShapeMismatch { .. })
    ));
    let w = Tensor::zeros(&[5, 4], DType::F32, &d).unwrap();
    assert!(matches!(
        ops::linear(&a, &w, None),
        Err(TensorError::ShapeMismatch { .. })
    ));
}

#[test]
fn dtype_and_device_mismatches() {
    let d = cpu();
    let a = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    let i = Tensor::zeros(&[2], DType::I64, &d).unwrap();
    assert!(matches!(a.add(&i), Err(TensorError::DTypeMismatch { .. })));
    assert!(matches!(
        i.relu(),
        Err(TensorError::UnsupportedDType { .. })
    ));
    let logits = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    assert!(matches!(
        ops::cross_entropy(&logits, &a),
        Err(TensorError::DTypeMismatch { .. })
    ));
    let other = cpu();
    let b = Tensor::zeros(&[2], DType::F32, &other).unwrap();
    assert!(matches!(a.add(&b), Err(TensorError::DeviceMismatch { .. })));
    let m = Device::meta(Arc::new(CountingAllocator::new(1 << 20)));
    let c = Tensor::zeros(&[2], DType::F32, &m).unwrap();
    assert!(matches!(a.mul(&c), Err(TensorError::DeviceMismatch { .. })));
    assert!(matches!(
        c.to_vec_f64(),
        Err(TensorError::UnsupportedDevice { .. })
    ));
}

#[test]
fn backward_on_a_tensor_without_grad() {
    let d = cpu();
    let a = Tensor::ones(&[3], DType::F32, &d).unwrap();
    assert_eq!(a.sum().unwrap().backward(), Err(TensorError::NoGrad));
}

#[test]
fn bad_indices_are_errors() {
    let d = cpu();
    let w = Tensor::zeros(&[4, 2], DType::F32, &d).unwrap();
    let idx = Tensor::from_i64(&[1, 7], &[2], &d).unwrap();
    assert!(matches!(
        ops::embedding(&w, &idx),
        Err(TensorError::IndexOutOfRange { .. })
    ));
    let logits = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let t = Tensor::from_i64(&[0, 3], &[2], &d).unwrap();
    assert!(matches!(
        ops::cross_entropy(&logits, &t),
        Err(TensorError::IndexOutOfRange { .. })
    ));
    assert!(w.narrow(0, 3, 2).is_err());
    assert!(w.transpose(0, 5).is_err());
    assert!(w.permute(&[0, 0]).is_err());
}

#[test]
fn oom_inside_an_op_leaves_the_runtime_usable() {
    for d in [
        Device::meta(Arc::new(CountingAllocator::new(64 << 10))),
        Device::cpu(Arc::new(HostAllocator::new(64 << 10))),
    ] {
        let x = Tensor::ones(&[64, 64], DType::F32, &d).unwrap(); // 16 KiB
        x.requires_grad_(true).unwrap();
        let h = x.mul_scalar(2.0).unwrap(); // 16 KiB
        let before = d.memory_allocated();
        // The output (64 KiB) cannot fit.
        let big = Tensor::ones(&[64, 1], DType::F32, &d).unwrap();
        let before2 = d.memory_allocated();
        let err = x
            .reshape(&[64, 64, 1])
            .unwrap()
            .expand(&[64, 64, 4])
            .unwrap()
            .relu()
            .unwrap_err();
        assert!(err.is_oom(), "{err}");
        assert_eq!(d.memory_allocated(), before2);
        drop(big);
        assert_eq!(d.memory_allocated(), before);
        // Still works: a forward and backward that fit.
        h.sum().unwrap().backward().unwrap();
        assert_eq!(x.grad().unwrap().numel(), 64 * 64);
    }
}
