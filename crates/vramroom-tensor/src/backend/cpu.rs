//! The cpu backend: real kernels on host memory.
//!
//! Design note: kernels load their inputs as f32 in logical (row-major) order, borrowing the
//! memory directly when the input is a contiguous f32 tensor and gathering otherwise; f16,
//! bf16 and integers are converted on load and store. Matmul and conv go through
//! `matrixmultiply::sgemm`, which takes arbitrary strides, so transposed views cost no copy.
//! Scratch space (im2col columns) lives in plain `Vec`s, not on the device: what PyTorch
//! takes from the caching allocator as workspace is allocated by the op layer instead, so
//! cpu and meta make the same allocations. Kernels never panic on user input: the op layer
//! validated shapes, and index-driven kernels check bounds and return errors.

use std::borrow::Cow;

use half::{bf16, f16};

use super::*;
use crate::error::TensorError;
use crate::layout::{contiguous_strides, for_each_offset, numel};

pub struct CpuBackend;

#[inline]
fn base(r: TRef, off: usize) -> *mut u8 {
    (r.ptr as usize + off * r.dtype.size()) as *mut u8
}

// SAFETY (for every raw read/write below): the op layer created `r` from a live storage whose
// block covers `layout.extent()` elements of `dtype` (checked when the view was made), so
// every offset produced by `for_each_offset` lies inside the block.
#[inline]
fn get(r: TRef, off: usize) -> f64 {
    let p = base(r, off);
    unsafe {
        match r.dtype {
            DType::F32 => *(p as *const f32) as f64,
            DType::F16 => f16::from_bits(*(p as *const u16)).to_f64(),
            DType::BF16 => bf16::from_bits(*(p as *const u16)).to_f64(),
            DType::I64 => *(p as *const i64) as f64,
            DType::I32 => *(p as *const i32) as f64,
            DType::U8 => *p as f64,
            DType::Bool => (*p != 0) as u8 as f64,
        }
    }
}

#[inline]
pub(super) fn set(r: TRef, off: usize, v: f64) {
    let p = base(r, off);
    unsafe {
        match r.dtype {
            DType::F32 => *(p as *mut f32) = v as f32,
            DType::F16 => *(p as *mut u16) = f16::from_f64(v).to_bits(),
            DType::BF16 => *(p as *mut u16) = bf16::from_f64(v).to_bits(),
            DType::I64 => *(p as *mut i64) = v as i64,
            DType::I32 => *(p as *mut i32) = v as i32,
            DType::U8 => *p = v as u8,
            DType::Bool => *p = (v != 0.0) as u8,
        }
    }
}

fn is_f32_contig(r: TRef) -> bool {
    r.dtype == DType::F32 && r.layout.is_contiguous()
}

/// The elements of `r` in logical order as f32; borrowed when already laid out that way,
/// unless `avoid` (an output about to be written) is the same memory.
fn load<'a>(r: TRef<'a>, avoid: Option<TRef>) -> Cow<'a, [f32]> {
    let n = r.layout.numel();
    if n == 0 {
        return Cow::Owned(Vec::new());
    }
    let aliased = avoid.is_some_and(|o| o.ptr == r.ptr);
    if is_f32_contig(r) && !aliased {
        // SAFETY: contiguous f32 view inside a live block (see above); no &mut to it exists
        // during the kernel because outputs that alias were excluded.
        return Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(base(r, r.layout.offset) as *const f32, n)
        });
    }
    let mut v = Vec::with_capacity(n);
    if r.dtype == DType::F32 {
        for_each_offset(r.layout, |o| v.push(unsafe { *(base(r, o) as *const f32) }));
    } else {
        for_each_offset(r.layout, |o| v.push(get(r, o) as f32));
    }
    Cow::Owned(v)
}

pub(super) fn load_f64(r: TRef) -> Vec<f64> {
    let mut v = Vec::with_capacity(r.layout.numel());
    for_each_offset(r.layout, |o| v.push(get(r, o)));
    v
}

fn load_i64(r: TRef) -> Vec<i64> {
    let mut v = Vec::with_capacity(r.layout.numel());
    if r.dtype == DType::I64 {
        for_each_offset(r.layout, |o| v.push(unsafe { *(base(r, o) as *const i64) }));
    } else {
        for_each_offset(r.layout, |o| v.push(get(r, o) as i64));
    }
    v
}

fn store(r: TRef, data: &[f32]) {
    if data.is_empty() {
        return;
    }
    if is_f32_contig(r) {
        // SAFETY: as above; `data` is never a view of `r` (callers pass owned buffers or
        // inputs that `load` copied when they aliased).
        let dst = unsafe {
            std::slice::from_raw_parts_mut(base(r, r.layout.offset) as *mut f32, data.len())
        };
        dst.copy_from_slice(data);
        return;
    }
    let mut i = 0;
    for_each_offset(r.layout, |o| {
        set(r, o, data[i] as f64);
        i += 1;
    });
}

/// Runs `f` on `out` as a mutable f32 slice in logical order, converting if needed.
fn with_out<R>(out: TRef, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let n = out.layout.numel();
    if n > 0 && is_f32_contig(out) {
        // SAFETY: fresh output block, or an in-place target whose aliasing inputs were
        // copied by `load(.., Some(out))`.
        let s =
            unsafe { std::slice::from_raw_parts_mut(base(out, out.layout.offset) as *mut f32, n) };
        return f(s);
    }
    let mut v = vec![0f32; n];
    let r = f(&mut v);
    store(out, &v);
    r
}

fn erf(x: f64) -> f64 {
    // Numerical Recipes erfc (Chebyshev), |error| < 1.2e-7: more than f32 needs.
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// `x ** e` as PyTorch's pow kernels compute it: the exponents 2, 3, 0.5, -0.5, -1 and -2
/// by multiplication, square root and reciprocal (both its CPU and CUDA kernels special-case
/// them; GPT-2's `gelu_new` cubes), anything else by `powf`. k_unary's op 14 does the same.
fn pow_scalar(x: f32, e: f64) -> f32 {
    match e {
        2.0 => x * x,
        3.0 => x * x * x,
        0.5 => x.sqrt(),
        -0.5 => 1.0 / x.sqrt(),
        -1.0 => 1.0 / x,
        -2.0 => 1.0 / (x * x),
        _ => x.powf(e as f32),
    }
}

fn gelu(x: f32, tanh: bool) -> f32 {
    let x = x as f64;
    if tanh {
        (0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())) as f32
    } else {
        (0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))) as f32
    }
}

fn gelu_grad(x: f32, tanh: bool) -> f32 {
    let x = x as f64;
    if tanh {
        let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
        let t = u.tanh();
        let du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
        (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du) as f32
    } else {
        let cdf = 0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2));
        let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        (cdf + x * pdf) as f32
    }
}

use vramroom_alloc::rng::Rng;

/// One past the highest element a `rows x cols` matrix with strides `rs`, `cs` addresses,
/// or `None` when that does not fit in `usize` (dimensions wrapped on the way here).
fn span(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    let r = (rows - 1).checked_mul(usize::try_from(rs).ok()?)?;
    let c = (cols - 1).checked_mul(usize::try_from(cs).ok()?)?;
    r.checked_add(c)?.checked_add(1)
}

/// `c[m,n] = a[m,k] @ b[k,n] (+ c)`, all f32 with element strides, over the slices that
/// hold them. The boundary before `matrixmultiply`'s unsafe packing: every dimension and
/// stride is checked against the slice it addresses, so dimensions that wrapped upstream
/// (a config's `intermediate_size` = 2^62) are an error here, never a read past a buffer.
#[allow(clippy::too_many_arguments)]
fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    rsa: isize,
    csa: isize,
    b: &[f32],
    rsb: isize,
    csb: isize,
    c: &mut [f32],
    rsc: isize,
    csc: isize,
    beta: f32,
) -> Result<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let fits = |rows, cols, rs, cs, len: usize| span(rows, cols, rs, cs).is_some_and(|s| s <= len);
    if !fits(m, k, rsa, csa, a.len())
        || !fits(k, n, rsb, csb, b.len())
        || !fits(m, n, rsc, csc, c.len())
    {
        return Err(TensorError::invalid(
            "matmul",
            format!(
                "[{m}, {k}] @ [{k}, {n}] does not fit the buffers it was given (a shape wrapped?)"
            ),
        ));
    }
    // SAFETY: checked just above: the strides address m*k, k*n and m*n elements inside
    // `a`, `b` and `c`; `c` is a `&mut` so it does not alias `a` or `b`.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            rsc,
            csc,
        );
    }
    Ok(())
}

fn dims4(l: &Layout) -> [usize; 4] {
    [l.shape[0], l.shape[1], l.shape[2], l.shape[3]]
}

/// im2col of one image's group: `col[(c*kh+i)*kw+j][oh*OW+ow]`.
#[allow(clippy::too_many_arguments)]
fn im2col(
    x: &[f32],
    c0: usize,
    cg: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    p: &Conv2dParams,
    col: &mut [f32],
) {
    let ohw = oh * ow;
    for c in 0..cg {
        let plane = &x[(c0 + c) * h * w..(c0 + c + 1) * h * w];
        for i in 0..kh {
            for j in 0..kw {
                let row =
                    &mut col[((c * kh + i) * kw + j) * ohw..((c * kh + i) * kw + j + 1) * ohw];
                for y in 0..oh {
                    let iy = (y * p.stride[0] + i * p.dilation[0]) as isize - p.padding[0] as isize;
                    let dst = &mut row[y * ow..(y + 1) * ow];
                    if iy < 0 || iy >= h as isize {
                        dst.fill(0.0);
                        continue;
                    }
                    let src = &plane[iy as usize * w..(iy as usize + 1) * w];
                    for (xo, d) in dst.iter_mut().enumerate() {
                        let ix =
                            (xo * p.stride[1] + j * p.dilation[1]) as isize - p.padding[1] as isize;
                        *d = if ix < 0 || ix >= w as isize {
                            0.0
                        } else {
                            src[ix as usize]
                        };
                    }
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn col2im(
    col: &[f32],
    gx: &mut [f32],
    c0: usize,
    cg: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    p: &Conv2dParams,
) {
    let ohw = oh * ow;
    for c in 0..cg {
        let plane = &mut gx[(c0 + c) * h * w..(c0 + c + 1) * h * w];
        for i in 0..kh {
            for j in 0..kw {
                let row = &col[((c * kh + i) * kw + j) * ohw..((c * kh + i) * kw + j + 1) * ohw];
                for y in 0..oh {
                    let iy = (y * p.stride[0] + i * p.dilation[0]) as isize - p.padding[0] as isize;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    for xo in 0..ow {
                        let ix =
                            (xo * p.stride[1] + j * p.dilation[1]) as isize - p.padding[1] as isize;
                        if ix >= 0 && ix < w as isize {
                            plane[iy as usize * w + ix as usize] += row[y * ow + xo];
                        }
                    }
                }
            }
        }
    }
}

fn check_index(i: i64, n: usize, op: &'static str) -> Result<usize> {
    if i < 0 || i as usize >= n {
        return Err(TensorError::IndexOutOfRange {
            op,
            msg: format!("index {i} is out of bounds for size {n}"),
        });
    }
    Ok(i as usize)
}

/// Index of the first maximum along the one dim in `dims` (NaN counts as the maximum, as in
/// PyTorch), into an integer `out` of `x`'s shape with that dim 1.
fn argmax(x: TRef, dims: &[usize], out: TRef) -> Result<()> {
    let [d] = dims else {
        return Err(TensorError::invalid("argmax", "exactly one dim"));
    };
    let shape = &x.layout.shape;
    let n = shape.get(*d).copied().unwrap_or(1);
    let outer: usize = shape[..*d].iter().product();
    let inner: usize = shape[*d + 1..].iter().product();
    let xs = load_f64(x);
    let mut idx = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best = (f64::NEG_INFINITY, 0usize);
            for j in 0..n {
                let v = xs[(o * n + j) * inner + i];
                if j == 0 || v > best.0 || (v.is_nan() && !best.0.is_nan()) {
                    best = (v, j);
                }
            }
            idx.push(best.1 as f64);
        }
    }
    let mut k = 0;
    for_each_offset(out.layout, |off| {
        set(out, off, idx[k]);
        k += 1;
    });
    Ok(())
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn fill(&self, out: TRef, value: f64) -> Result<()> {
        if is_f32_contig(out) {
            with_out(out, |o| o.fill(value as f32));
        } else {
            for_each_offset(out.layout, |o| set(out, o, value));
        }
        Ok(())
    }

    fn arange(&self, out: TRef, start: f64, step: f64) -> Result<()> {
        let mut i = 0.0;
        for_each_offset(out.layout, |o| {
            set(out, o, start + i * step);
            i += 1.0;
        });
        Ok(())
    }

    fn uniform(&self, out: TRef, low: f64, high: f64, seed: u64) -> Result<()> {
        let mut rng = Rng::new(seed);
        for_each_offset(out.layout, |o| set(out, o, low + (high - low) * rng.unit()));
        Ok(())
    }

    fn normal(&self, out: TRef, mean: f64, std: f64, seed: u64) -> Result<()> {
        let mut rng = Rng::new(seed);
        for_each_offset(out.layout, |o| {
            let u1 = rng.unit().max(1e-300);
            let u2 = rng.unit();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            set(out, o, mean + std * z);
        });
        Ok(())
    }

    fn write_f64(&self, out: TRef, data: &[f64]) -> Result<()> {
        let mut i = 0;
        for_each_offset(out.layout, |o| {
            set(out, o, data.get(i).copied().unwrap_or(0.0));
            i += 1;
        });
        Ok(())
    }

    fn read_f64(&self, x: TRef) -> Result<Vec<f64>> {
        Ok(load_f64(x))
    }

    fn copy(&self, src: TRef, dst: TRef) -> Result<()> {
        if src.dtype.is_float() && dst.dtype.is_float() {
            let v = load(src, Some(dst));
            store(dst, &v);
        } else {
            let v = load_f64(src);
            let mut i = 0;
            for_each_offset(dst.layout, |o| {
                set(dst, o, v[i]);
                i += 1;
            });
        }
        Ok(())
    }

    fn unary(&self, op: UnaryOp, x: TRef, out: TRef) -> Result<()> {
        let xs = load(x, Some(out));
        let f: Box<dyn Fn(f32) -> f32> = match op {
            UnaryOp::Neg => Box::new(|v| -v),
            UnaryOp::Exp => Box::new(|v| v.exp()),
            UnaryOp::Log => Box::new(|v| v.ln()),
            UnaryOp::Sqrt => Box::new(|v| v.sqrt()),
            UnaryOp::Rsqrt => Box::new(|v| 1.0 / v.sqrt()),
            UnaryOp::Tanh => Box::new(|v| v.tanh()),
            UnaryOp::Sigmoid => Box::new(|v| 1.0 / (1.0 + (-v).exp())),
            UnaryOp::Relu => Box::new(|v| if v > 0.0 { v } else { 0.0 }),
            UnaryOp::Gelu { tanh } => Box::new(move |v| gelu(v, tanh)),
            UnaryOp::Abs => Box::new(|v| v.abs()),
            UnaryOp::Square => Box::new(|v| v * v),
            UnaryOp::AddScalar(s) => Box::new(move |v| v + s as f32),
            UnaryOp::MulScalar(s) => Box::new(move |v| v * s as f32),
            UnaryOp::PowScalar(s) => Box::new(move |v| pow_scalar(v, s)),
            UnaryOp::Cos => Box::new(|v| v.cos()),
            UnaryOp::Sin => Box::new(|v| v.sin()),
            UnaryOp::Silu => Box::new(|v| v / (1.0 + (-v).exp())),
        };
        with_out(out, |o| {
            for (d, s) in o.iter_mut().zip(xs.iter()) {
                *d = f(*s);
            }
        });
        Ok(())
    }

    fn binary(&self, op: BinaryOp, a: TRef, b: TRef, out: TRef) -> Result<()> {
        let av = load(a, Some(out));
        let bv = load(b, Some(out));
        let f: Box<dyn Fn(f32, f32) -> f32> = match op {
            BinaryOp::Add { alpha } => {
                if alpha == 1.0 {
                    Box::new(|x, y| x + y)
                } else {
                    Box::new(move |x, y| x + alpha as f32 * y)
                }
            }
            BinaryOp::Sub => Box::new(|x, y| x - y),
            BinaryOp::Mul => Box::new(|x, y| x * y),
            BinaryOp::Div => Box::new(|x, y| x / y),
            BinaryOp::Maximum => Box::new(|x, y| x.max(y)),
            BinaryOp::ThresholdBackward => Box::new(|g, y| if y > 0.0 { g } else { 0.0 }),
            BinaryOp::GeluBackward { tanh } => Box::new(move |g, x| g * gelu_grad(x, tanh)),
            BinaryOp::TanhBackward => Box::new(|g, y| g * (1.0 - y * y)),
            BinaryOp::SigmoidBackward => Box::new(|g, y| g * y * (1.0 - y)),
            BinaryOp::SiluBackward => Box::new(|g, x| {
                let s = 1.0 / (1.0 + (-x).exp());
                g * s * (1.0 + x * (1.0 - s))
            }),
        };
        with_out(out, |o| {
            for ((d, x), y) in o.iter_mut().zip(av.iter()).zip(bv.iter()) {
                *d = f(*x, *y);
            }
        });
        Ok(())
    }

    fn reduce(&self, op: ReduceOp, x: TRef, dims: &[usize], out: TRef) -> Result<()> {
        if op == ReduceOp::ArgMax {
            return argmax(x, dims, out);
        }
        let xs = load(x, None);
        let shape = &x.layout.shape;
        let mut ostr = contiguous_strides(&out.layout.shape);
        for &d in dims {
            if d < ostr.len() {
                ostr[d] = 0;
            }
        }
        let map = Layout {
            shape: shape.clone(),
            strides: ostr,
            offset: 0,
        };
        let on = out.layout.numel();
        let init = match op {
            ReduceOp::Sum | ReduceOp::Mean => 0.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Min => f64::INFINITY,
            ReduceOp::ArgMax => 0.0,
        };
        let mut acc = vec![init; on];
        let mut i = 0;
        for_each_offset(&map, |o| {
            let v = xs[i] as f64;
            let a = &mut acc[o];
            match op {
                ReduceOp::Sum | ReduceOp::Mean => *a += v,
                ReduceOp::Max => {
                    if v > *a || v.is_nan() {
                        *a = v
                    }
                }
                ReduceOp::Min => {
                    if v < *a || v.is_nan() {
                        *a = v
                    }
                }
                ReduceOp::ArgMax => {}
            }
            i += 1;
        });
        if op == ReduceOp::Mean {
            let count = (numel(shape) / on.max(1)) as f64;
            for a in &mut acc {
                *a /= count;
            }
        }
        with_out(out, |o| {
            for (d, a) in o.iter_mut().zip(&acc) {
                *d = *a as f32;
            }
        });
        Ok(())
    }

    fn attention(&self, a: &AttentionArgs, p: &AttentionParams) -> Result<()> {
        super::cpu_attention::forward(a, p)
    }

    fn attention_backward(&self, a: &AttentionGradArgs, p: &AttentionParams) -> Result<()> {
        super::cpu_attention::backward(a, p)
    }

    fn masked_fill(&self, x: TRef, mask: TRef, value: f64, out: TRef) -> Result<()> {
        let xs = load(x, Some(out));
        let ms = load_f64(mask);
        with_out(out, |o| {
            for ((d, v), m) in o.iter_mut().zip(xs.iter()).zip(&ms) {
                *d = if *m != 0.0 { value as f32 } else { *v };
            }
        });
        Ok(())
    }

    fn matmul(&self, a: TRef, b: TRef, out: TRef, accumulate: bool) -> Result<()> {
        let (bs, m, k) = (a.layout.shape[0], a.layout.shape[1], a.layout.shape[2]);
        let n = b.layout.shape[2];
        let beta = if accumulate { 1.0 } else { 0.0 };
        // Strided f32 operands go straight to sgemm; anything else is packed once.
        let pack = |r: TRef| -> (Cow<[f32]>, [usize; 3], usize) {
            if r.dtype == DType::F32 && r.ptr != 0 {
                let n = r.layout.extent();
                // SAFETY: the view's extent lies inside its live block.
                let s = unsafe { std::slice::from_raw_parts(r.ptr as *const f32, n) };
                let st = &r.layout.strides;
                (Cow::Borrowed(s), [st[0], st[1], st[2]], r.layout.offset)
            } else {
                let v = load(r, None).into_owned();
                let st = contiguous_strides(&r.layout.shape);
                (Cow::Owned(v), [st[0], st[1], st[2]], 0)
            }
        };
        let (av, ast, aoff) = pack(a);
        let (bv, bst, boff) = pack(b);
        let ost = contiguous_strides(&out.layout.shape);
        let run = |o: &mut [f32]| -> Result<()> {
            let tail = |v: usize, off: usize, i: usize, st: usize| {
                i.checked_mul(st)
                    .and_then(|x| x.checked_add(off))
                    .filter(|&x| x <= v)
                    .ok_or_else(|| TensorError::invalid("matmul", "batch stride past its buffer"))
            };
            for i in 0..bs {
                let (ao, bo, oo) = (
                    tail(av.len(), aoff, i, ast[0])?,
                    tail(bv.len(), boff, i, bst[0])?,
                    tail(o.len(), 0, i, ost[0])?,
                );
                sgemm(
                    m,
                    k,
                    n,
                    &av[ao..],
                    ast[1] as isize,
                    ast[2] as isize,
                    &bv[bo..],
                    bst[1] as isize,
                    bst[2] as isize,
                    &mut o[oo..],
                    ost[1] as isize,
                    ost[2] as isize,
                    beta,
                )?;
            }
            Ok(())
        };
        if m == 0 || n == 0 || bs == 0 {
            return Ok(());
        }
        if k == 0 {
            if !accumulate {
                with_out(out, |o| o.fill(0.0));
            }
            return Ok(());
        }
        if is_f32_contig(out) {
            with_out(out, run)?;
        } else {
            let mut o = if accumulate {
                load(out, None).into_owned()
            } else {
                vec![0.0; out.layout.numel()]
            };
            run(&mut o)?;
            store(out, &o);
        }
        Ok(())
    }

    fn conv2d(
        &self,
        x: TRef,
        w: TRef,
        bias: Option<TRef>,
        out: TRef,
        p: &Conv2dParams,
        _ws: Workspace,
    ) -> Result<()> {
        let [n, c, h, wd] = dims4(x.layout);
        let [o, cg, kh, kw] = dims4(w.layout);
        let [_, _, oh, ow] = dims4(out.layout);
        let g = p.groups;
        let og = o / g;
        let xs = load(x, None);
        let ws = load(w, None);
        let bs = bias.map(|b| load(b, None).into_owned());
        let kk = cg * kh * kw;
        let ohw = oh * ow;
        let mut col = vec![0f32; kk * ohw];
        with_out(out, |os| -> Result<()> {
            for b in 0..n {
                let img = &xs[b * c * h * wd..(b + 1) * c * h * wd];
                for gi in 0..g {
                    im2col(img, gi * cg, cg, h, wd, oh, ow, kh, kw, p, &mut col);
                    let dst = &mut os[(b * o + gi * og) * ohw..(b * o + (gi + 1) * og) * ohw];
                    sgemm(
                        og,
                        kk,
                        ohw,
                        &ws[gi * og * kk..],
                        kk as isize,
                        1,
                        &col,
                        ohw as isize,
                        1,
                        dst,
                        ohw as isize,
                        1,
                        0.0,
                    )?;
                }
                if let Some(bv) = &bs {
                    for oc in 0..o {
                        for v in &mut os[(b * o + oc) * ohw..(b * o + oc + 1) * ohw] {
                            *v += bv[oc];
                        }
                    }
                }
            }
            Ok(())
        })?;
        Ok(())
    }

    fn conv2d_backward_input(
        &self,
        gy: TRef,
        w: TRef,
        gx: TRef,
        p: &Conv2dParams,
        _ws: Workspace,
    ) -> Result<()> {
        let [n, c, h, wd] = dims4(gx.layout);
        let [o, cg, kh, kw] = dims4(w.layout);
        let [_, _, oh, ow] = dims4(gy.layout);
        let g = p.groups;
        let og = o / g;
        let gys = load(gy, None);
        let ws = load(w, None);
        let kk = cg * kh * kw;
        let ohw = oh * ow;
        let mut col = vec![0f32; kk * ohw];
        let mut gxs = vec![0f32; n * c * h * wd];
        for b in 0..n {
            for gi in 0..g {
                // col = w_g^T @ gy_g
                sgemm(
                    kk,
                    og,
                    ohw,
                    &ws[gi * og * kk..],
                    1,
                    kk as isize,
                    &gys[(b * o + gi * og) * ohw..],
                    ohw as isize,
                    1,
                    &mut col,
                    ohw as isize,
                    1,
                    0.0,
                )?;
                let img = &mut gxs[b * c * h * wd..(b + 1) * c * h * wd];
                col2im(&col, img, gi * cg, cg, h, wd, oh, ow, kh, kw, p);
            }
        }
        store(gx, &gxs);
        Ok(())
    }

    fn conv2d_backward_weight(
        &self,
        gy: TRef,
        x: TRef,
        gw: TRef,
        p: &Conv2dParams,
        _ws: Workspace,
    ) -> Result<()> {
        let [n, c, h, wd] = dims4(x.layout);
        let [o, cg, kh, kw] = dims4(gw.layout);
        let [_, _, oh, ow] = dims4(gy.layout);
        let g = p.groups;
        let og = o / g;
        let gys = load(gy, None);
        let xs = load(x, None);
        let kk = cg * kh * kw;
        let ohw = oh * ow;
        let mut col = vec![0f32; kk * ohw];
        let mut gws = vec![0f32; o * kk];
        for b in 0..n {
            let img = &xs[b * c * h * wd..(b + 1) * c * h * wd];
            for gi in 0..g {
                im2col(img, gi * cg, cg, h, wd, oh, ow, kh, kw, p, &mut col);
                // gw_g += gy_g @ col^T
                sgemm(
                    og,
                    ohw,
                    kk,
                    &gys[(b * o + gi * og) * ohw..],
                    ohw as isize,
                    1,
                    &col,
                    1,
                    ohw as isize,
                    &mut gws[gi * og * kk..],
                    kk as isize,
                    1,
                    1.0,
                )?;
            }
        }
        store(gw, &gws);
        Ok(())
    }

    fn max_pool2d(&self, x: TRef, out: TRef, indices: TRef, p: &Pool2dParams) -> Result<()> {
        let [n, c, h, w] = dims4(x.layout);
        let [_, _, oh, ow] = dims4(out.layout);
        let xs = load(x, None);
        let mut idx = vec![0f64; n * c * oh * ow];
        with_out(out, |os| {
            for pl in 0..n * c {
                let plane = &xs[pl * h * w..(pl + 1) * h * w];
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut best = f32::NEG_INFINITY;
                        let mut bi = -1i64;
                        for i in 0..p.kernel[0] {
                            let iy = (y * p.stride[0] + i * p.dilation[0]) as isize
                                - p.padding[0] as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for j in 0..p.kernel[1] {
                                let ix = (xo * p.stride[1] + j * p.dilation[1]) as isize
                                    - p.padding[1] as isize;
                                if ix < 0 || ix >= w as isize {
                                    continue;
                                }
                                let k = iy as usize * w + ix as usize;
                                let v = plane[k];
                                if v > best || v.is_nan() || bi < 0 {
                                    best = v;
                                    bi = k as i64;
                                }
                            }
                        }
                        let o = (pl * oh + y) * ow + xo;
                        os[o] = best;
                        idx[o] = bi as f64;
                    }
                }
            }
        });
        self.write_f64(indices, &idx)
    }

    fn max_pool2d_backward(&self, gy: TRef, indices: TRef, gx: TRef) -> Result<()> {
        let [n, c, h, w] = dims4(gx.layout);
        let [_, _, oh, ow] = dims4(gy.layout);
        let gys = load(gy, None);
        let idx = load_i64(indices);
        let mut gxs = load(gx, None).into_owned();
        for pl in 0..n * c {
            for k in 0..oh * ow {
                let o = pl * oh * ow + k;
                let i = check_index(idx[o], h * w, "max_pool2d_backward")?;
                gxs[pl * h * w + i] += gys[o];
            }
        }
        store(gx, &gxs);
        Ok(())
    }

    fn adaptive_avg_pool2d(&self, x: TRef, out: TRef) -> Result<()> {
        let [n, c, h, w] = dims4(x.layout);
        let [_, _, oh, ow] = dims4(out.layout);
        let xs = load(x, None);
        with_out(out, |os| {
            for pl in 0..n * c {
                for y in 0..oh {
                    let (y0, y1) = (y * h / oh, ((y + 1) * h).div_ceil(oh));
                    for xo in 0..ow {
                        let (x0, x1) = (xo * w / ow, ((xo + 1) * w).div_ceil(ow));
                        let mut s = 0f64;
                        for iy in y0..y1 {
                            for ix in x0..x1 {
                                s += xs[pl * h * w + iy * w + ix] as f64;
                            }
                        }
                        os[(pl * oh + y) * ow + xo] = (s / ((y1 - y0) * (x1 - x0)) as f64) as f32;
                    }
                }
            }
        });
        Ok(())
    }

    fn adaptive_avg_pool2d_backward(&self, gy: TRef, gx: TRef) -> Result<()> {
        let [n, c, h, w] = dims4(gx.layout);
        let [_, _, oh, ow] = dims4(gy.layout);
        let gys = load(gy, None);
        with_out(gx, |gs| {
            gs.fill(0.0);
            for pl in 0..n * c {
                for y in 0..oh {
                    let (y0, y1) = (y * h / oh, ((y + 1) * h).div_ceil(oh));
                    for xo in 0..ow {
                        let (x0, x1) = (xo * w / ow, ((xo + 1) * w).div_ceil(ow));
                        let g = gys[(pl * oh + y) * ow + xo] / ((y1 - y0) * (x1 - x0)) as f32;
                        for iy in y0..y1 {
                            for ix in x0..x1 {
                                gs[pl * h * w + iy * w + ix] += g;
                            }
                        }
                    }
                }
            }
        });
        Ok(())
    }

    fn batch_norm_train(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        running_mean: Option<TRef>,
        running_var: Option<TRef>,
        momentum: f64,
        eps: f64,
        out: TRef,
        save_mean: TRef,
        save_invstd: TRef,
    ) -> Result<()> {
        let (n, c) = (x.layout.shape[0], x.layout.shape[1]);
        let hw = x.layout.numel() / (n * c).max(1);
        let xs = load(x, None);
        let cnt = (n * hw) as f64;
        let mut mean = vec![0f64; c];
        let mut var = vec![0f64; c];
        for ch in 0..c {
            let mut s = 0.0;
            for b in 0..n {
                for v in &xs[(b * c + ch) * hw..(b * c + ch + 1) * hw] {
                    s += *v as f64;
                }
            }
            let m = s / cnt;
            let mut q = 0.0;
            for b in 0..n {
                for v in &xs[(b * c + ch) * hw..(b * c + ch + 1) * hw] {
                    q += (*v as f64 - m).powi(2);
                }
            }
            mean[ch] = m;
            var[ch] = q / cnt;
        }
        let invstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        let wv = weight.map(|t| load_f64(t));
        let bv = bias.map(|t| load_f64(t));
        with_out(out, |os| {
            for b in 0..n {
                for ch in 0..c {
                    let sc = invstd[ch] * wv.as_ref().map_or(1.0, |w| w[ch]);
                    let sh = bv.as_ref().map_or(0.0, |b| b[ch]);
                    let r = (b * c + ch) * hw..(b * c + ch + 1) * hw;
                    for (o, v) in os[r.clone()].iter_mut().zip(&xs[r]) {
                        *o = ((*v as f64 - mean[ch]) * sc + sh) as f32;
                    }
                }
            }
        });
        self.write_f64(save_mean, &mean)?;
        self.write_f64(save_invstd, &invstd)?;
        if let Some(rm) = running_mean {
            let old = load_f64(rm);
            let new: Vec<f64> = (0..c)
                .map(|i| (1.0 - momentum) * old[i] + momentum * mean[i])
                .collect();
            self.write_f64(rm, &new)?;
        }
        if let Some(rv) = running_var {
            let old = load_f64(rv);
            let unbias = if cnt > 1.0 { cnt / (cnt - 1.0) } else { 1.0 };
            let new: Vec<f64> = (0..c)
                .map(|i| (1.0 - momentum) * old[i] + momentum * var[i] * unbias)
                .collect();
            self.write_f64(rv, &new)?;
        }
        Ok(())
    }

    fn batch_norm_eval(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        running_mean: TRef,
        running_var: TRef,
        eps: f64,
        out: TRef,
    ) -> Result<()> {
        let (n, c) = (x.layout.shape[0], x.layout.shape[1]);
        let hw = x.layout.numel() / (n * c).max(1);
        let xs = load(x, None);
        let rm = load_f64(running_mean);
        let rv = load_f64(running_var);
        let wv = weight.map(|t| load_f64(t));
        let bv = bias.map(|t| load_f64(t));
        with_out(out, |os| {
            for b in 0..n {
                for ch in 0..c {
                    let sc = wv.as_ref().map_or(1.0, |w| w[ch]) / (rv[ch] + eps).sqrt();
                    let sh = bv.as_ref().map_or(0.0, |b| b[ch]) - rm[ch] * sc;
                    let r = (b * c + ch) * hw..(b * c + ch + 1) * hw;
                    for (o, v) in os[r.clone()].iter_mut().zip(&xs[r]) {
                        *o = (*v as f64 * sc + sh) as f32;
                    }
                }
            }
        });
        Ok(())
    }

    fn batch_norm_backward(
        &self,
        gy: TRef,
        x: TRef,
        weight: Option<TRef>,
        mean: TRef,
        invstd: TRef,
        train: bool,
        eps: f64,
        gx: Option<TRef>,
        gw: Option<TRef>,
        gb: Option<TRef>,
    ) -> Result<()> {
        let (n, c) = (x.layout.shape[0], x.layout.shape[1]);
        let hw = x.layout.numel() / (n * c).max(1);
        let xs = load(x, None);
        let gys = load(gy, None);
        let mean = load_f64(mean);
        // In eval mode the second statistic is the running variance.
        let invstd: Vec<f64> = if train {
            load_f64(invstd)
        } else {
            load_f64(invstd)
                .iter()
                .map(|v| 1.0 / (v + eps).sqrt())
                .collect()
        };
        let wv = weight.map(|t| load_f64(t));
        let cnt = (n * hw) as f64;
        let mut sum_g = vec![0f64; c];
        let mut sum_gx = vec![0f64; c];
        for b in 0..n {
            for ch in 0..c {
                let r = (b * c + ch) * hw..(b * c + ch + 1) * hw;
                for (g, v) in gys[r.clone()].iter().zip(&xs[r]) {
                    sum_g[ch] += *g as f64;
                    sum_gx[ch] += *g as f64 * (*v as f64 - mean[ch]) * invstd[ch];
                }
            }
        }
        if let Some(gx) = gx {
            with_out(gx, |os| {
                for b in 0..n {
                    for ch in 0..c {
                        let w = wv.as_ref().map_or(1.0, |w| w[ch]);
                        let r = (b * c + ch) * hw..(b * c + ch + 1) * hw;
                        for ((o, g), v) in os[r.clone()].iter_mut().zip(&gys[r.clone()]).zip(&xs[r])
                        {
                            let g = *g as f64;
                            *o = if train {
                                let xh = (*v as f64 - mean[ch]) * invstd[ch];
                                w * invstd[ch] * (g - sum_g[ch] / cnt - xh * sum_gx[ch] / cnt)
                            } else {
                                w * invstd[ch] * g
                            } as f32;
                        }
                    }
                }
            });
        }
        if let Some(gw) = gw {
            self.write_f64(gw, &sum_gx)?;
        }
        if let Some(gb) = gb {
            self.write_f64(gb, &sum_g)?;
        }
        Ok(())
    }

    fn layer_norm(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        eps: f64,
        out: TRef,
        mean: TRef,
        rstd: TRef,
    ) -> Result<()> {
        let rows = mean.layout.numel();
        let d = x.layout.numel() / rows.max(1);
        let xs = load(x, None);
        let wv = weight.map(|t| load(t, None).into_owned());
        let bv = bias.map(|t| load(t, None).into_owned());
        let mut ms = vec![0f64; rows];
        let mut rs = vec![0f64; rows];
        with_out(out, |os| {
            for r in 0..rows {
                let row = &xs[r * d..(r + 1) * d];
                let m = row.iter().map(|v| *v as f64).sum::<f64>() / d as f64;
                let var = row.iter().map(|v| (*v as f64 - m).powi(2)).sum::<f64>() / d as f64;
                let is = 1.0 / (var + eps).sqrt();
                ms[r] = m;
                rs[r] = is;
                for i in 0..d {
                    let mut v = (row[i] as f64 - m) * is;
                    if let Some(w) = &wv {
                        v *= w[i] as f64;
                    }
                    if let Some(b) = &bv {
                        v += b[i] as f64;
                    }
                    os[r * d + i] = v as f32;
                }
            }
        });
        self.write_f64(mean, &ms)?;
        self.write_f64(rstd, &rs)
    }

    fn layer_norm_backward(
        &self,
        gy: TRef,
        x: TRef,
        weight: Option<TRef>,
        mean: TRef,
        rstd: TRef,
        gx: Option<TRef>,
        gw: Option<TRef>,
        gb: Option<TRef>,
    ) -> Result<()> {
        let rows = mean.layout.numel();
        let d = x.layout.numel() / rows.max(1);
        let xs = load(x, None);
        let gys = load(gy, None);
        let ms = load_f64(mean);
        let rs = load_f64(rstd);
        let wv = weight.map(|t| load_f64(t));
        let mut gws = vec![0f64; d];
        let mut gbs = vec![0f64; d];
        let mut gxs = vec![0f32; if gx.is_some() { rows * d } else { 0 }];
        for r in 0..rows {
            let (m, is) = (ms[r], rs[r]);
            let mut s1 = 0.0;
            let mut s2 = 0.0;
            for i in 0..d {
                let xh = (xs[r * d + i] as f64 - m) * is;
                let g = gys[r * d + i] as f64;
                gws[i] += g * xh;
                gbs[i] += g;
                let gh = g * wv.as_ref().map_or(1.0, |w| w[i]);
                s1 += gh;
                s2 += gh * xh;
            }
            if gx.is_some() {
                for i in 0..d {
                    let xh = (xs[r * d + i] as f64 - m) * is;
                    let gh = gys[r * d + i] as f64 * wv.as_ref().map_or(1.0, |w| w[i]);
                    gxs[r * d + i] = (is * (gh - s1 / d as f64 - xh * s2 / d as f64)) as f32;
                }
            }
        }
        if let Some(gx) = gx {
            store(gx, &gxs);
        }
        if let Some(gw) = gw {
            self.write_f64(gw, &gws)?;
        }
        if let Some(gb) = gb {
            self.write_f64(gb, &gbs)?;
        }
        Ok(())
    }

    fn softmax(&self, x: TRef, dim: usize, log: bool, out: TRef) -> Result<()> {
        let sh = &x.layout.shape;
        let d = sh[dim];
        let inner: usize = sh[dim + 1..].iter().product();
        let outer: usize = sh[..dim].iter().product();
        let xs = load(x, Some(out));
        with_out(out, |os| {
            for o in 0..outer {
                for i in 0..inner {
                    let at = |k: usize| (o * d + k) * inner + i;
                    let mut mx = f32::NEG_INFINITY;
                    for k in 0..d {
                        mx = mx.max(xs[at(k)]);
                    }
                    let mut s = 0f64;
                    for k in 0..d {
                        s += ((xs[at(k)] - mx) as f64).exp();
                    }
                    for k in 0..d {
                        let z = (xs[at(k)] - mx) as f64;
                        os[at(k)] = if log { z - s.ln() } else { z.exp() / s } as f32;
                    }
                }
            }
        });
        Ok(())
    }

    fn softmax_backward(&self, gy: TRef, y: TRef, dim: usize, log: bool, gx: TRef) -> Result<()> {
        let sh = &y.layout.shape;
        let d = sh[dim];
        let inner: usize = sh[dim + 1..].iter().product();
        let outer: usize = sh[..dim].iter().product();
        let ys = load(y, Some(gx));
        let gys = load(gy, Some(gx));
        with_out(gx, |os| {
            for o in 0..outer {
                for i in 0..inner {
                    let at = |k: usize| (o * d + k) * inner + i;
                    if log {
                        let s: f64 = (0..d).map(|k| gys[at(k)] as f64).sum();
                        for k in 0..d {
                            os[at(k)] = (gys[at(k)] as f64 - (ys[at(k)] as f64).exp() * s) as f32;
                        }
                    } else {
                        let s: f64 = (0..d).map(|k| (gys[at(k)] * ys[at(k)]) as f64).sum();
                        for k in 0..d {
                            os[at(k)] = (ys[at(k)] as f64 * (gys[at(k)] as f64 - s)) as f32;
                        }
                    }
                }
            }
        });
        Ok(())
    }

    fn embedding(&self, weight: TRef, idx: TRef, out: TRef) -> Result<()> {
        let (v, d) = (weight.layout.shape[0], weight.layout.shape[1]);
        let ws = load(weight, None);
        let ids = load_i64(idx);
        let rows: Result<Vec<usize>> = ids
            .iter()
            .map(|&i| check_index(i, v, "embedding"))
            .collect();
        let rows = rows?;
        with_out(out, |os| {
            for (r, &row) in rows.iter().enumerate() {
                os[r * d..(r + 1) * d].copy_from_slice(&ws[row * d..(row + 1) * d]);
            }
        });
        Ok(())
    }

    fn embedding_backward(
        &self,
        gy: TRef,
        idx: TRef,
        gw: TRef,
        padding_idx: Option<i64>,
    ) -> Result<()> {
        let (v, d) = (gw.layout.shape[0], gw.layout.shape[1]);
        let gys = load(gy, None);
        let ids = load_i64(idx);
        let mut gws = load(gw, None).into_owned();
        for (r, &i) in ids.iter().enumerate() {
            if Some(i) == padding_idx {
                continue;
            }
            let row = check_index(i, v, "embedding_backward")?;
            for k in 0..d {
                gws[row * d + k] += gys[r * d + k];
            }
        }
        store(gw, &gws);
        Ok(())
    }

    fn dropout(&self, x: TRef, p: f64, seed: u64, out: TRef, mask: TRef) -> Result<()> {
        let xs = load(x, None);
        let mut rng = Rng::new(seed);
        let keep: Vec<bool> = (0..xs.len()).map(|_| rng.unit() >= p).collect();
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        with_out(out, |os| {
            for ((o, v), k) in os.iter_mut().zip(xs.iter()).zip(&keep) {
                *o = if *k { (*v as f64 * scale) as f32 } else { 0.0 };
            }
        });
        let m: Vec<f64> = keep.iter().map(|k| *k as u8 as f64).collect();
        self.write_f64(mask, &m)
    }

    fn nll_loss(
        &self,
        logp: TRef,
        target: TRef,
        mean: bool,
        ignore_index: i64,
        out: TRef,
        total_weight: TRef,
    ) -> Result<()> {
        let c = logp.layout.shape[1];
        let lp = load(logp, None);
        let t = load_i64(target);
        let mut s = 0f64;
        let mut cnt = 0f64;
        for (i, &ti) in t.iter().enumerate() {
            if ti == ignore_index {
                continue;
            }
            let k = check_index(ti, c, "nll_loss")?;
            s -= lp[i * c + k] as f64;
            cnt += 1.0;
        }
        let v = if mean { s / cnt } else { s };
        self.write_f64(out, &[v])?;
        self.write_f64(total_weight, &[cnt])
    }

    fn nll_loss_backward(
        &self,
        gy: TRef,
        target: TRef,
        total_weight: TRef,
        mean: bool,
        ignore_index: i64,
        gx: TRef,
    ) -> Result<()> {
        let c = gx.layout.shape[1];
        let g = load_f64(gy).first().copied().unwrap_or(0.0);
        let tw = load_f64(total_weight).first().copied().unwrap_or(1.0);
        let t = load_i64(target);
        let scale = if mean { g / tw } else { g };
        let mut gxs = load(gx, None).into_owned();
        for (i, &ti) in t.iter().enumerate() {
            if ti == ignore_index {
                continue;
            }
            let k = check_index(ti, c, "nll_loss_backward")?;
            gxs[i * c + k] = -scale as f32;
        }
        store(gx, &gxs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgemm_refuses_dimensions_past_its_buffers() {
        let a = [1f32; 4];
        let b = [1f32; 4];
        let mut c = [0f32; 4];
        // What a wrapped `intermediate_size` = 2^62 handed it: dims far past the buffers.
        let e = sgemm(2, 1 << 62, 2, &a, 2, 1, &b, 2, 1, &mut c, 2, 1, 0.0).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        assert!(sgemm(3, 2, 2, &a, 2, 1, &b, 2, 1, &mut c, 2, 1, 0.0).is_err());
        sgemm(2, 2, 2, &a, 2, 1, &b, 2, 1, &mut c, 2, 1, 0.0).unwrap();
        assert_eq!(c, [2.0; 4]);
        assert_eq!(span(usize::MAX, 2, 2, 1), None);
    }
}
