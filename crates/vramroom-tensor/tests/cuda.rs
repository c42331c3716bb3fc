//! The cuda backend against the cpu backend, op by op and model by model, in fp32 and bf16,
//! forward and backward; plus what only a GPU has: device-side index errors, CUDA graphs,
//! library workspaces from the caching allocator, and the allocation sequence against the
//! meta device. Every test is
//! `#[ignore]`d with the reason (a plain `cargo test` lists them as ignored); on a GPU machine
//! run them with `-- --include-ignored`.
//!
//! Both devices draw random tensors from the same generator (splitmix64; the CUDA kernels
//! compute element k's draw directly), so a closure run on each device with the same seed
//! builds the same inputs and parameters, and the outputs must agree within the dtype's
//! rounding. Convolutions run with TF32 off (as `torch.backends.cudnn.allow_tf32 = False`)
//! except in the test that checks TF32's own tolerance.

use std::sync::{Mutex, MutexGuard, OnceLock};

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::device::BlasThread;
use vramroom_tensor::models::{Gpt2, Gpt2Config, Mlp, ResNet};
use vramroom_tensor::nn::Init;
use vramroom_tensor::ops::{self, Conv2dParams, Pool2dParams, Reduction};
use vramroom_tensor::optim::{Adam, Optimizer, Sgd};
use vramroom_tensor::{no_grad, CudaRuntime, DType, Device, Module, Tensor, TensorError};

static RT: OnceLock<Option<CudaRuntime>> = OnceLock::new();
static LOCK: Mutex<()> = Mutex::new(());

fn runtime() -> Option<&'static CudaRuntime> {
    RT.get_or_init(|| {
        if let Some(why) = vramroom_cuda::unavailable_reason() {
            eprintln!("no GPU: {why}");
            return None;
        }
        // A GPU is here: the runtime must open (a missing library is a failure, not a skip).
        let rt = Device::cuda(0, AllocatorConfig::default()).expect("open cuda:0");
        rt.gpu.set_allow_tf32(false);
        Some(rt)
    })
    .as_ref()
}

macro_rules! gpu {
    () => {{
        let Some(rt) = runtime() else {
            panic!("{}: asked to run without a CUDA GPU", module_path!());
        };
        let g: MutexGuard<()> = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        (rt, g)
    }};
}

fn cpu() -> Device {
    Device::cpu_caching(16 << 30, AllocatorConfig::default())
}

fn tol(dt: DType) -> (f64, f64) {
    match dt {
        DType::BF16 => (2e-2, 2e-2),
        DType::F16 => (5e-3, 5e-3),
        _ => (2e-4, 2e-5),
    }
}

fn assert_close(what: &str, a: &[f64], b: &[f64], (rtol, atol): (f64, f64)) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    let scale = a.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x - y).abs() <= atol * scale.max(1.0) + rtol * x.abs().max(y.abs())
            || (x.is_nan() && y.is_nan());
        assert!(
            ok,
            "{what}[{i}]: cpu {x} vs cuda {y} (rtol {rtol}, atol {atol})"
        );
    }
}

/// Run `f` on cpu and on cuda with the same seed; compare every returned tensor.
fn both(
    rt: &CudaRuntime,
    what: &str,
    t: (f64, f64),
    f: impl Fn(&Device) -> Result<Vec<Tensor>, TensorError>,
) {
    let c = cpu();
    c.manual_seed(1234);
    let a = f(&c).unwrap_or_else(|e| panic!("{what} on cpu: {e}"));
    rt.device.manual_seed(1234);
    let b = f(&rt.device).unwrap_or_else(|e| panic!("{what} on cuda: {e}"));
    assert_eq!(a.len(), b.len());
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.shape(), y.shape(), "{what} #{k} shape");
        assert_eq!(x.dtype(), y.dtype(), "{what} #{k} dtype");
        let (xv, yv) = (x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap());
        assert_close(&format!("{what} #{k}"), &xv, &yv, t);
    }
}

fn leaf(shape: &[usize], dt: DType, d: &Device) -> Result<Tensor, TensorError> {
    let t = Tensor::randn(shape, 0.0, 1.0, dt, d)?;
    t.requires_grad_(true)?;
    Ok(t)
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn creation_and_random_streams_equal_the_cpu() {
    let (rt, _g) = gpu!();
    for dt in [DType::F32, DType::BF16, DType::F16] {
        both(rt, "creation", (0.0, 0.0), |d| {
            Ok(vec![
                Tensor::zeros(&[3, 5], dt, d)?,
                Tensor::full(&[7], -2.5, dt, d)?,
                Tensor::arange(11, dt, d)?,
                Tensor::from_f64(&[1.0, -3.0, 0.5, 8.0], &[2, 2], dt, d)?,
            ])
        });
        // Same generator: uniform and normal draws agree to the storage dtype's rounding.
        both(rt, "random", tol(dt), |d| {
            Ok(vec![
                Tensor::rand(&[1000], -1.0, 1.0, dt, d)?,
                Tensor::randn(&[1001], 0.5, 2.0, dt, d)?,
            ])
        });
    }
    both(rt, "ints", (0.0, 0.0), |d| {
        Ok(vec![
            Tensor::from_i64(&[1, -7, 1 << 40, 3], &[4], d)?,
            Tensor::arange(9, DType::I64, d)?,
            Tensor::from_f64(&[0.0, 1.0, 1.0], &[3], DType::Bool, d)?,
        ])
    });
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn views_copies_and_casts() {
    let (rt, _g) = gpu!();
    both(rt, "views", (0.0, 0.0), |d| {
        let x = Tensor::randn(&[4, 6, 5], 0.0, 1.0, DType::F32, d)?;
        Ok(vec![
            x.transpose(0, 2)?.contiguous()?,
            x.permute(&[1, 2, 0])?.contiguous()?,
            x.narrow(1, 2, 3)?.contiguous()?,
            x.narrow(2, 1, 1)?.expand(&[4, 6, 7])?.contiguous()?,
            x.to_dtype(DType::BF16)?,
            x.to_dtype(DType::BF16)?.to_dtype(DType::F32)?,
            x.mul_scalar(10.0)?.to_dtype(DType::I64)?,
            Tensor::cat(&[&x, &x.narrow(0, 0, 2)?], 0)?,
        ])
    });
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn elementwise_ops_in_f32_and_bf16() {
    let (rt, _g) = gpu!();
    for dt in [DType::F32, DType::BF16] {
        both(rt, "unary", tol(dt), |d| {
            let x = Tensor::randn(&[257, 3], 0.0, 1.0, dt, d)?;
            let p = x.square()?.add_scalar(0.5)?;
            let t = x.transpose(0, 1)?;
            Ok(vec![
                x.neg()?,
                x.exp()?,
                p.log()?,
                p.sqrt()?,
                x.tanh()?,
                x.sigmoid()?,
                x.relu()?,
                x.gelu(false)?,
                x.gelu(true)?,
                p.pow_scalar(1.5)?,
                x.mul_scalar(3.0)?.add_scalar(-1.0)?,
                t.relu()?,
            ])
        });
        both(rt, "binary", tol(dt), |d| {
            let a = Tensor::randn(&[4, 1, 6], 0.0, 1.0, dt, d)?;
            let b = Tensor::randn(&[5, 1], 0.0, 1.0, dt, d)?;
            let c = Tensor::randn(&[4, 5, 6], 0.0, 1.0, dt, d)?;
            let out = vec![
                a.add(&b)?,
                a.sub(&c)?,
                a.mul(&b)?,
                c.div(&b.abs_like()?)?,
                a.maximum(&c)?,
                c.transpose(0, 2)?.add(&c.transpose(0, 2)?)?,
            ];
            let m = Tensor::randn(&[4, 5, 6], 0.0, 1.0, dt, d)?;
            m.add_(&c)?;
            let mask = Tensor::from_f64(&[1.0, 0.0, 0.0, 1.0, 0.0, 1.0], &[6], DType::Bool, d)?;
            let mut out = out;
            out.push(m);
            out.push(c.masked_fill(&mask, -9.0)?);
            Ok(out)
        });
    }
}

trait AbsLike {
    fn abs_like(&self) -> Result<Tensor, TensorError>;
}
impl AbsLike for Tensor {
    /// |x| + 0.5, a safe divisor.
    fn abs_like(&self) -> Result<Tensor, TensorError> {
        self.square()?.sqrt()?.add_scalar(0.5)
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn reductions() {
    let (rt, _g) = gpu!();
    for dt in [DType::F32, DType::BF16] {
        let t = if dt == DType::F32 {
            (1e-4, 1e-5)
        } else {
            tol(dt)
        };
        both(rt, "reduce", t, |d| {
            let x = Tensor::randn(&[6, 300, 5], 0.0, 1.0, dt, d)?;
            Ok(vec![
                x.sum()?,
                x.mean()?,
                x.sum_dims(&[1], false)?,
                x.sum_dims(&[0, 2], true)?,
                x.mean_dims(&[2], false)?,
                x.amax(1, false)?,
                x.amin(-1, true)?,
                x.transpose(0, 1)?.sum_dims(&[0], false)?,
            ])
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn matmul_linear_in_f32_and_bf16() {
    let (rt, _g) = gpu!();
    for dt in [DType::F32, DType::BF16] {
        let t = if dt == DType::F32 {
            (1e-4, 1e-5)
        } else {
            (3e-2, 3e-2)
        };
        both(rt, "matmul", t, |d| {
            let a = Tensor::randn(&[33, 70], 0.0, 1.0, dt, d)?;
            let b = Tensor::randn(&[70, 19], 0.0, 1.0, dt, d)?;
            let bb = Tensor::randn(&[3, 70, 19], 0.0, 1.0, dt, d)?;
            let x = Tensor::randn(&[2, 5, 70], 0.0, 1.0, dt, d)?;
            let w = Tensor::randn(&[19, 70], 0.0, 1.0, dt, d)?;
            let bias = Tensor::randn(&[19], 0.0, 1.0, dt, d)?;
            Ok(vec![
                a.mm(&b)?,
                a.t()?.t()?.mm(&b)?,
                b.t()?.mm(&a.t()?)?,
                a.matmul(&bb)?,
                x.matmul(&bb.narrow(0, 0, 1)?.expand(&[2, 70, 19])?)?,
                ops::linear(&a, &w, Some(&bias))?,
                ops::linear(&x, &w, Some(&bias))?,
                ops::linear(&x, &w, None)?,
            ])
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn autograd_through_elementwise_matmul_softmax_and_reductions() {
    let (rt, _g) = gpu!();
    both(rt, "grads", (5e-4, 5e-5), |d| {
        let a = leaf(&[8, 16], DType::F32, d)?;
        let w = leaf(&[12, 16], DType::F32, d)?;
        let b = leaf(&[12], DType::F32, d)?;
        let y = ops::linear(&a, &w, Some(&b))?.gelu(true)?;
        let z = y.log_softmax(-1)?.mul(&y.sigmoid()?)?.sum()?;
        let s = a.softmax(0)?.tanh()?.mean()?;
        z.add(&s)?.backward()?;
        Ok(vec![
            z,
            a.grad().unwrap(),
            w.grad().unwrap(),
            b.grad().unwrap(),
        ])
    });
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn convolution_forward_and_backward() {
    let (rt, _g) = gpu!();
    let cases = [
        (Conv2dParams::new(1, 1), 1usize, 3usize),
        (Conv2dParams::new(2, 3), 1, 7),
        (
            Conv2dParams {
                stride: [1, 2],
                padding: [2, 1],
                dilation: [2, 1],
                groups: 2,
            },
            2,
            3,
        ),
    ];
    for (p, g, k) in cases {
        for dt in [DType::F32, DType::BF16] {
            let t = if dt == DType::F32 {
                (1e-3, 1e-4)
            } else {
                (4e-2, 4e-2)
            };
            both(rt, &format!("conv {p:?} {dt}"), t, |d| {
                let x = leaf(&[2, 4, 11, 9], dt, d)?;
                let w = leaf(&[6, 4 / g, k, k], dt, d)?;
                let b = leaf(&[6], dt, d)?;
                let y = ops::conv2d(&x, &w, Some(&b), &p)?;
                y.square()?.sum()?.backward()?;
                Ok(vec![
                    y,
                    x.grad().unwrap(),
                    w.grad().unwrap(),
                    b.grad().unwrap(),
                ])
            });
        }
    }
    // A strided (non-contiguous) input goes to cuDNN as is.
    both(rt, "conv strided input", (1e-3, 1e-4), |d| {
        let x = Tensor::randn(&[2, 11, 9, 4], 0.0, 1.0, DType::F32, d)?.permute(&[0, 3, 1, 2])?;
        let w = Tensor::randn(&[5, 4, 3, 3], 0.0, 1.0, DType::F32, d)?;
        Ok(vec![ops::conv2d(&x, &w, None, &Conv2dParams::new(1, 1))?])
    });
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn tf32_convolutions_stay_within_tf32_rounding() {
    let (rt, _g) = gpu!();
    rt.gpu.set_allow_tf32(true);
    both(rt, "conv tf32", (1e-2, 2e-3), |d| {
        let x = Tensor::randn(&[4, 16, 20, 20], 0.0, 1.0, DType::F32, d)?;
        let w = Tensor::randn(&[32, 16, 3, 3], 0.0, 0.1, DType::F32, d)?;
        Ok(vec![ops::conv2d(&x, &w, None, &Conv2dParams::new(1, 1))?])
    });
    rt.gpu.set_allow_tf32(false);
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn pooling_and_norms_forward_and_backward() {
    let (rt, _g) = gpu!();
    for dt in [DType::F32, DType::BF16] {
        let t = if dt == DType::F32 {
            (1e-3, 1e-4)
        } else {
            (4e-2, 4e-2)
        };
        both(rt, &format!("pool {dt}"), t, |d| {
            let x = leaf(&[2, 3, 13, 12], dt, d)?;
            let m = ops::max_pool2d(&x, &Pool2dParams::new(3, 2, 1))?;
            let a = ops::adaptive_avg_pool2d(&x, [5, 3])?;
            m.square()?.sum()?.add(&a.sum()?)?.backward()?;
            Ok(vec![m, a, x.grad().unwrap()])
        });
        both(rt, &format!("batch_norm {dt}"), t, |d| {
            let x = leaf(&[4, 5, 7, 6], dt, d)?;
            let w = leaf(&[5], dt, d)?;
            let b = leaf(&[5], dt, d)?;
            let rm = Tensor::zeros(&[5], dt, d)?;
            let rv = Tensor::ones(&[5], dt, d)?;
            let y = ops::batch_norm(
                &x,
                Some(&rm),
                Some(&rv),
                Some(&w),
                Some(&b),
                true,
                0.1,
                1e-5,
            )?;
            y.mul(&y)?.sum()?.backward()?;
            let ye = ops::batch_norm(
                &x.detach(),
                Some(&rm),
                Some(&rv),
                Some(&w),
                Some(&b),
                false,
                0.1,
                1e-5,
            )?;
            Ok(vec![
                y,
                x.grad().unwrap(),
                w.grad().unwrap(),
                b.grad().unwrap(),
                rm,
                rv,
                ye,
            ])
        });
        both(rt, &format!("layer_norm {dt}"), t, |d| {
            let x = leaf(&[3, 4, 40], dt, d)?;
            let w = leaf(&[40], dt, d)?;
            let b = leaf(&[40], dt, d)?;
            let y = ops::layer_norm(&x, &[40], Some(&w), Some(&b), 1e-5)?;
            y.pow_scalar(3.0)?.sum()?.backward()?;
            Ok(vec![
                y,
                x.grad().unwrap(),
                w.grad().unwrap(),
                b.grad().unwrap(),
            ])
        });
    }
}

/// The kernels' fast paths at the sizes that select them (16-byte runs along the last dim,
/// BN planes split over blocks or a warp each, warp-per-row softmax and layer norm with
/// vector loads), each against the cpu: the small shapes of the other tests take the
/// general paths.
#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn fast_paths_match_the_cpu() {
    let (rt, _g) = gpu!();
    for dt in [DType::F32, DType::BF16] {
        let t = tol(dt);
        let x0 = |shape: &[usize], d: &Device| Tensor::randn(shape, 0.0, 1.0, dt, d);
        both(rt, &format!("batch_norm eval planes {dt}"), t, |d| {
            let mut out = Vec::new();
            // 3136 (split over blocks at batch 1), 1024 (a block each), 196 (a warp each,
            // pairs), 49 (a warp each, one by one).
            for (n, c, h) in [(1, 4, 56), (3, 5, 32), (2, 6, 14), (2, 6, 7)] {
                let x = x0(&[n, c, h, h], d)?;
                let rm = x0(&[c], d)?;
                let rv = x0(&[c], d)?.square()?.add_scalar(0.5)?;
                let w = x0(&[c], d)?;
                let b = x0(&[c], d)?;
                let y = ops::batch_norm(
                    &x,
                    Some(&rm),
                    Some(&rv),
                    Some(&w),
                    Some(&b),
                    false,
                    0.1,
                    1e-5,
                )?;
                out.push(y.relu()?);
                // Fused on the GPU (no autograd here), two ops on the CPU; and through the
                // unfused fallback for a non-contiguous input.
                let args = (Some(&rm), Some(&rv), Some(&w), Some(&b));
                out.push(ops::batch_norm_relu(
                    &x, args.0, args.1, args.2, args.3, false, 0.1, 1e-5,
                )?);
                out.push(ops::batch_norm_relu(
                    &x.transpose(2, 3)?,
                    args.0,
                    args.1,
                    args.2,
                    args.3,
                    false,
                    0.1,
                    1e-5,
                )?);
            }
            Ok(out)
        });
        // Training batch norm and its backward walk (batch, plane index) by additions: planes
        // smaller and larger than a block, many elements per thread, and a transposed input
        // (inner dims not dense) through the general offsets. The last three have channels of
        // over 16384 elements, so each channel is split over 2, 4 and 16 blocks (the backward
        // splits in f32 only: it passes its sums through f32 grads).
        both(rt, &format!("batch_norm train strides {dt}"), t, |d| {
            let mut out = Vec::new();
            for (n, c, h, w, transposed) in [
                (8, 3, 9, 11, false),
                (6, 2, 30, 31, false),
                (5, 3, 7, 13, true),
                (16, 3, 32, 40, false),
                (9, 2, 60, 61, true),
                (32, 2, 64, 64, false),
            ] {
                let x = leaf(&[n, c, h, w], dt, d)?;
                let xin = if transposed {
                    x.transpose(2, 3)?
                } else {
                    x.clone()
                };
                let wt = leaf(&[c], dt, d)?;
                let b = leaf(&[c], dt, d)?;
                let rm = Tensor::zeros(&[c], dt, d)?;
                let rv = Tensor::ones(&[c], dt, d)?;
                let y = ops::batch_norm(
                    &xin,
                    Some(&rm),
                    Some(&rv),
                    Some(&wt),
                    Some(&b),
                    true,
                    0.1,
                    1e-5,
                )?;
                // A non-dense upstream gradient too (y's transpose, made contiguous by the op).
                y.mul(&y.transpose(2, 3)?.contiguous()?.transpose(2, 3)?)?
                    .sum()?
                    .backward()?;
                out.extend([
                    y,
                    x.grad().unwrap(),
                    wt.grad().unwrap(),
                    b.grad().unwrap(),
                    rm,
                    rv,
                ]);
            }
            Ok(out)
        });
        both(rt, &format!("layer_norm rows {dt}"), t, |d| {
            let mut out = Vec::new();
            for dim in [768, 100, 1000] {
                let x = x0(&[2, 5, dim], d)?;
                let w = x0(&[dim], d)?;
                let b = x0(&[dim], d)?;
                out.push(ops::layer_norm(&x, &[dim], Some(&w), Some(&b), 1e-5)?);
            }
            Ok(out)
        });
        both(
            rt,
            &format!("attention-shaped copies and masks {dt}"),
            t,
            |d| {
                let qkv = x0(&[2, 16, 3 * 32], d)?;
                let q = qkv
                    .narrow(2, 32, 32)?
                    .view(&[2, 16, 4, 8])?
                    .permute(&[0, 2, 1, 3])?;
                let qc = q.contiguous()?;
                let mask = vramroom_tensor::nn::causal_mask(32, d)?
                    .narrow(0, 0, 16)?
                    .narrow(1, 0, 16)?;
                let s = x0(&[2, 4, 16, 16], d)?.masked_fill(&mask, -1e4)?;
                let p = s.softmax(-1)?;
                let wide = x0(&[3, 1000], d)?.softmax(-1)?;
                let row512 = x0(&[4, 512], d)?.log_softmax(-1)?;
                Ok(vec![qc, s, p, wide, row512])
            },
        );
        both(rt, &format!("elementwise tails {dt}"), t, |d| {
            let a = x0(&[1003], d)?;
            let b = x0(&[1003], d)?;
            Ok(vec![a.relu()?, a.gelu(true)?, a.add(&b)?, a.mul(&b)?])
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn scaled_dot_product_attention_matches_the_cpu() {
    // The cuda backend's attention (cuDNN's engine, flash.cu's tiles and its row kernel,
    // picked by shape; the math path for f32 with grouped heads) against the cpu backend's,
    // as transformers calls SDPA.
    let (rt, _g) = gpu!();
    for dt in [DType::F32, DType::BF16, DType::F16] {
        both(
            rt,
            &format!("scaled_dot_product_attention {dt}"),
            tol(dt),
            |d| {
                let _ng = no_grad();
                let x0 = |shape: &[usize]| Tensor::randn(shape, 0.0, 1.0, dt, d);
                let mut out = Vec::new();
                for hd in [64usize, 128] {
                    // GPT-2's views of one c_attn projection, causal, a ragged last tile.
                    let (b, t, h) = (2usize, 77usize, 4usize);
                    let qkv = x0(&[b, t, 3 * h * hd])?;
                    let parts = qkv.split(h * hd, 2)?;
                    let heads = |p: &Tensor| {
                        p.view(&[b as isize, t as isize, h as isize, hd as isize])?
                            .transpose(1, 2)
                    };
                    let (q, k, v) = (heads(&parts[0])?, heads(&parts[1])?, heads(&parts[2])?);
                    let causal = ops::SdpaArgs {
                        is_causal: true,
                        ..Default::default()
                    };
                    out.push(ops::scaled_dot_product_attention(&q, &k, &v, &causal)?);
                    // A padding mask (true: attend), the second sequence half padding.
                    let keep: Vec<f64> = (0..b * t)
                        .map(|i| (i / t == 0 || i % t < t / 2) as u8 as f64)
                        .collect();
                    let m = Tensor::from_f64(&keep, &[b, 1, 1, t], DType::Bool, d)?;
                    let masked = ops::SdpaArgs {
                        attn_mask: Some(&m),
                        ..Default::default()
                    };
                    out.push(ops::scaled_dot_product_attention(&q, &k, &v, &masked)?);
                    // The decode step: one query against a 300-key cache, grouped heads.
                    let q1 = x0(&[b, 8, 1, hd])?;
                    let kc = x0(&[b, 2, 300, hd])?;
                    let vc = x0(&[b, 2, 300, hd])?;
                    let gqa = ops::SdpaArgs {
                        enable_gqa: true,
                        ..Default::default()
                    };
                    out.push(ops::scaled_dot_product_attention(&q1, &kc, &vc, &gqa)?);
                    // A Llama prefill: grouped heads, causal (f32 takes PyTorch's math path
                    // and its causal mask, filled on the device; 16-bit takes cuDNN's engine).
                    let (qg, kg, vg) = (
                        x0(&[b, 8, t, hd])?,
                        x0(&[b, 2, t, hd])?,
                        x0(&[b, 2, t, hd])?,
                    );
                    let gqa_causal = ops::SdpaArgs {
                        is_causal: true,
                        enable_gqa: true,
                        ..Default::default()
                    };
                    out.push(ops::scaled_dot_product_attention(
                        &qg,
                        &kg,
                        &vg,
                        &gqa_causal,
                    )?);
                }
                Ok(out)
            },
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn softmax_embedding_dropout_and_losses() {
    let (rt, _g) = gpu!();
    both(rt, "softmax", (1e-4, 1e-5), |d| {
        let x = leaf(&[3, 7, 50], DType::F32, d)?;
        let a = x.softmax(-1)?;
        let b = x.log_softmax(1)?;
        a.mul(&b)?.sum()?.backward()?;
        Ok(vec![a, b, x.grad().unwrap()])
    });
    both(rt, "embedding", (1e-5, 1e-6), |d| {
        let w = leaf(&[20, 8], DType::F32, d)?;
        let idx = Tensor::from_i64(&[3, 0, 19, 3, 7, 3], &[2, 3], d)?;
        let y = ops::embedding(&w, &idx)?;
        y.square()?.sum()?.backward()?;
        Ok(vec![y, w.grad().unwrap()])
    });
    // The same generator: the dropout masks are identical, element for element.
    both(rt, "dropout", (1e-6, 1e-7), |d| {
        let x = leaf(&[64, 33], DType::F32, d)?;
        let y = ops::dropout(&x, 0.3, true)?;
        y.sum()?.backward()?;
        Ok(vec![y, x.grad().unwrap()])
    });
    both(rt, "cross_entropy", (1e-4, 1e-5), |d| {
        let x = leaf(&[6, 11], DType::F32, d)?;
        let t = Tensor::from_i64(&[1, 0, 10, -100, 5, 5], &[6], d)?;
        let l = ops::cross_entropy(&x, &t)?;
        l.backward()?;
        let s = ops::nll_loss(&x.detach().log_softmax(-1)?, &t, Reduction::Sum, -100)?;
        Ok(vec![l, x.grad().unwrap(), s])
    });
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn a_bad_index_is_an_error_at_the_next_read_and_the_device_survives() {
    let (rt, _g) = gpu!();
    let d = &rt.device;
    let w = Tensor::randn(&[10, 4], 0.0, 1.0, DType::F32, d).unwrap();
    let idx = Tensor::from_i64(&[1, 12], &[2], d).unwrap();
    let y = ops::embedding(&w, &idx).unwrap();
    match y.to_vec_f64() {
        Err(TensorError::IndexOutOfRange { op, msg }) => {
            assert_eq!(op, "embedding");
            assert!(msg.contains("12"), "{msg}");
        }
        other => panic!("expected an index error, got {other:?}"),
    }
    // The context is fine: later work runs and reads back.
    let z = Tensor::ones(&[3], DType::F32, d)
        .unwrap()
        .add_scalar(1.0)
        .unwrap();
    assert_eq!(z.to_vec_f64().unwrap(), vec![2.0; 3]);
}

fn same_params(a: &dyn Module, b: &dyn Module) {
    for ((n, x), (_, y)) in a
        .named_parameters()
        .iter()
        .zip(b.named_parameters())
        .take(3)
    {
        assert_close(
            n,
            &x.to_vec_f64().unwrap(),
            &y.to_vec_f64().unwrap(),
            (0.0, 0.0),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn models_forward_and_backward_match_the_cpu() {
    let (rt, _g) = gpu!();
    // ResNet-18 in eval and train mode; the parameters come from the same generator.
    both(rt, "resnet18", (2e-3, 2e-4), |d| {
        let mut m = ResNet::resnet18(&Init::new(d, DType::F32), 10)?;
        m.train(false);
        let x = Tensor::randn(&[2, 3, 64, 64], 0.0, 1.0, DType::F32, d)?;
        let y = {
            let _ng = no_grad();
            m.forward(&x)?
        };
        m.train(true);
        let z = m.forward(&x)?;
        ops::cross_entropy(&z, &Tensor::from_i64(&[3, 7], &[2], d)?)?.backward()?;
        let g = m.parameters()[0].grad().unwrap();
        Ok(vec![y, z, g])
    });
    {
        let c = cpu();
        c.manual_seed(5);
        rt.device.manual_seed(5);
        let a = ResNet::resnet18(&Init::new(&c, DType::F32), 10).unwrap();
        let b = ResNet::resnet18(&Init::new(&rt.device, DType::F32), 10).unwrap();
        same_params(&a, &b);
    }
    both(rt, "gpt2-tiny", (2e-3, 2e-4), |d| {
        let m = Gpt2::new(&Init::new(d, DType::F32), Gpt2Config::tiny())?;
        let ids = Tensor::from_i64(&[1, 5, 9, 2, 44, 3, 3, 0, 17, 8], &[2, 5], d)?;
        let logits = m.forward(&ids)?;
        let loss = m.loss(&logits, &ids.reshape(&[10])?)?;
        loss.backward()?;
        let g = m.parameters()[2].grad().unwrap();
        Ok(vec![logits, loss, g])
    });
    both(rt, "gpt2-tiny bf16", (6e-2, 6e-2), |d| {
        let m = Gpt2::new(&Init::new(d, DType::BF16), Gpt2Config::tiny())?;
        let ids = Tensor::from_i64(&[1, 5, 9, 2, 44, 3, 3, 0, 17, 8], &[2, 5], d)?;
        let _ng = no_grad();
        Ok(vec![m.forward(&ids)?])
    });
    // Optimizer steps: SGD with momentum and AdamW update the same parameters the same way.
    both(rt, "mlp training", (1e-4, 1e-5), |d| {
        let m = Mlp::new(&Init::new(d, DType::F32), &[20, 32, 5])?;
        let mut sgd = Sgd::new(m.parameters(), 0.1, 0.9, 1e-4)?;
        let m2 = Mlp::new(&Init::new(d, DType::F32), &[20, 32, 5])?;
        let mut adam = Adam::adamw(m2.parameters(), 1e-2, 0.01)?;
        let x = Tensor::randn(&[16, 20], 0.0, 1.0, DType::F32, d)?;
        let t = Tensor::from_i64(&[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0], &[16], d)?;
        for _ in 0..3 {
            for (m, opt) in [
                (&m, &mut sgd as &mut dyn Optimizer),
                (&m2, &mut adam as &mut dyn Optimizer),
            ] {
                opt.zero_grad(true)?;
                ops::cross_entropy(&m.forward(&x)?, &t)?.backward()?;
                opt.step()?;
            }
        }
        let mut v = m.parameters();
        v.extend(m2.parameters());
        Ok(v)
    });
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn cuda_allocations_follow_the_meta_device() {
    let (rt, _g) = gpu!();
    // The op layer allocates before any kernel runs, so the caching allocator sees the same
    // sequence on cuda as on meta; only the cuDNN workspaces may differ (real algorithm
    // choices on cuda, PyTorch's measured ones on meta).
    let meta = Device::meta_caching(1 << 40, AllocatorConfig::default());
    for (name, d) in [("meta", &meta), ("cuda", &rt.device)] {
        let _ = name;
        d.manual_seed(3);
    }
    let run = |d: &Device| -> (u64, u64) {
        // Earlier tests may have run GEMMs on the cuda device already: give both devices
        // their cuBLAS handle workspaces up front, so the peaks compare the forward alone.
        for t in [BlasThread::Forward, BlasThread::Backward] {
            d.init_blas_handle(t).unwrap();
        }
        let mut m = Gpt2::new(&Init::new(d, DType::F32), Gpt2Config::tiny()).unwrap();
        m.train(false);
        let base = d.memory_allocated();
        d.reset_peak_memory_stats();
        let ids = Tensor::zeros(&[4, 16], DType::I64, d).unwrap();
        let _ng = no_grad();
        let y = m.forward(&ids).unwrap();
        (d.max_memory_allocated() - base, y.nbytes())
    };
    let (pm, ym) = run(&meta);
    let (pc, yc) = run(&rt.device);
    assert_eq!(ym, yc);
    // GPT-2 has no convolution: the sequences, and so the peaks, are equal to the byte.
    assert_eq!(pm, pc, "peak above base: meta {pm} vs cuda {pc}");
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn cuda_graph_replays_with_new_inputs_and_keeps_its_pool_private() {
    let (rt, _g) = gpu!();
    let d = &rt.device;
    d.manual_seed(9);
    let mut m = ResNet::resnet18(&Init::new(d, DType::F32), 10).unwrap();
    m.train(false);
    let _ng = no_grad();
    let x = Tensor::randn(&[1, 3, 64, 64], 0.0, 1.0, DType::F32, d).unwrap();
    let eager = m.forward(&x).unwrap().to_vec_f64().unwrap();
    let (graph, out) = rt.capture(|| m.forward(&x)).unwrap();
    // Capturing ran nothing: replay computes.
    graph.replay().unwrap();
    assert_close("replay", &eager, &out.to_vec_f64().unwrap(), (1e-5, 1e-6));
    // New data in the static input, replay again, compare with eager on the same data.
    let x2 = Tensor::randn(&[1, 3, 64, 64], 0.0, 1.0, DType::F32, d).unwrap();
    x.copy_(&x2).unwrap();
    graph.replay().unwrap();
    let eager2 = m.forward(&x2).unwrap().to_vec_f64().unwrap();
    assert_close(
        "replay 2",
        &eager2,
        &out.to_vec_f64().unwrap(),
        (1e-5, 1e-6),
    );
    // Memory of the capture is on the graph's own pool stream: eager allocations never get
    // it, so filling fresh tensors cannot corrupt what the graph reads on its next replay.
    let snap = rt.allocator.snapshot();
    let pool_segments: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.stream == graph.pool())
        .collect();
    assert!(
        !pool_segments.is_empty(),
        "the capture allocated nothing on its pool"
    );
    let junk: Vec<Tensor> = (0..20)
        .map(|_| Tensor::full(&[64 * 64 * 16], 7.0, DType::F32, d).unwrap())
        .collect();
    for j in &junk {
        let p = j.storage().ptr();
        for s in &pool_segments {
            assert!(
                p < s.address || p >= s.address + s.total_size,
                "eager block inside the graph pool"
            );
        }
    }
    graph.replay().unwrap();
    assert_close(
        "replay 3",
        &eager2,
        &out.to_vec_f64().unwrap(),
        (1e-5, 1e-6),
    );
    // A host read inside a capture is refused, and the runtime recovers.
    let r = rt.capture(|| x.to_vec_f64());
    assert!(r.is_err());
    assert_eq!(
        Tensor::ones(&[2], DType::F32, d)
            .unwrap()
            .to_vec_f64()
            .unwrap(),
        vec![1.0, 1.0]
    );
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn threads_share_one_device() {
    let (rt, _g) = gpu!();
    let d = rt.device.clone();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let d = d.clone();
            std::thread::spawn(move || {
                let a = Tensor::full(&[64, 64], 1.0 + i as f64, DType::F32, &d).unwrap();
                let mut s = 0.0;
                for _ in 0..50 {
                    s = a.mm(&a).unwrap().sum().unwrap().item().unwrap();
                }
                s
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let v = 1.0 + i as f64;
        assert_eq!(h.join().unwrap(), 64.0 * 64.0 * 64.0 * v * v);
    }
}
