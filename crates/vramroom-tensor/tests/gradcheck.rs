//! Finite-difference checks of every differentiable op (f32 ops, f64 accumulation).

use std::sync::Arc;

use vramroom_tensor::gradcheck::{gradcheck, GradcheckOptions};
use vramroom_tensor::ops::{self, Conv2dParams, Pool2dParams};
use vramroom_tensor::{DType, Device, HostAllocator, Result, Tensor};

fn cpu() -> Device {
    Device::cpu(Arc::new(HostAllocator::new(1 << 30)))
}

/// Values in ±[0.1, 1.1), spread so that ties and kinks stay farther than eps away.
fn data(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let u = ((i as f64 + 1.0) * 0.754_877_666 + seed as f64 * 0.569_840_29).fract();
            let mag = 0.1 + (((i * 7 + seed as usize * 3) % 97) as f64) / 97.0;
            if u < 0.5 {
                -mag
            } else {
                mag
            }
        })
        .collect()
}

fn leaf(d: &Device, shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    let t = Tensor::from_f64(&data(n, seed), shape, DType::F32, d).unwrap();
    t.requires_grad_(true).unwrap();
    t
}

fn positive(d: &Device, shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f64> = data(n, seed).iter().map(|x| x.abs() + 0.5).collect();
    let t = Tensor::from_f64(&v, shape, DType::F32, d).unwrap();
    t.requires_grad_(true).unwrap();
    t
}

fn check<F: Fn(&[Tensor]) -> Result<Tensor>>(f: F, inputs: &[Tensor]) {
    gradcheck(f, inputs, GradcheckOptions::default()).unwrap();
}

#[test]
fn add_sub_broadcast() {
    let d = cpu();
    let a = leaf(&d, &[2, 3, 4], 1);
    let b = leaf(&d, &[3, 1], 2);
    check(|t| t[0].add(&t[1]), &[a.clone(), b.clone()]);
    check(|t| t[0].sub(&t[1]), &[a.clone(), b.clone()]);
    check(|t| t[1].add_scaled(&t[0], 0.5), &[a, b]);
}

#[test]
fn mul_div_broadcast() {
    let d = cpu();
    let a = leaf(&d, &[2, 3, 4], 3);
    let b = positive(&d, &[4], 4);
    check(|t| t[0].mul(&t[1]), &[a.clone(), b.clone()]);
    check(|t| t[0].div(&t[1]), &[a, b]);
}

#[test]
fn scalar_ops() {
    let d = cpu();
    let a = leaf(&d, &[3, 4], 5);
    check(|t| t[0].mul_scalar(-1.5), std::slice::from_ref(&a));
    check(|t| t[0].add_scalar(2.0), std::slice::from_ref(&a));
    check(|t| t[0].div_scalar(4.0), std::slice::from_ref(&a));
    check(|t| t[0].neg(), std::slice::from_ref(&a));
    check(|t| t[0].pow_scalar(3.0), &[a]);
}

#[test]
fn unary_activations() {
    let d = cpu();
    let a = leaf(&d, &[3, 5], 6);
    check(|t| t[0].relu(), std::slice::from_ref(&a));
    check(|t| t[0].gelu(false), std::slice::from_ref(&a));
    check(|t| t[0].gelu(true), std::slice::from_ref(&a));
    check(|t| t[0].tanh(), std::slice::from_ref(&a));
    check(|t| t[0].sigmoid(), std::slice::from_ref(&a));
    check(|t| t[0].exp(), &[a]);
    let p = positive(&d, &[3, 5], 7);
    check(|t| t[0].log(), std::slice::from_ref(&p));
    check(|t| t[0].sqrt(), &[p]);
}

#[test]
fn inplace_relu_and_add() {
    let d = cpu();
    let a = leaf(&d, &[2, 6], 8);
    let b = leaf(&d, &[6], 9);
    check(
        |t| {
            let y = t[0].mul_scalar(2.0)?;
            y.add_(&t[1])?;
            y.relu_()?;
            Ok(y)
        },
        &[a, b],
    );
}

#[test]
fn reductions() {
    let d = cpu();
    let a = leaf(&d, &[2, 3, 4], 10);
    check(|t| t[0].sum(), std::slice::from_ref(&a));
    check(|t| t[0].mean(), std::slice::from_ref(&a));
    check(|t| t[0].sum_dims(&[0, 2], false), std::slice::from_ref(&a));
    check(|t| t[0].sum_dim(1, true), std::slice::from_ref(&a));
    check(|t| t[0].mean_dim(-1, false), std::slice::from_ref(&a));
    check(|t| t[0].mean_dims(&[0, 1], true), &[a]);
}

#[test]
fn softmax_and_log_softmax() {
    let d = cpu();
    let a = leaf(&d, &[2, 3, 5], 11);
    check(|t| t[0].softmax(-1), std::slice::from_ref(&a));
    check(|t| t[0].softmax(1), std::slice::from_ref(&a));
    check(|t| t[0].log_softmax(-1), std::slice::from_ref(&a));
    check(|t| t[0].transpose(0, 2)?.log_softmax(0), &[a]);
}

#[test]
fn matmuls() {
    let d = cpu();
    let a = leaf(&d, &[3, 4], 12);
    let b = leaf(&d, &[4, 5], 13);
    check(|t| t[0].mm(&t[1]), &[a.clone(), b.clone()]);
    // Transposed (column-major) operands on both sides.
    let c = leaf(&d, &[2, 4], 44);
    check(|t| t[0].t()?.mm(&t[1].t()?), &[b.clone(), c]);
    let x = leaf(&d, &[2, 3, 4], 14);
    let y = leaf(&d, &[2, 4, 2], 15);
    check(|t| t[0].bmm(&t[1]), &[x.clone(), y.clone()]);
    let z = leaf(&d, &[4, 2], 16);
    check(|t| t[0].matmul(&t[1]), &[x.clone(), z]);
    let w = leaf(&d, &[1, 4, 3], 17);
    check(|t| t[0].matmul(&t[1]), &[x, w]);
    let v = leaf(&d, &[4], 18);
    check(|t| t[0].matmul(&t[1]), &[a, v]);
}

#[test]
fn linear_with_and_without_bias() {
    let d = cpu();
    let x = leaf(&d, &[3, 4], 19);
    let w = leaf(&d, &[5, 4], 20);
    let b = leaf(&d, &[5], 21);
    check(
        |t| ops::linear(&t[0], &t[1], Some(&t[2])),
        &[x, w.clone(), b.clone()],
    );
    let x3 = leaf(&d, &[2, 3, 4], 22);
    check(
        |t| ops::linear(&t[0], &t[1], Some(&t[2])),
        &[x3.clone(), w.clone(), b],
    );
    check(|t| ops::linear(&t[0], &t[1], None), &[x3, w]);
}

#[test]
fn conv2d_variants() {
    let d = cpu();
    let x = leaf(&d, &[2, 4, 6, 5], 23);
    let w = leaf(&d, &[6, 4, 3, 3], 24);
    let b = leaf(&d, &[6], 25);
    let p = Conv2dParams::new(1, 1);
    check(
        |t| ops::conv2d(&t[0], &t[1], Some(&t[2]), &p),
        &[x.clone(), w.clone(), b],
    );
    let p = Conv2dParams {
        stride: [2, 1],
        padding: [0, 2],
        dilation: [1, 2],
        groups: 1,
    };
    check(|t| ops::conv2d(&t[0], &t[1], None, &p), &[x.clone(), w]);
    let wg = leaf(&d, &[6, 2, 1, 2], 26);
    let p = Conv2dParams {
        stride: [1, 2],
        padding: [1, 0],
        dilation: [1, 1],
        groups: 2,
    };
    check(|t| ops::conv2d(&t[0], &t[1], None, &p), &[x, wg]);
}

#[test]
fn batch_norm_train_and_eval() {
    let d = cpu();
    let x = leaf(&d, &[3, 2, 2, 3], 27);
    let w = positive(&d, &[2], 28);
    let b = leaf(&d, &[2], 29);
    check(
        |t| ops::batch_norm(&t[0], None, None, Some(&t[1]), Some(&t[2]), true, 0.1, 1e-5),
        &[x.clone(), w.clone(), b.clone()],
    );
    let rm = Tensor::from_f64(&[0.1, -0.2], &[2], DType::F32, &d).unwrap();
    let rv = Tensor::from_f64(&[0.5, 2.0], &[2], DType::F32, &d).unwrap();
    check(
        |t| {
            ops::batch_norm(
                &t[0],
                Some(&rm),
                Some(&rv),
                Some(&t[1]),
                Some(&t[2]),
                false,
                0.1,
                1e-5,
            )
        },
        &[x, w, b],
    );
}

#[test]
fn layer_norm_grad() {
    let d = cpu();
    let x = leaf(&d, &[2, 3, 4], 30);
    let w = positive(&d, &[4], 31);
    let b = leaf(&d, &[4], 32);
    check(
        |t| ops::layer_norm(&t[0], &[4], Some(&t[1]), Some(&t[2]), 1e-5),
        &[x.clone(), w, b],
    );
    check(|t| ops::layer_norm(&t[0], &[3, 4], None, None, 1e-5), &[x]);
}

#[test]
fn pooling() {
    let d = cpu();
    // A permutation of distinct values 0.05 apart: no ties within eps.
    let n = 2 * 2 * 5 * 6;
    let v: Vec<f64> = (0..n).map(|i| ((i * 37) % n) as f64 * 0.05 - 3.0).collect();
    let x = Tensor::from_f64(&v, &[2, 2, 5, 6], DType::F32, &d).unwrap();
    x.requires_grad_(true).unwrap();
    check(
        |t| ops::max_pool2d(&t[0], &Pool2dParams::new(3, 2, 1)),
        std::slice::from_ref(&x),
    );
    check(
        |t| ops::max_pool2d(&t[0], &Pool2dParams::new(2, 1, 0)),
        std::slice::from_ref(&x),
    );
    check(
        |t| ops::adaptive_avg_pool2d(&t[0], [1, 1]),
        std::slice::from_ref(&x),
    );
    check(|t| ops::adaptive_avg_pool2d(&t[0], [3, 4]), &[x]);
}

#[test]
fn embedding_grad() {
    let d = cpu();
    let w = leaf(&d, &[5, 3], 33);
    let idx = Tensor::from_i64(&[1, 4, 1, 0, 2, 1], &[2, 3], &d).unwrap();
    check(|t| ops::embedding(&t[0], &idx), &[w]);
}

#[test]
fn dropout_grad() {
    let d = cpu();
    let x = leaf(&d, &[4, 5], 34);
    let dev = d.clone();
    check(
        move |t| {
            dev.manual_seed(7);
            ops::dropout(&t[0], 0.3, true)
        },
        &[x],
    );
}

#[test]
fn cross_entropy_and_nll() {
    let d = cpu();
    let x = leaf(&d, &[4, 5], 35);
    let tgt = Tensor::from_i64(&[1, 0, 4, 2], &[4], &d).unwrap();
    check(
        |t| ops::cross_entropy(&t[0], &tgt),
        std::slice::from_ref(&x),
    );
    let tgt2 = Tensor::from_i64(&[1, -100, 4, 2], &[4], &d).unwrap();
    check(
        |t| ops::cross_entropy(&t[0], &tgt2),
        std::slice::from_ref(&x),
    );
    check(
        |t| ops::cross_entropy_with(&t[0], &tgt, ops::nn::Reduction::Sum, -100),
        &[x],
    );
}

#[test]
fn views_and_shape_ops() {
    let d = cpu();
    let a = leaf(&d, &[2, 3, 4], 36);
    let b = leaf(&d, &[2, 1, 4], 37);
    check(
        |t| t[0].reshape(&[6, 4])?.mul_scalar(2.0),
        std::slice::from_ref(&a),
    );
    check(|t| t[0].view(&[4, -1]), std::slice::from_ref(&a));
    check(
        |t| t[0].transpose(0, 2)?.contiguous(),
        std::slice::from_ref(&a),
    );
    check(
        |t| t[0].permute(&[2, 0, 1])?.reshape(&[4, 6]),
        std::slice::from_ref(&a),
    );
    check(|t| t[0].narrow(1, 1, 2), std::slice::from_ref(&a));
    check(|t| t[0].select(2, 3), std::slice::from_ref(&a));
    check(|t| t[0].expand(&[2, 5, 4]), std::slice::from_ref(&b));
    check(|t| t[0].flatten(1, -1), std::slice::from_ref(&a));
    check(
        |t| t[0].unsqueeze(1)?.squeeze_dim(1),
        std::slice::from_ref(&a),
    );
    check(|t| Tensor::cat(&[&t[0], &t[1]], 1), &[a.clone(), b.clone()]);
    check(
        |t| {
            let parts = t[0].split(2, 2)?;
            parts[1].mul(&parts[0])
        },
        std::slice::from_ref(&a),
    );
    check(|t| t[0].clone_tensor(), &[a]);
}

#[test]
fn masked_fill_grad() {
    let d = cpu();
    let a = leaf(&d, &[3, 4], 38);
    let m = Tensor::from_f64(&[1.0, 0.0, 0.0, 1.0], &[4], DType::Bool, &d).unwrap();
    check(|t| t[0].masked_fill(&m, -1e4), &[a]);
}

#[test]
fn small_resnet_block_end_to_end() {
    let d = cpu();
    let x = leaf(&d, &[2, 3, 6, 6], 39);
    let w1 = leaf(&d, &[4, 3, 3, 3], 40);
    let g1 = positive(&d, &[4], 41);
    let b1 = leaf(&d, &[4], 42);
    let fc = leaf(&d, &[3, 4], 43);
    let tgt = Tensor::from_i64(&[2, 0], &[2], &d).unwrap();
    check(
        |t| {
            let y = ops::conv2d(&t[0], &t[1], None, &Conv2dParams::new(1, 1))?;
            let y = ops::batch_norm(&y, None, None, Some(&t[2]), Some(&t[3]), true, 0.1, 1e-5)?;
            let y = ops::adaptive_avg_pool2d(&y, [1, 1])?.flatten(1, -1)?;
            ops::cross_entropy(&ops::linear(&y, &t[4], None)?, &tgt)
        },
        &[x, w1, g1, b1, fc],
    );
}
