//! Host-side wrappers of the kernels in kernels.cu: argument checks, coalescing, grid sizes.
//!
//! Design note: each wrapper takes [`Strided`] views whose shapes the caller (the tensor
//! runtime's op layer) has already validated, and only adds what the kernel needs: element
//! counts, a coalesced copy of the views for elementwise kernels, the kernel variant (a block
//! per row for long rows, a thread per row for short ones), and the error word for kernels
//! that check indices.

use super::{kargs, Dt, Gpu, Strided, K};
use crate::driver::CudaError;

type R = Result<(), CudaError>;

/// `UnaryOp` codes of kernels.cu.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryCode {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    GeluTanh,
    Abs,
    Square,
    AddScalar(f64),
    MulScalar(f64),
    PowScalar(f64),
    Cos,
    Sin,
    /// `x * sigmoid(x)` (`F.silu`).
    Silu,
}

impl UnaryCode {
    fn code(self) -> (i32, f64) {
        match self {
            UnaryCode::Neg => (0, 0.0),
            UnaryCode::Exp => (1, 0.0),
            UnaryCode::Log => (2, 0.0),
            UnaryCode::Sqrt => (3, 0.0),
            UnaryCode::Rsqrt => (4, 0.0),
            UnaryCode::Tanh => (5, 0.0),
            UnaryCode::Sigmoid => (6, 0.0),
            UnaryCode::Relu => (7, 0.0),
            UnaryCode::Gelu => (8, 0.0),
            UnaryCode::GeluTanh => (9, 0.0),
            UnaryCode::Abs => (10, 0.0),
            UnaryCode::Square => (11, 0.0),
            UnaryCode::AddScalar(s) => (12, s),
            UnaryCode::MulScalar(s) => (13, s),
            UnaryCode::PowScalar(s) => (14, s),
            UnaryCode::Cos => (15, 0.0),
            UnaryCode::Sin => (16, 0.0),
            UnaryCode::Silu => (17, 0.0),
        }
    }
}

/// `BinaryOp` codes of kernels.cu.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BinaryCode {
    /// `a + alpha * b`.
    Add(f64),
    Sub,
    Mul,
    Div,
    Maximum,
    ThresholdBackward,
    GeluBackward,
    GeluTanhBackward,
    TanhBackward,
    SigmoidBackward,
    /// `a` the gradient, `b` the saved input of `silu`.
    SiluBackward,
}

impl BinaryCode {
    fn code(self) -> (i32, f64) {
        match self {
            BinaryCode::Add(a) => (0, a),
            BinaryCode::Sub => (1, 1.0),
            BinaryCode::Mul => (2, 1.0),
            BinaryCode::Div => (3, 1.0),
            BinaryCode::Maximum => (4, 1.0),
            BinaryCode::ThresholdBackward => (5, 1.0),
            BinaryCode::GeluBackward => (6, 1.0),
            BinaryCode::GeluTanhBackward => (7, 1.0),
            BinaryCode::TanhBackward => (8, 1.0),
            BinaryCode::SigmoidBackward => (9, 1.0),
            BinaryCode::SiluBackward => (10, 1.0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceCode {
    Sum = 0,
    Mean = 1,
    Max = 2,
    Min = 3,
    /// Index of the first maximum along the one reduced dim (an integer output).
    ArgMax = 4,
}

const BLOCK: u32 = 256;

/// Flags of the elementwise kernels: bit 0, every logical index fits in 32 bits; bit 1, the
/// views share one shape (coalesced together), so the index is decomposed once for all.
fn flags(views: &[Strided]) -> i32 {
    let n = views.first().map(|v| v.numel()).unwrap_or(0);
    let small = n < i32::MAX as i64
        && views
            .iter()
            .all(|v| v.dims().iter().all(|&d| d < i32::MAX as i64));
    let same = views
        .windows(2)
        .all(|w| w[0].ndim == w[1].ndim && w[0].dims() == w[1].dims());
    small as i32 | ((same as i32) << 1)
}

/// Elements per thread of the kernels' contiguous 16-byte vector paths (k_unary, k_binary):
/// 4 f32 or 8 bf16 when every view is 1-d, unit-stride and of one dtype; else 1. The grid is
/// sized by vectors, not elements: a grid of one thread per element left three blocks in
/// four (f32) with nothing to do, which cost more than the work on ResNet's bs1 tensors.
fn per_thread(views: &[Strided]) -> i64 {
    let Some(first) = views.first() else { return 1 };
    let flat = views
        .iter()
        .all(|v| v.ndim == 1 && v.strides[0] == 1 && v.dtype == first.dtype);
    match first.dtype {
        d if flat && d == Dt::F32 as i32 => 4,
        d if flat && d == Dt::BF16 as i32 => 8,
        _ => 1,
    }
}

/// Threads per block and 16-byte vectors per thread of k_unary_vec and k_binary_vec
/// (EW_BLOCK and EW_UNROLL of kernels.cu, whose indexing assumes them).
const EW_BLOCK: u32 = 256;
const EW_UNROLL: u64 = 4;

/// Elements and blocks of the contiguous elementwise kernels (k_unary_vec, k_binary_vec)
/// when every view (all of one numel: the callers check) is contiguous, of one float dtype,
/// and starts on a 16-byte boundary; `None` sends the call to the general kernels.
fn vec_path(views: &[Strided]) -> Option<(i64, u32)> {
    let first = views.first()?;
    let float = matches!(first.dt(), Dt::F32 | Dt::BF16 | Dt::F16);
    let ok = float
        && views
            .iter()
            .all(|v| v.dtype == first.dtype && v.is_contiguous() && v.addr().is_multiple_of(16));
    if !ok {
        return None;
    }
    let n = first.numel();
    let per = (16 / first.dt().size()) as u64;
    let vectors = (n.max(0) as u64) / per;
    let grid = vectors.div_ceil(EW_BLOCK as u64 * EW_UNROLL).max(1);
    (n > 0 && grid <= i32::MAX as u64).then_some((n, grid as u32))
}

/// Elements per 16-byte vector for k_embedding's row copy, when `w`'s rows and `out` allow
/// it (one dtype, unit inner stride, rows a whole number of vectors, 16-byte aligned row
/// starts); 0 for the element loop.
fn embedding_vec(w: &Strided, out: &Strided) -> i32 {
    let size = w.dt().size() as i64;
    let per = 16 / size;
    let ok = w.ndim == 2
        && w.dtype == out.dtype
        && out.is_contiguous()
        && w.strides[1] == 1
        && w.shape[1] % per == 0
        && (w.strides[0] * size) % 16 == 0
        && w.addr().is_multiple_of(16)
        && out.addr().is_multiple_of(16);
    if ok {
        per as i32
    } else {
        0
    }
}

/// Bare pointers to element 0 of `x` and `out`, and the dtype, for k_ln_vec: when both
/// (contiguous, one float dtype) start on 16-byte boundaries with rows a whole number of
/// vectors, the weight and bias are absent or contiguous in that dtype and aligned, and mean
/// and rstd are contiguous.
fn ln_vec_args(
    x: &Strided,
    w: &Strided,
    b: &Strided,
    out: &Strided,
    mean: &Strided,
    rstd: &Strided,
    d: i64,
) -> Option<(u64, u64, i32)> {
    let per = (16 / x.dt().size()) as i64;
    let aligned = |t: &Strided| t.addr().is_multiple_of(16);
    let param = |t: &Strided| {
        t.ptr == 0 || (t.dtype == x.dtype && t.numel() == d && t.is_contiguous() && aligned(t))
    };
    let ok = d % per == 0
        && aligned(x)
        && aligned(out)
        && param(w)
        && param(b)
        && mean.is_contiguous()
        && rstd.is_contiguous();
    ok.then(|| (x.addr(), out.addr(), x.dtype))
}

/// The grid of the warp-per-row kernels (softmax, layer norm): a warp per row, 8 rows to a
/// block of 256 threads; `None` past the grid's limit (the block-per-row kernels take over).
fn warp_rows_grid(rows: i64) -> Option<(u32, u32, u32)> {
    let grid = (rows.max(0) as u64).div_ceil(8);
    (grid <= i32::MAX as u64).then_some((grid as u32, 1, 1))
}

fn same_numel(op: &str, a: &Strided, b: &Strided) -> R {
    if a.numel() != b.numel() {
        return Err(CudaError::Invalid(format!(
            "{op}: element counts differ ({:?} vs {:?})",
            a.dims(),
            b.dims()
        )));
    }
    Ok(())
}

fn need_dims(op: &str, t: &Strided, n: i32) -> R {
    if t.ndim != n {
        return Err(CudaError::Invalid(format!(
            "{op}: expected a {n}-d tensor, got {:?}",
            t.dims()
        )));
    }
    Ok(())
}

/// A block size for a block-per-row kernel over rows of `d` elements.
fn row_block(d: i64) -> u32 {
    match d {
        ..=64 => 64,
        65..=256 => 128,
        257..=2048 => 256,
        _ => 512,
    }
}

/// The bytes `[first, end)` a view's elements lie in.
fn byte_span(t: &Strided) -> (u64, u64) {
    let size = t.dt().size() as u64;
    let last: i64 = (0..t.ndim as usize)
        .map(|d| (t.shape[d] - 1).max(0) * t.strides[d])
        .sum();
    (t.addr(), t.addr() + (last as u64 + 1) * size)
}

/// Where a split batch-norm kernel may keep `bytes` of partial results: the start of the
/// output's own storage, if the output is contiguous, 8-byte aligned, large enough and
/// apart from every input (absent ones have no address). The last launch overwrites it.
fn bn_scratch(out: &Strided, bytes: u64, inputs: &[&Strided]) -> Option<u64> {
    let (lo, hi) = byte_span(out);
    let fits = out.ptr != 0
        && out.is_contiguous()
        && lo % 8 == 0
        && hi - lo >= bytes
        && inputs.iter().all(|t| {
            let (a, b) = byte_span(t);
            t.ptr == 0 || b <= lo || a >= hi
        });
    fits.then_some(lo)
}

/// Threads of each block of the split batch-norm kernels.
const BN_SPLIT_BLOCK: u32 = 512;

/// Slices per channel for the split batch-norm kernels, for `c` channels of `cnt` elements
/// on `sms` SMs: enough blocks for 4 per SM, each slice at least 16 elements a thread
/// (8192). 1: a block per channel.
fn bn_slices(sms: i32, c: i64, cnt: i64) -> i64 {
    let want = 4 * sms.max(1) as i64;
    if c <= 0 || c >= want {
        return 1;
    }
    ((want + c - 1) / c)
        .min(cnt / (16 * BN_SPLIT_BLOCK as i64))
        .clamp(1, 65535)
}

impl Gpu {
    /// A split batch-norm kernel: a block per (channel, slice).
    fn launch_split(&self, k: K, c: i64, slices: i64, args: &mut [*mut std::ffi::c_void]) -> R {
        self.launch(
            k,
            (c as u32, slices as u32, 1),
            (BN_SPLIT_BLOCK, 1, 1),
            args,
        )
    }

    pub(super) fn launch1d(&self, k: K, n: i64, args: &mut [*mut std::ffi::c_void]) -> R {
        let g = self.grid_for(n, BLOCK);
        self.launch(k, (g, 1, 1), (BLOCK, 1, 1), args)
    }

    /// [`Self::launch1d`] for k_unary and k_binary: a thread per 16-byte vector when their
    /// contiguous path will take `views` ([`per_thread`]), else per element.
    fn launch_elementwise(
        &self,
        k: K,
        views: &[Strided],
        n: i64,
        args: &mut [*mut std::ffi::c_void],
    ) -> R {
        let per = per_thread(views);
        let g = self.grid_for((n + per - 1) / per, BLOCK);
        self.launch(k, (g, 1, 1), (BLOCK, 1, 1), args)
    }

    /// Every element of `out` set to `v`.
    pub fn fill(&self, out: &Strided, v: f64) -> R {
        let mut o = [*out];
        Strided::coalesce(&mut o);
        let n = o[0].numel();
        self.launch1d(K::Fill, n, &mut kargs![o[0], v, n])
    }

    /// `out[i] = start + i * step` in logical order.
    pub fn arange(&self, out: &Strided, start: f64, step: f64) -> R {
        let n = out.numel();
        self.launch1d(K::Arange, n, &mut kargs![*out, start, step, n])
    }

    /// A 2-d `out` [T, S]: `below` where column <= row, `above` elsewhere.
    pub fn tril_fill(&self, out: &Strided, below: f64, above: f64) -> R {
        let n = out.numel();
        let s = out.shape[1];
        self.launch1d(K::TrilFill, n, &mut kargs![*out, below, above, s, n])
    }

    /// Uniform in [lo, hi) from splitmix64(seed), element k drawing the k-th number.
    pub fn uniform(&self, out: &Strided, lo: f64, hi: f64, seed: u64) -> R {
        let n = out.numel();
        self.launch1d(K::Uniform, n, &mut kargs![*out, lo, hi, seed, n])
    }

    /// Normal(mean, sd) by Box-Muller on draws 2k and 2k+1.
    pub fn normal(&self, out: &Strided, mean: f64, sd: f64, seed: u64) -> R {
        let n = out.numel();
        self.launch1d(K::Normal, n, &mut kargs![*out, mean, sd, seed, n])
    }

    /// Strided copy with dtype conversion; same logical shape.
    pub fn copy(&self, src: &Strided, dst: &Strided) -> R {
        same_numel("copy", src, dst)?;
        let mut v = [*src, *dst];
        if src.dims() == dst.dims() {
            Strided::coalesce(&mut v);
        }
        // Same dtype, both contiguous: one memcpy.
        if v[0].dtype == v[1].dtype && v[0].is_contiguous() && v[1].is_contiguous() {
            let bytes = v[0].numel() as usize * v[0].dt().size();
            return self.copy_bytes(v[1].addr(), v[0].addr(), bytes);
        }
        let n = v[0].numel();
        let f = flags(&v);
        self.launch1d(K::Copy, n, &mut kargs![v[0], v[1], n, f])
    }

    pub fn unary(&self, op: UnaryCode, x: &Strided, out: &Strided) -> R {
        same_numel("unary", x, out)?;
        let (code, s) = op.code();
        let mut v = [*x, *out];
        if x.dims() == out.dims() {
            Strided::coalesce(&mut v);
        }
        if let Some((n, grid)) = vec_path(&v) {
            let (x, o, dt) = (v[0].addr(), v[1].addr(), v[0].dtype);
            return self.launch(
                K::UnaryVec,
                (grid, 1, 1),
                (EW_BLOCK, 1, 1),
                &mut kargs![code, s, x, o, n, dt],
            );
        }
        let n = v[0].numel();
        let f = flags(&v);
        self.launch_elementwise(K::Unary, &v, n, &mut kargs![code, s, v[0], v[1], n, f])
    }

    /// `a`, `b` already expanded to `out`'s shape (zero strides where broadcast).
    pub fn binary(&self, op: BinaryCode, a: &Strided, b: &Strided, out: &Strided) -> R {
        same_numel("binary", a, out)?;
        same_numel("binary", b, out)?;
        let (code, alpha) = op.code();
        let mut v = [*a, *b, *out];
        if a.dims() == out.dims() && b.dims() == out.dims() {
            Strided::coalesce(&mut v);
        }
        if let Some((n, grid)) = vec_path(&v) {
            let (a, b, o, dt) = (v[0].addr(), v[1].addr(), v[2].addr(), v[2].dtype);
            return self.launch(
                K::BinaryVec,
                (grid, 1, 1),
                (EW_BLOCK, 1, 1),
                &mut kargs![code, alpha, a, b, o, n, dt],
            );
        }
        let n = v[2].numel();
        let f = flags(&v);
        self.launch_elementwise(
            K::Binary,
            &v,
            n,
            &mut kargs![code, alpha, v[0], v[1], v[2], n, f],
        )
    }

    /// `out = mask ? value : x` (mask expanded to x's shape).
    pub fn masked_fill(&self, x: &Strided, mask: &Strided, value: f64, out: &Strided) -> R {
        same_numel("masked_fill", x, out)?;
        same_numel("masked_fill", mask, out)?;
        let mut v = [*x, *mask, *out];
        if x.dims() == out.dims() && mask.dims() == out.dims() {
            Strided::coalesce(&mut v);
        }
        let n = v[2].numel();
        let f = flags(&v);
        self.launch1d(K::MaskedFill, n, &mut kargs![v[0], v[1], value, v[2], n, f])
    }

    /// Reduce `x` over `dims`; `out` has x's shape with those dims set to 1.
    pub fn reduce(&self, op: ReduceCode, x: &Strided, dims: &[usize], out: &Strided) -> R {
        let nd = x.ndim as usize;
        if dims.iter().any(|&d| d >= nd) || out.ndim as usize != nd {
            return Err(CudaError::Invalid(format!(
                "reduce: dims {dims:?} of a {nd}-d tensor into {:?}",
                out.dims()
            )));
        }
        let mut xk = *x;
        let mut xr = Strided::none();
        xr.ptr = x.ptr;
        xr.dtype = x.dtype;
        let (mut kk, mut rr) = (0usize, 0usize);
        let mut ok = *out;
        ok.ndim = 0;
        for d in 0..nd {
            if dims.contains(&d) {
                xr.shape[rr] = x.shape[d];
                xr.strides[rr] = x.strides[d];
                rr += 1;
            } else {
                xk.shape[kk] = x.shape[d];
                xk.strides[kk] = x.strides[d];
                ok.shape[kk] = out.shape[d];
                ok.strides[kk] = out.strides[d];
                kk += 1;
            }
        }
        xk.ndim = kk as i32;
        xr.ndim = rr as i32;
        ok.ndim = kk as i32;
        for t in [&mut xk, &mut ok] {
            for d in t.ndim as usize..super::MAX_DIMS {
                t.shape[d] = 1;
                t.strides[d] = 0;
            }
        }
        {
            let mut v = [xk, ok];
            Strided::coalesce(&mut v);
            xk = v[0];
            ok = v[1];
            let mut r = [xr];
            Strided::coalesce(&mut r);
            xr = r[0];
            xr.offset = 0;
        }
        let nout = ok.numel();
        let nred = xr.numel();
        let code = op as i32;
        if op == ReduceCode::ArgMax {
            return self.launch1d(K::Argmax, nout, &mut kargs![xk, xr, ok, nout, nred]);
        }
        if nred >= 128 || nout < (self.sm_count() as i64) * 64 {
            let grid = (nout.clamp(1, 65535 * 8)) as u32;
            let block = row_block(nred);
            self.launch(
                K::ReduceBlock,
                (grid, 1, 1),
                (block, 1, 1),
                &mut kargs![code, xk, xr, ok, nout, nred],
            )
        } else {
            self.launch1d(
                K::ReduceThread,
                nout,
                &mut kargs![code, xk, xr, ok, nout, nred],
            )
        }
    }

    /// `out` (contiguous NCHW) `+= bias[c]`.
    pub fn bias_nchw(&self, out: &Strided, bias: &Strided) -> R {
        need_dims("conv2d bias", out, 4)?;
        let (c, hw) = (out.shape[1], out.shape[2] * out.shape[3]);
        let n = out.numel();
        self.launch1d(K::BiasNchw, n, &mut kargs![*out, *bias, c, hw, n])
    }

    /// Max pooling; `out` and `idx` contiguous `[N, C, OH, OW]`, `idx` i64 flat in the plane.
    #[allow(clippy::too_many_arguments)]
    pub fn max_pool2d(
        &self,
        x: &Strided,
        out: &Strided,
        idx: &Strided,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    ) -> R {
        need_dims("max_pool2d", x, 4)?;
        need_dims("max_pool2d", out, 4)?;
        let (c, h, w) = (x.shape[1], x.shape[2], x.shape[3]);
        let (oh, ow) = (out.shape[2], out.shape[3]);
        let n = out.numel();
        let i = |v: usize| v as i32;
        self.launch1d(
            K::MaxPool2d,
            n,
            &mut kargs![
                *x,
                *out,
                *idx,
                c,
                h,
                w,
                oh,
                ow,
                i(kernel[0]),
                i(kernel[1]),
                i(stride[0]),
                i(stride[1]),
                i(padding[0]),
                i(padding[1]),
                i(dilation[0]),
                i(dilation[1]),
                n
            ],
        )
    }

    /// `gx` (zero-filled, contiguous) gets `gy` scattered to the saved argmax positions.
    pub fn max_pool2d_backward(&self, gy: &Strided, idx: &Strided, gx: &Strided) -> R {
        need_dims("max_pool2d_backward", gx, 4)?;
        need_dims("max_pool2d_backward", gy, 4)?;
        let hw = gx.shape[2] * gx.shape[3];
        let ohw = gy.shape[2] * gy.shape[3];
        let n = gy.numel();
        let err = self.err_ptr();
        self.launch1d(
            K::MaxPool2dBwd,
            n,
            &mut kargs![*gy, *idx, *gx, hw, ohw, n, err],
        )
    }

    pub fn adaptive_avg_pool2d(&self, x: &Strided, out: &Strided) -> R {
        need_dims("adaptive_avg_pool2d", x, 4)?;
        need_dims("adaptive_avg_pool2d", out, 4)?;
        let (c, h, w) = (x.shape[1], x.shape[2], x.shape[3]);
        let (oh, ow) = (out.shape[2], out.shape[3]);
        let n = out.numel();
        self.launch1d(K::AdaptiveAvg, n, &mut kargs![*x, *out, c, h, w, oh, ow, n])
    }

    pub fn adaptive_avg_pool2d_backward(&self, gy: &Strided, gx: &Strided) -> R {
        need_dims("adaptive_avg_pool2d_backward", gx, 4)?;
        need_dims("adaptive_avg_pool2d_backward", gy, 4)?;
        let (c, h, w) = (gx.shape[1], gx.shape[2], gx.shape[3]);
        let (oh, ow) = (gy.shape[2], gy.shape[3]);
        let n = gx.numel();
        self.launch1d(
            K::AdaptiveAvgBwd,
            n,
            &mut kargs![*gy, *gx, c, h, w, oh, ow, n],
        )
    }

    fn nc_hw(x: &Strided) -> (i64, i64, i64) {
        let n = x.shape[0];
        let c = if x.ndim > 1 { x.shape[1] } else { 1 };
        let hw = x.numel() / (n * c).max(1);
        (n, c, hw)
    }

    /// Training batch norm over `[N, C, ...]`: batch statistics, running stats updated in
    /// place, `out` contiguous.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_train(
        &self,
        x: &Strided,
        w: &Strided,
        b: &Strided,
        rm: &Strided,
        rv: &Strided,
        momentum: f64,
        eps: f64,
        out: &Strided,
        save_mean: &Strided,
        save_invstd: &Strided,
    ) -> R {
        let (n, c, hw) = Self::nc_hw(x);
        let cnt = n * hw;
        let slices = bn_slices(self.sm_count(), c, cnt);
        let inputs = [x, w, b, rm, rv, save_mean, save_invstd];
        // Per slice three doubles: (n, mean, M2).
        if let Some(ws) =
            bn_scratch(out, (c * slices) as u64 * 3 * 8, &inputs).filter(|_| slices > 1)
        {
            self.launch_split(K::BnPartStats, c, slices, &mut kargs![*x, ws, n, c, hw])?;
            self.launch1d(
                K::BnFinStats,
                c,
                &mut kargs![
                    ws,
                    *rm,
                    *rv,
                    momentum,
                    eps,
                    *save_mean,
                    *save_invstd,
                    c,
                    slices,
                    cnt
                ],
            )?;
            return self.launch_split(
                K::BnApply,
                c,
                slices,
                &mut kargs![*x, *w, *b, *save_mean, *save_invstd, *out, n, c, hw],
            );
        }
        let block = row_block(cnt).max(256);
        self.launch(
            K::BnTrain,
            (c as u32, 1, 1),
            (block, 1, 1),
            &mut kargs![
                *x,
                *w,
                *b,
                *rm,
                *rv,
                momentum,
                eps,
                *out,
                *save_mean,
                *save_invstd,
                n,
                c,
                hw
            ],
        )
    }

    /// Eval batch norm; with `relu`, followed by ReLU (fused on the contiguous path).
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_eval(
        &self,
        x: &Strided,
        w: &Strided,
        b: &Strided,
        rm: &Strided,
        rv: &Strided,
        eps: f64,
        out: &Strided,
        relu: bool,
    ) -> R {
        let (n, c, hw) = Self::nc_hw(x);
        let planes = n * c;
        if x.is_contiguous() && out.is_contiguous() && planes > 0 && planes < i32::MAX as i64 {
            // Planes under 1024 elements (ResNet's 28x28 and smaller): a warp each, 8 to a
            // block; larger: a block each.
            // Few large planes (batch 1): each split over several blocks (grid.y), so the
            // whole GPU works (64 planes at bs1 were 64 blocks on 132 SMs).
            let warps = hw < 1024;
            let (grid, block) = if warps {
                ((planes as u64).div_ceil(8).min(1 << 20) as u32, 256)
            } else {
                (planes as u32, row_block(hw).min(256))
            };
            let want = 4 * self.sm_count().max(1) as i64;
            let split = if warps || planes >= want {
                1
            } else {
                let most = (hw / (block as i64 * 4)).max(1);
                ((want + planes - 1) / planes).clamp(1, most.min(65535)) as u32
            };
            let w_mode = warps as i32;
            let relu = relu as i32;
            return self.launch(
                K::BnEvalPlanes,
                (grid, split, 1),
                (block, 1, 1),
                &mut kargs![*x, *w, *b, *rm, *rv, eps, *out, c, hw, planes, w_mode, relu],
            );
        }
        let total = x.numel();
        self.launch1d(
            K::BnEval,
            total,
            &mut kargs![*x, *w, *b, *rm, *rv, eps, *out, c, hw, total],
        )?;
        if relu {
            self.unary(UnaryCode::Relu, out, out)?;
        }
        Ok(())
    }

    /// Batch-norm backward. Train: `mean`/`inv` are the saved batch stats; eval: the running
    /// mean and running variance. Absent outputs are [`Strided::none`].
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_backward(
        &self,
        gy: &Strided,
        x: &Strided,
        w: &Strided,
        mean: &Strided,
        inv: &Strided,
        train: bool,
        eps: f64,
        gx: &Strided,
        gw: &Strided,
        gb: &Strided,
    ) -> R {
        let (n, c, hw) = Self::nc_hw(x);
        let cnt = n * hw;
        // The split backward hands the channel sums from one launch to the next in gw and
        // gb, so it needs both, in f32 (a bf16 sum would cost gx its precision).
        let sums_fit = [gw, gb]
            .iter()
            .all(|t| t.ptr != 0 && t.dtype == Dt::F32 as i32);
        let slices = if train && sums_fit {
            bn_slices(self.sm_count(), c, cnt)
        } else {
            1
        };
        let inputs = [gy, x, w, mean, inv, gw, gb];
        // Per slice two doubles: (sum g, sum g * xhat).
        if let Some(ws) =
            bn_scratch(gx, (c * slices) as u64 * 2 * 8, &inputs).filter(|_| slices > 1)
        {
            self.launch_split(
                K::BnBwdPart,
                c,
                slices,
                &mut kargs![*gy, *x, *mean, *inv, ws, n, c, hw],
            )?;
            self.launch1d(K::BnBwdFin, c, &mut kargs![ws, *gw, *gb, c, slices])?;
            return self.launch_split(
                K::BnBwdApply,
                c,
                slices,
                &mut kargs![*gy, *x, *w, *mean, *inv, *gw, *gb, *gx, n, c, hw],
            );
        }
        let block = row_block(cnt).max(256);
        let tr = train as i32;
        self.launch(
            K::BnBwd,
            (c as u32, 1, 1),
            (block, 1, 1),
            &mut kargs![*gy, *x, *w, *mean, *inv, tr, eps, *gx, *gw, *gb, n, c, hw],
        )
    }

    /// Layer norm over rows of `x.numel() / rows` elements.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm(
        &self,
        x: &Strided,
        w: &Strided,
        b: &Strided,
        eps: f64,
        out: &Strided,
        mean: &Strided,
        rstd: &Strided,
    ) -> R {
        let rows = mean.numel();
        let d = x.numel() / rows.max(1);
        let mut v = [*x];
        Strided::coalesce(&mut v);
        let float = |dt: i32| [Dt::F32, Dt::BF16, Dt::F16].iter().any(|&f| f as i32 == dt);
        if d <= 1024
            && v[0].is_contiguous()
            && out.is_contiguous()
            && v[0].dtype == out.dtype
            && float(out.dtype)
            && w.ndim <= 1
            && b.ndim <= 1
        {
            if let Some(grid) = warp_rows_grid(rows) {
                if let Some((x, o, dt)) = ln_vec_args(&v[0], w, b, out, mean, rstd, d) {
                    return self.launch(
                        K::LnVec,
                        grid,
                        (256, 1, 1),
                        &mut kargs![x, *w, *b, eps, o, *mean, *rstd, rows, d, dt],
                    );
                }
                return self.launch(
                    K::LnWarp,
                    grid,
                    (256, 1, 1),
                    &mut kargs![v[0], *w, *b, eps, *out, *mean, *rstd, rows, d],
                );
            }
        }
        let grid = rows.clamp(1, 1 << 20) as u32;
        self.launch(
            K::Ln,
            (grid, 1, 1),
            (row_block(d), 1, 1),
            &mut kargs![v[0], *w, *b, eps, *out, *mean, *rstd, rows, d],
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_backward(
        &self,
        gy: &Strided,
        x: &Strided,
        w: &Strided,
        mean: &Strided,
        rstd: &Strided,
        gx: &Strided,
        gw: &Strided,
        gb: &Strided,
    ) -> R {
        let rows = mean.numel();
        let d = x.numel() / rows.max(1);
        let mut v = [*gy, *x];
        if gy.dims() == x.dims() {
            Strided::coalesce(&mut v);
        }
        if gx.ptr != 0 {
            let grid = rows.clamp(1, 1 << 20) as u32;
            self.launch(
                K::LnBwdGx,
                (grid, 1, 1),
                (row_block(d), 1, 1),
                &mut kargs![v[0], v[1], *w, *mean, *rstd, *gx, rows, d],
            )?;
        }
        if gw.ptr != 0 || gb.ptr != 0 {
            let grid = (d.max(1) as u64).div_ceil(32) as u32;
            self.launch(
                K::LnBwdGwb,
                (grid, 1, 1),
                (32, 8, 1),
                &mut kargs![v[0], v[1], *mean, *rstd, *gw, *gb, rows, d],
            )?;
        }
        Ok(())
    }

    /// Softmax (or log-softmax) over `dim` of `x`.
    pub fn softmax(&self, x: &Strided, dim: usize, log: bool, out: &Strided) -> R {
        let (outer, d, inner) = split_at_dim(x, dim)?;
        let lg = log as i32;
        let mut v = [*x, *out];
        Strided::coalesce(&mut v);
        if inner == 1 && d <= 1024 && v[0].is_contiguous() && v[1].is_contiguous() {
            // The row in registers.
            if let Some(grid) = warp_rows_grid(outer) {
                return self.launch(
                    K::SoftmaxWarp,
                    grid,
                    (256, 1, 1),
                    &mut kargs![v[0], v[1], lg, outer, d],
                );
            }
        }
        if inner == 1 {
            let rows = outer;
            let grid = rows.clamp(1, 1 << 20) as u32;
            self.launch(
                K::SoftmaxRows,
                (grid, 1, 1),
                (row_block(d), 1, 1),
                &mut kargs![v[0], v[1], lg, rows, d],
            )
        } else {
            self.launch1d(
                K::SoftmaxCols,
                outer * inner,
                &mut kargs![v[0], v[1], lg, outer, d, inner],
            )
        }
    }

    pub fn softmax_backward(
        &self,
        gy: &Strided,
        y: &Strided,
        dim: usize,
        log: bool,
        gx: &Strided,
    ) -> R {
        let (outer, d, inner) = split_at_dim(y, dim)?;
        let lg = log as i32;
        let mut v = [*gy, *y, *gx];
        if gy.dims() == y.dims() && gx.dims() == y.dims() {
            Strided::coalesce(&mut v);
        }
        if inner == 1 {
            let grid = outer.clamp(1, 1 << 20) as u32;
            self.launch(
                K::SoftmaxBwdRows,
                (grid, 1, 1),
                (row_block(d), 1, 1),
                &mut kargs![v[0], v[1], v[2], lg, outer, d],
            )
        } else {
            self.launch1d(
                K::SoftmaxBwdCols,
                outer * inner,
                &mut kargs![v[0], v[1], v[2], lg, outer, d, inner],
            )
        }
    }

    /// `out[i, :] = w[idx[i], :]`; `out` contiguous `[len(idx), D]`.
    pub fn embedding(&self, w: &Strided, idx: &Strided, out: &Strided) -> R {
        need_dims("embedding", w, 2)?;
        let (vocab, d) = (w.shape[0], w.shape[1]);
        let n = idx.numel() * d;
        let err = self.err_ptr();
        let vec = embedding_vec(w, out);
        let threads = if vec > 0 { n / vec as i64 } else { n };
        self.launch1d(
            K::Embedding,
            threads,
            &mut kargs![*w, *idx, *out, vocab, d, n, err, vec],
        )
    }

    /// `gw` (zero-filled, contiguous) accumulates rows of `gy`.
    pub fn embedding_backward(
        &self,
        gy: &Strided,
        idx: &Strided,
        gw: &Strided,
        padding_idx: Option<i64>,
    ) -> R {
        need_dims("embedding_backward", gw, 2)?;
        let (vocab, d) = (gw.shape[0], gw.shape[1]);
        let n = idx.numel() * d;
        let (pad, has) = (padding_idx.unwrap_or(0), padding_idx.is_some() as i32);
        let err = self.err_ptr();
        self.launch1d(
            K::EmbeddingBwd,
            n,
            &mut kargs![*gy, *idx, *gw, vocab, d, pad, has, n, err],
        )
    }

    /// Keep with probability 1-p (the cpu backend's generator), scale by 1/(1-p).
    pub fn dropout(&self, x: &Strided, p: f64, seed: u64, out: &Strided, mask: &Strided) -> R {
        let n = x.numel();
        self.launch1d(K::Dropout, n, &mut kargs![*x, p, seed, *out, *mask, n])
    }

    #[allow(clippy::too_many_arguments)]
    pub fn nll_loss(
        &self,
        logp: &Strided,
        target: &Strided,
        mean: bool,
        ignore_index: i64,
        out: &Strided,
        total_weight: &Strided,
    ) -> R {
        need_dims("nll_loss", logp, 2)?;
        let (n, c) = (logp.shape[0], logp.shape[1]);
        let m = mean as i32;
        let err = self.err_ptr();
        self.launch(
            K::Nll,
            (1, 1, 1),
            (256, 1, 1),
            &mut kargs![
                *logp,
                *target,
                m,
                ignore_index,
                *out,
                *total_weight,
                n,
                c,
                err
            ],
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn nll_loss_backward(
        &self,
        gy: &Strided,
        target: &Strided,
        total_weight: &Strided,
        mean: bool,
        ignore_index: i64,
        gx: &Strided,
    ) -> R {
        need_dims("nll_loss_backward", gx, 2)?;
        let (n, c) = (gx.shape[0], gx.shape[1]);
        let m = mean as i32;
        let err = self.err_ptr();
        self.launch1d(
            K::NllBwd,
            n,
            &mut kargs![*gy, *target, *total_weight, m, ignore_index, *gx, n, c, err],
        )
    }

    /// Host data (already in `dt`'s byte layout) into a contiguous view.
    pub fn upload(&self, out: &Strided, bytes: &[u8]) -> R {
        if !out.is_contiguous() {
            return Err(CudaError::Invalid(
                "upload needs a contiguous destination".into(),
            ));
        }
        self.write(out.addr(), bytes)
    }

    /// The elements of `x` in logical order, as raw bytes of its dtype (synchronises).
    pub fn download(&self, x: &Strided) -> Result<Vec<u8>, CudaError> {
        let es = x.dt().size();
        let n = x.numel().max(0) as usize;
        if n == 0 {
            self.synchronize()?;
            return Ok(Vec::new());
        }
        if x.is_contiguous() {
            let mut buf = vec![0u8; n * es];
            self.read(x.addr(), &mut buf)?;
            return Ok(buf);
        }
        // A strided view: fetch the span it covers and gather on the host.
        let span: i64 = (0..x.ndim as usize)
            .map(|d| (x.shape[d] - 1).max(0) * x.strides[d])
            .sum::<i64>()
            + 1;
        let mut raw = vec![0u8; span as usize * es];
        self.read(x.addr(), &mut raw)?;
        let mut out = Vec::with_capacity(n * es);
        let nd = x.ndim as usize;
        let mut idx = vec![0i64; nd];
        for _ in 0..n {
            let off: i64 = (0..nd).map(|d| idx[d] * x.strides[d]).sum();
            let at = off as usize * es;
            out.extend_from_slice(&raw[at..at + es]);
            for d in (0..nd).rev() {
                idx[d] += 1;
                if idx[d] < x.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }
}

fn split_at_dim(x: &Strided, dim: usize) -> Result<(i64, i64, i64), CudaError> {
    let nd = x.ndim as usize;
    if dim >= nd {
        return Err(CudaError::Invalid(format!(
            "softmax: dim {dim} of a {nd}-d tensor"
        )));
    }
    let outer: i64 = x.shape[..dim].iter().product();
    let inner: i64 = x.shape[dim + 1..nd].iter().product();
    Ok((outer, x.shape[dim], inner))
}

/// Bytes of `data` converted to `dt` (host-side, for [`Gpu::upload`]). Integer conversions
/// follow Rust's `as` (truncating, saturating), floats round to nearest even.
pub fn encode(data: &[f64], dt: Dt) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() * dt.size());
    for &v in data {
        match dt {
            Dt::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            Dt::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes()),
            Dt::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_bits().to_le_bytes()),
            Dt::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            Dt::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            Dt::U8 => out.push(v as u8),
            Dt::Bool => out.push((v != 0.0) as u8),
        }
    }
    out
}

/// The inverse of [`encode`]: raw bytes of `dt` as f64.
pub fn decode(bytes: &[u8], dt: Dt) -> Vec<f64> {
    let es = dt.size();
    bytes
        .chunks_exact(es)
        .map(|c| match dt {
            Dt::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            Dt::F16 => half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
            Dt::BF16 => half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
            Dt::I64 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64,
            Dt::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            Dt::U8 => c[0] as f64,
            Dt::Bool => (c[0] != 0) as u8 as f64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Top-level comma-separated items of `s` (which starts right after an opening bracket),
    /// up to the matching closing bracket.
    fn count_items(s: &str) -> usize {
        let (mut depth, mut items, mut any) = (0i32, 0usize, false);
        for ch in s.chars() {
            match ch {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' if depth == 0 => break,
                ')' | ']' | '}' => depth -= 1,
                ',' if depth == 0 => {
                    items += 1;
                    any = false;
                    continue;
                }
                c if !c.is_whitespace() => any = true,
                _ => {}
            }
            if ch != ',' && !ch.is_whitespace() {
                any = true;
            }
        }
        items + any as usize
    }

    /// Every launch in this file passes as many arguments as its kernel in kernels.cu has
    /// parameters (a mismatch makes the driver read past the argument array). The GPU checks
    /// this at run time too; this catches it on any machine.
    #[test]
    fn every_launch_matches_its_kernel_signature() {
        let cu = super::super::nvrtc::SOURCE;
        let params = |kernel: &str| -> usize {
            let at = super::super::nvrtc::kernel_params(kernel)
                .unwrap_or_else(|| panic!("{kernel} not in kernels.cu"));
            count_items(&cu[at..])
        };
        let src = include_str!("ops.rs");
        let src = &src[..src.find("#[cfg(test)]").unwrap_or(src.len())];
        let mut checked = 0;
        let mut rest = src;
        while let Some(i) = rest.find("K::") {
            let after = &rest[i + 3..];
            let ident: String = after.chars().take_while(|c| c.is_alphanumeric()).collect();
            let Some(j) = after.find("kargs![") else {
                break;
            };
            let (k, name) = super::super::KERNEL_NAMES
                .iter()
                .find(|(k, _)| format!("{k:?}") == ident)
                .unwrap_or_else(|| panic!("K::{ident} not in KERNEL_NAMES"));
            let _ = k;
            let args = count_items(&after[j + 7..]);
            assert_eq!(
                args,
                params(name),
                "K::{ident} ({name}) launched with {args} arguments"
            );
            checked += 1;
            rest = &after[j + 7..];
        }
        assert!(checked >= 25, "only {checked} launches found");
    }

    #[test]
    fn batch_norm_splits_only_few_channels_of_many_elements() {
        // ResNet-50 at bs32 on an H200 (132 SMs): 64 channels of 112x112 and 56x56 planes
        // split 9 ways, 256 of 56x56 3 ways, 1024 channels stay a block each.
        assert_eq!(bn_slices(132, 64, 32 * 112 * 112), 9);
        assert_eq!(bn_slices(132, 64, 32 * 56 * 56), 9);
        assert_eq!(bn_slices(132, 256, 32 * 56 * 56), 3);
        assert_eq!(bn_slices(132, 1024, 32 * 14 * 14), 1);
        // Small channels are not split below 8192 elements a slice.
        assert_eq!(bn_slices(132, 3, 16 * 32 * 40), 2);
        assert_eq!(bn_slices(132, 3, 8000), 1);
        assert_eq!(bn_slices(0, 0, 0), 1);
    }

    #[test]
    fn batch_norm_scratch_needs_a_separate_contiguous_aligned_output() {
        let v = |ptr: u64, shape: &[usize], strides: &[usize]| {
            Strided::new(ptr, Dt::F32, shape, strides, 0).unwrap()
        };
        let out = v(4096, &[2, 3, 4], &[12, 4, 1]);
        let x = v(1 << 20, &[2, 3, 4], &[12, 4, 1]);
        assert_eq!(bn_scratch(&out, 96, &[&x, &Strided::none()]), Some(4096));
        // Too small (96 bytes of storage), overlapping an input, strided, misaligned.
        assert_eq!(bn_scratch(&out, 97, &[&x]), None);
        assert_eq!(bn_scratch(&out, 8, &[&v(4096 + 92, &[1], &[1])]), None);
        assert_eq!(bn_scratch(&v(4096, &[2, 3, 4], &[1, 2, 6]), 8, &[&x]), None);
        assert_eq!(
            bn_scratch(&v(4100, &[2, 3, 4], &[12, 4, 1]), 8, &[&x]),
            None
        );
        // An input just past the end is apart.
        assert_eq!(
            bn_scratch(&out, 8, &[&v(4096 + 96, &[4], &[1])]),
            Some(4096)
        );
    }

    fn view(ptr: u64, dt: Dt, shape: &[usize], strides: &[usize], offset: usize) -> Strided {
        Strided::new(ptr, dt, shape, strides, offset).unwrap()
    }

    #[test]
    fn the_vector_elementwise_kernels_take_contiguous_aligned_float_views_only() {
        let flat = |ptr, dt, n: usize| view(ptr, dt, &[n], &[1], 0);
        // 100 bf16 elements: 12 vectors of 8 (the 4 left over are block 0's), one block.
        assert_eq!(
            vec_path(&[flat(4096, Dt::BF16, 100), flat(8192, Dt::BF16, 100)]),
            Some((100, 1))
        );
        // GPT-2's 32x1024x3072 bf16: 12.6 M vectors, 1024 per block.
        let n = 32 * 1024 * 3072;
        assert_eq!(
            vec_path(&[flat(0, Dt::BF16, n), flat(1 << 30, Dt::BF16, n)]),
            Some((n as i64, 12288))
        );
        assert_eq!(
            vec_path(&[flat(0, Dt::F32, 5), flat(64, Dt::F16, 5)]),
            None,
            "mixed dtypes"
        );
        assert_eq!(
            vec_path(&[flat(0, Dt::I64, 8), flat(64, Dt::I64, 8)]),
            None,
            "not a float"
        );
        assert_eq!(
            vec_path(&[flat(2, Dt::BF16, 8), flat(64, Dt::BF16, 8)]),
            None,
            "misaligned"
        );
        let offset = view(0, Dt::F32, &[8], &[1], 1);
        assert_eq!(
            vec_path(&[offset, flat(64, Dt::F32, 8)]),
            None,
            "offset off the boundary"
        );
        let broadcast = view(0, Dt::F32, &[4, 8], &[0, 1], 0);
        assert_eq!(
            vec_path(&[broadcast, view(64, Dt::F32, &[4, 8], &[8, 1], 0)]),
            None
        );
        assert_eq!(
            vec_path(&[flat(0, Dt::F32, 0), flat(64, Dt::F32, 0)]),
            None,
            "empty"
        );
    }

    #[test]
    fn layer_norm_takes_the_vector_kernel_when_rows_and_parameters_allow_it() {
        let x = view(0, Dt::BF16, &[4, 768], &[768, 1], 0);
        let out = view(1 << 20, Dt::BF16, &[4, 768], &[768, 1], 0);
        let (w, b) = (
            view(4096, Dt::BF16, &[768], &[1], 0),
            view(8192, Dt::BF16, &[768], &[1], 0),
        );
        let stat = view(1 << 21, Dt::F32, &[4, 1], &[1, 1], 0);
        let args =
            |x: &Strided, w: &Strided, b: &Strided| ln_vec_args(x, w, b, &out, &stat, &stat, 768);
        assert_eq!(args(&x, &w, &b), Some((0, 1 << 20, Dt::BF16 as i32)));
        assert!(
            args(&x, &Strided::none(), &Strided::none()).is_some(),
            "no affine parameters"
        );
        let w32 = view(4096, Dt::F32, &[768], &[1], 0);
        assert_eq!(
            args(&x, &w32, &b),
            None,
            "a weight in another dtype goes through ldf"
        );
        let strided_w = view(4096, Dt::BF16, &[768], &[2], 0);
        assert_eq!(args(&x, &strided_w, &b), None);
        let shifted_b = view(8192, Dt::BF16, &[768], &[1], 1);
        assert_eq!(
            args(&x, &w, &shifted_b),
            None,
            "bias off the 16-byte boundary"
        );
        let odd = view(0, Dt::BF16, &[4, 100], &[100, 1], 0);
        assert_eq!(
            ln_vec_args(&odd, &w, &b, &out, &stat, &stat, 100),
            None,
            "rows not whole vectors"
        );
    }

    #[test]
    fn embedding_copies_vectors_when_rows_allow_it() {
        let w = view(0, Dt::BF16, &[50257, 768], &[768, 1], 0);
        let out = view(1 << 30, Dt::BF16, &[8, 768], &[768, 1], 0);
        assert_eq!(embedding_vec(&w, &out), 8);
        assert_eq!(
            embedding_vec(
                &view(0, Dt::F32, &[10, 64], &[64, 1], 0),
                &view(4096, Dt::F32, &[3, 64], &[64, 1], 0)
            ),
            4
        );
        let out32 = view(1 << 30, Dt::F32, &[8, 768], &[768, 1], 0);
        assert_eq!(embedding_vec(&w, &out32), 0, "a conversion");
        let transposed = view(0, Dt::BF16, &[50257, 768], &[1, 50257], 0);
        assert_eq!(embedding_vec(&transposed, &out), 0);
        let odd_rows = view(0, Dt::BF16, &[10, 12], &[12, 1], 0);
        assert_eq!(
            embedding_vec(&odd_rows, &view(4096, Dt::BF16, &[2, 12], &[12, 1], 0)),
            0
        );
    }

    #[test]
    fn encode_decode_round_trip() {
        let data = [0.0, 1.5, -2.25, 3.0];
        for dt in [Dt::F32, Dt::F16, Dt::BF16, Dt::I64, Dt::I32] {
            let back = decode(&encode(&data, dt), dt);
            let want: Vec<f64> = if dt.is_float() {
                data.to_vec()
            } else {
                data.iter().map(|v| v.trunc()).collect()
            };
            assert_eq!(back, want, "{dt:?}");
        }
        assert_eq!(decode(&encode(&[0.0, 2.0], Dt::Bool), Dt::Bool), [0.0, 1.0]);
    }
}
