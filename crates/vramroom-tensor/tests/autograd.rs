//! Autograd semantics: accumulation, retain_graph, detach, requires_grad_, grad modes.

use std::sync::Arc;

use vramroom_tensor::ops;
use vramroom_tensor::{
    enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled, DType, Device,
    HostAllocator, Tensor, TensorError,
};

fn cpu() -> Device {
    Device::cpu(Arc::new(HostAllocator::new(1 << 30)))
}

fn param(d: &Device, v: &[f64], shape: &[usize]) -> Tensor {
    let t = Tensor::from_f64(v, shape, DType::F32, d).unwrap();
    t.requires_grad_(true).unwrap();
    t
}

#[test]
fn gradients_accumulate_in_place() {
    let d = cpu();
    let w = param(&d, &[1.0, 2.0, 3.0], &[3]);
    w.mul_scalar(2.0)
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    let g1 = w.grad().unwrap();
    assert_eq!(g1.to_vec_f64().unwrap(), vec![2.0, 2.0, 2.0]);
    let ptr = g1.storage().ptr();
    w.mul_scalar(3.0)
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    let g2 = w.grad().unwrap();
    assert_eq!(g2.to_vec_f64().unwrap(), vec![5.0, 5.0, 5.0]);
    assert_eq!(g2.storage().ptr(), ptr, "accumulation must be in place");
    w.zero_grad(false).unwrap();
    assert_eq!(w.grad().unwrap().to_vec_f64().unwrap(), vec![0.0; 3]);
    w.zero_grad(true).unwrap();
    assert!(w.grad().is_none());
}

#[test]
fn shared_input_gradients_sum() {
    let d = cpu();
    let x = param(&d, &[1.0, -2.0], &[2]);
    // y = x*x + x  => dy/dx = 2x + 1
    let y = x.mul(&x).unwrap().add(&x).unwrap().sum().unwrap();
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_f64().unwrap(), vec![3.0, -3.0]);
}

#[test]
fn retain_graph_and_second_backward() {
    let d = cpu();
    let w = param(&d, &[1.0, 2.0], &[2]);
    let y = w.mul(&w).unwrap().sum().unwrap();
    y.backward_with(None, true).unwrap();
    y.backward_with(None, false).unwrap();
    assert_eq!(w.grad().unwrap().to_vec_f64().unwrap(), vec![4.0, 8.0]);
    let err = y.backward().unwrap_err();
    assert!(
        matches!(err, TensorError::Autograd(ref m) if m.contains("second time")),
        "{err}"
    );
}

#[test]
fn detach_stops_gradients() {
    let d = cpu();
    let w = param(&d, &[1.0, 2.0], &[2]);
    let h = w.mul_scalar(3.0).unwrap();
    let hd = h.detach();
    assert!(!hd.requires_grad());
    assert!(hd.shares_storage(&h));
    let y = hd.mul(&w).unwrap().sum().unwrap();
    y.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec_f64().unwrap(), vec![3.0, 6.0]);
}

#[test]
fn requires_grad_rules() {
    let d = cpu();
    let w = param(&d, &[1.0], &[1]);
    let y = w.mul_scalar(2.0).unwrap();
    assert!(!y.is_leaf());
    assert_eq!(y.grad_fn_name(), Some("MulBackward1"));
    assert!(y.requires_grad_(false).is_err());
    let i = Tensor::from_i64(&[1], &[1], &d).unwrap();
    assert!(i.requires_grad_(true).is_err());
    w.requires_grad_(false).unwrap();
    assert!(!w.requires_grad());
}

#[test]
fn grad_modes_nest_and_are_thread_local() {
    let d = cpu();
    let w = param(&d, &[1.0], &[1]);
    assert!(is_grad_enabled());
    {
        let _a = no_grad();
        assert!(!w.mul_scalar(2.0).unwrap().requires_grad());
        {
            let _b = enable_grad();
            assert!(w.mul_scalar(2.0).unwrap().requires_grad());
            {
                let _c = set_grad_enabled(false);
                assert!(!is_grad_enabled());
            }
            assert!(is_grad_enabled());
        }
        assert!(!is_grad_enabled());
        std::thread::spawn(|| assert!(is_grad_enabled()))
            .join()
            .unwrap();
    }
    assert!(is_grad_enabled());
    {
        let _i = inference_mode();
        assert!(!w.mul_scalar(2.0).unwrap().requires_grad());
    }
    assert!(w.mul_scalar(2.0).unwrap().requires_grad());
}

#[test]
fn backward_without_grad_is_an_error() {
    let d = cpu();
    let x = Tensor::ones(&[2], DType::F32, &d).unwrap();
    assert_eq!(
        x.sum().unwrap().backward().unwrap_err(),
        TensorError::NoGrad
    );
    let w = param(&d, &[1.0, 2.0], &[2]);
    let y = w.mul_scalar(2.0).unwrap();
    assert!(
        matches!(y.backward().unwrap_err(), TensorError::Autograd(_)),
        "non-scalar"
    );
}

#[test]
fn modifying_a_saved_tensor_is_detected() {
    let d = cpu();
    let w = param(&d, &[1.0, -2.0], &[2]);
    let h = w.mul_scalar(1.0).unwrap();
    let y = h.relu().unwrap(); // saves its output
    y.mul_scalar_(2.0).unwrap(); // in place, not recorded (no autograd) but bumps version
    let err = y.sum().unwrap().backward().unwrap_err();
    assert!(matches!(err, TensorError::ModifiedInPlace { .. }), "{err}");
}

#[test]
fn inplace_on_leaf_requires_no_grad() {
    let d = cpu();
    let w = param(&d, &[1.0, 2.0], &[2]);
    assert!(w.mul_scalar_(2.0).is_err());
    {
        let _g = no_grad();
        w.mul_scalar_(2.0).unwrap();
    }
    assert_eq!(w.to_vec_f64().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn inplace_relu_rebases_history() {
    let d = cpu();
    let w = param(&d, &[1.0, -2.0, 3.0], &[3]);
    let h = w.mul_scalar(2.0).unwrap();
    h.relu_().unwrap();
    assert_eq!(h.grad_fn_name(), Some("ReluBackward0"));
    h.sum().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec_f64().unwrap(), vec![2.0, 0.0, 2.0]);
}

#[test]
fn forward_values_match_reference() {
    let d = cpu();
    // 2x2 conv, checked by hand.
    let x = Tensor::from_f64(
        &[1., 2., 3., 4., 5., 6., 7., 8., 9.],
        &[1, 1, 3, 3],
        DType::F32,
        &d,
    )
    .unwrap();
    let w = Tensor::from_f64(&[1., 0., 0., -1.], &[1, 1, 2, 2], DType::F32, &d).unwrap();
    let y = ops::conv2d(&x, &w, None, &ops::Conv2dParams::new(1, 0)).unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), vec![-4.0, -4.0, -4.0, -4.0]);
    let l = Tensor::from_f64(&[1.0, 2.0, 3.0], &[1, 3], DType::F32, &d).unwrap();
    let t = Tensor::from_i64(&[2], &[1], &d).unwrap();
    let ce = ops::cross_entropy(&l, &t).unwrap().item().unwrap();
    let expect = -(3.0f64 - (1f64.exp() + 2f64.exp() + 3f64.exp()).ln());
    assert!((ce - expect).abs() < 1e-5);
    let a = Tensor::from_f64(&[1., 2., 3., 4., 5., 6.], &[2, 3], DType::F32, &d).unwrap();
    let b = Tensor::from_f64(&[1., 0., 0., 1., 1., 1.], &[3, 2], DType::F32, &d).unwrap();
    assert_eq!(
        a.mm(&b).unwrap().to_vec_f64().unwrap(),
        vec![4., 5., 10., 11.]
    );
    let bf = a.to_dtype(DType::BF16).unwrap();
    assert_eq!(bf.nbytes(), 12);
    assert_eq!(
        bf.mm(&b.to_dtype(DType::BF16).unwrap())
            .unwrap()
            .to_vec_f64()
            .unwrap(),
        vec![4., 5., 10., 11.]
    );
}

#[test]
fn batch_norm_updates_running_stats() {
    let d = cpu();
    let x = Tensor::from_f64(&[1., 3., 5., 7.], &[4, 1], DType::F32, &d).unwrap();
    let rm = Tensor::zeros(&[1], DType::F32, &d).unwrap();
    let rv = Tensor::ones(&[1], DType::F32, &d).unwrap();
    let y = ops::batch_norm(&x, Some(&rm), Some(&rv), None, None, true, 0.1, 0.0).unwrap();
    let m = rm.to_vec_f64().unwrap()[0];
    let v = rv.to_vec_f64().unwrap()[0];
    assert!((m - 0.4).abs() < 1e-6);
    // unbiased var of [1,3,5,7] = 20/3
    assert!((v - (0.9 + 0.1 * 20.0 / 3.0)).abs() < 1e-5);
    let yv = y.to_vec_f64().unwrap();
    assert!((yv[0] + 1.341_640_8).abs() < 1e-5);
}

/// `batch_norm_relu` is `batch_norm` then `relu_`: the same values in eval and training,
/// the same gradients, and under no_grad (where backends may fuse it) the same values.
#[test]
fn batch_norm_relu_equals_the_two_ops() {
    let d = cpu();
    let xs: Vec<f64> = (0..24).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
    for training in [false, true] {
        for grad in [true, false] {
            let run = |fused: bool| {
                let _g = (!grad).then(no_grad);
                let x = param(&d, &xs, &[2, 3, 2, 2]);
                let w = param(&d, &[1.5, -0.5, 2.0], &[3]);
                let b = param(&d, &[0.1, 0.2, -0.3], &[3]);
                let rm = Tensor::from_f64(&[0.5, -1.0, 0.0], &[3], DType::F32, &d).unwrap();
                let rv = Tensor::from_f64(&[2.0, 0.5, 1.0], &[3], DType::F32, &d).unwrap();
                let args = (Some(&rm), Some(&rv), Some(&w), Some(&b));
                let y = if fused {
                    ops::batch_norm_relu(&x, args.0, args.1, args.2, args.3, training, 0.1, 1e-5)
                        .unwrap()
                } else {
                    let y =
                        ops::batch_norm(&x, args.0, args.1, args.2, args.3, training, 0.1, 1e-5)
                            .unwrap();
                    y.relu_().unwrap();
                    y
                };
                let vals = y.to_vec_f64().unwrap();
                let mut grads = Vec::new();
                if grad {
                    y.mul(&y).unwrap().sum().unwrap().backward().unwrap();
                    for t in [&x, &w, &b] {
                        grads.push(t.grad().unwrap().to_vec_f64().unwrap());
                    }
                }
                (
                    vals,
                    grads,
                    rm.to_vec_f64().unwrap(),
                    rv.to_vec_f64().unwrap(),
                )
            };
            let (a, b) = (run(true), run(false));
            assert_eq!(a, b, "training={training} grad={grad}");
            assert!(a.0.iter().all(|v| *v >= 0.0) && a.0.iter().any(|v| *v > 0.0));
        }
    }
}

#[test]
fn tensors_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tensor>();
    check::<Device>();
    let d = cpu();
    let w = param(&d, &[1.0, 2.0], &[2]);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let w = w.clone();
            std::thread::spawn(move || {
                let _g = no_grad();
                w.mul_scalar(2.0).unwrap().sum().unwrap().item().unwrap()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 6.0);
    }
}
