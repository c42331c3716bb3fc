//! Model benchmarks on a GPU: milliseconds and peak memory of the workloads PyTorch's own
//! figures use (ground-truth.md), for `vramroom bench models` and scripts/gpu-check.sh.
//!
//! Design note: each case is measured the way the PyTorch side (scripts/torch_models_bench.py)
//! measures it, so the two columns compare like with like:
//! - the model is built fresh for the case; then the cache is emptied and the peaks reset;
//!   the peak therefore covers weights, input, activations, library workspaces and, for
//!   training, gradients and optimizer state;
//! - a few warm-up iterations (algorithm choice, workspace allocation, first segments), then
//!   `iters` timed iterations, each between two CUDA events on the device's stream; the
//!   figure is the median, in milliseconds of GPU time (which, for a launch-bound small
//!   batch, includes the gaps the host leaves between kernels);
//! - `+graph` cases capture one forward into a CUDA graph after the warm-up and time replays
//!   (`torch.cuda.CUDAGraph` on the other side).
//!
//! Beside each measurement the meta device predicts the case's peak allocation (no GPU),
//! which shows how well the prediction Vramroom makes everywhere else holds on real hardware.

use vramroom_alloc::AllocatorConfig;

use crate::autograd::no_grad;
use crate::cuda::CudaRuntime;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::models::{Gpt2, Gpt2Config, ResNet};
use crate::nn::{Init, Module};
use crate::ops;
use crate::optim::{Optimizer, Sgd};
use crate::tensor::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchModel {
    Resnet50,
    /// GPT-2 124M.
    Gpt2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchMode {
    /// `no_grad`, eval mode, eager.
    Infer,
    /// As `Infer`, replayed from a CUDA graph.
    InferGraph,
    /// One SGD (momentum 0.9) training step: forward, cross-entropy, backward, step.
    Train,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchCase {
    pub model: BenchModel,
    pub dtype: DType,
    pub batch: usize,
    /// Sequence length (GPT-2) or image side (ResNet).
    pub seq: usize,
    pub mode: BenchMode,
}

impl BenchCase {
    /// The case's name, shared with the PyTorch script: `resnet50 fp32 bs32 train`,
    /// `gpt2 bf16 8x512 infer+graph`.
    pub fn name(&self) -> String {
        let dt = match self.dtype {
            DType::BF16 => "bf16",
            DType::F16 => "fp16",
            _ => "fp32",
        };
        let mode = match self.mode {
            BenchMode::Infer => "infer",
            BenchMode::InferGraph => "infer+graph",
            BenchMode::Train => "train",
        };
        match self.model {
            BenchModel::Resnet50 => format!("resnet50 {dt} bs{} {mode}", self.batch),
            BenchModel::Gpt2 => format!("gpt2 {dt} {}x{} {mode}", self.batch, self.seq),
        }
    }
    /// Items (images or sequences) per iteration.
    pub fn items(&self) -> usize {
        self.batch
    }
}

/// The cases of issue #5: ResNet-50 inference in fp32 and bf16 at batch 1, 8, 32 and 128
/// (eager, and with CUDA graphs), the ResNet-50 training step at batch 32, and GPT-2
/// inference at 1×128, 8×512 and 32×1024. `quick` keeps one of each kind.
pub fn standard_cases(quick: bool) -> Vec<BenchCase> {
    let mut v = Vec::new();
    let r = |dtype, batch, mode| BenchCase {
        model: BenchModel::Resnet50,
        dtype,
        batch,
        seq: 224,
        mode,
    };
    let g = |dtype, batch, seq, mode| BenchCase {
        model: BenchModel::Gpt2,
        dtype,
        batch,
        seq,
        mode,
    };
    if quick {
        v.push(r(DType::F32, 1, BenchMode::Infer));
        v.push(r(DType::F32, 1, BenchMode::InferGraph));
        v.push(r(DType::F32, 32, BenchMode::Train));
        v.push(g(DType::F32, 1, 128, BenchMode::Infer));
        return v;
    }
    for dt in [DType::F32, DType::BF16] {
        for bs in [1, 8, 32, 128] {
            v.push(r(dt, bs, BenchMode::Infer));
            v.push(r(dt, bs, BenchMode::InferGraph));
        }
    }
    v.push(r(DType::F32, 32, BenchMode::Train));
    for dt in [DType::F32, DType::BF16] {
        for (bs, seq) in [(1, 128), (8, 512), (32, 1024)] {
            v.push(g(dt, bs, seq, BenchMode::Infer));
            v.push(g(dt, bs, seq, BenchMode::InferGraph));
        }
    }
    v
}

#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    pub case: String,
    /// Median milliseconds per iteration (GPU time between CUDA events).
    pub ms: f64,
    pub ms_min: f64,
    pub iters: usize,
    /// Images or sequences per second at the median.
    pub items_per_s: f64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The meta device's prediction of `peak_allocated` (eager cases).
    pub predicted_peak_allocated: Option<u64>,
}

enum Built {
    Resnet(ResNet),
    Gpt2(Gpt2),
}

fn build(c: &BenchCase, d: &Device) -> Result<(Built, Tensor, Option<Tensor>)> {
    d.manual_seed(0);
    let init = Init::new(d, c.dtype);
    match c.model {
        BenchModel::Resnet50 => {
            let mut m = ResNet::resnet50(&init, 1000)?;
            m.train(c.mode == BenchMode::Train);
            let x = Tensor::randn(&[c.batch, 3, c.seq, c.seq], 0.0, 1.0, c.dtype, d)?;
            let y = if c.mode == BenchMode::Train {
                let labels: Vec<i64> = (0..c.batch as i64).map(|i| (i * 37) % 1000).collect();
                Some(Tensor::from_i64(&labels, &[c.batch], d)?)
            } else {
                None
            };
            Ok((Built::Resnet(m), x, y))
        }
        BenchModel::Gpt2 => {
            if c.mode == BenchMode::Train {
                return Err(TensorError::invalid(
                    "bench",
                    "GPT-2 training is not a benchmark case",
                ));
            }
            let mut m = Gpt2::new(&init, Gpt2Config::gpt2())?;
            m.train(false);
            let ids: Vec<i64> = (0..(c.batch * c.seq) as i64)
                .map(|i| (i * 7919) % 50257)
                .collect();
            let x = Tensor::from_i64(&ids, &[c.batch, c.seq], d)?;
            Ok((Built::Gpt2(m), x, None))
        }
    }
}

fn forward(m: &Built, x: &Tensor) -> Result<Tensor> {
    match m {
        Built::Resnet(r) => r.forward(x),
        Built::Gpt2(g) => g.forward(x),
    }
}

/// One step of the case (a forward under no_grad, or a training step).
fn step(m: &Built, x: &Tensor, y: Option<&Tensor>, opt: Option<&mut Sgd>) -> Result<()> {
    match (y, opt) {
        (Some(y), Some(opt)) => {
            opt.zero_grad(true)?;
            let loss = ops::cross_entropy(&forward(m, x)?, y)?;
            loss.backward()?;
            opt.step()
        }
        _ => {
            let _g = no_grad();
            forward(m, x).map(drop)
        }
    }
}

fn params(m: &Built) -> Vec<Tensor> {
    match m {
        Built::Resnet(r) => r.parameters(),
        Built::Gpt2(g) => g.parameters(),
    }
}

/// Peak allocation of the case on the meta device (a simulated H200 with PyTorch's measured
/// library workspaces).
pub fn predict_case(c: &BenchCase) -> Result<u64> {
    let d = Device::meta_caching(1 << 40, AllocatorConfig::default());
    let (m, x, y) = build(c, &d)?;
    let mut opt = match y {
        Some(_) => Some(Sgd::new(params(&m), 0.01, 0.9, 0.0)?),
        None => None,
    };
    d.empty_cache();
    d.reset_peak_memory_stats();
    for _ in 0..2 {
        step(&m, &x, y.as_ref(), opt.as_mut())?;
    }
    Ok(d.max_memory_allocated())
}

/// Measure one case on a GPU.
pub fn run_case(
    rt: &CudaRuntime,
    c: &BenchCase,
    warmup: usize,
    iters: usize,
) -> Result<BenchResult> {
    let d = &rt.device;
    let (m, x, y) = build(c, d)?;
    let mut opt = match y {
        Some(_) => Some(Sgd::new(params(&m), 0.01, 0.9, 0.0)?),
        None => None,
    };
    rt.synchronize()?;
    d.empty_cache();
    d.reset_peak_memory_stats();
    rt.allocator.reset_peak_memory_stats();
    for _ in 0..warmup.max(1) {
        step(&m, &x, y.as_ref(), opt.as_mut())?;
    }
    let mut times = Vec::with_capacity(iters);
    if c.mode == BenchMode::InferGraph {
        let _g = no_grad();
        let (graph, out) = rt.capture(|| forward(&m, &x))?;
        for _ in 0..warmup.max(1) {
            graph.replay()?;
        }
        for _ in 0..iters {
            times.push(rt.gpu.time_ms(|| graph.replay())? as f64);
        }
        rt.synchronize()?;
        drop(out);
    } else {
        for _ in 0..iters {
            times.push(rt.gpu.time_ms(|| step(&m, &x, y.as_ref(), opt.as_mut()))? as f64);
        }
    }
    rt.synchronize()?;
    let peak_allocated = rt.allocator.max_memory_allocated();
    let peak_reserved = rt.allocator.max_memory_reserved();
    drop((m, x, y, opt));
    d.empty_cache();
    times.sort_by(f64::total_cmp);
    let ms = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    Ok(BenchResult {
        case: c.name(),
        ms,
        ms_min: times.first().copied().unwrap_or(f64::NAN),
        iters,
        items_per_s: c.items() as f64 * 1000.0 / ms,
        peak_allocated,
        peak_reserved,
        predicted_peak_allocated: None,
    })
}
