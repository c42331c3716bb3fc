//! The zoo's prediction engine (`vramroom predict` reaches it through vramroom-workload's
//! `predict`, which parses the user's words; the words themselves, [`Mode`], [`OptimKind`]
//! and [`AccumPattern`], are [`crate::vocab`]'s, and the model is a
//! [`crate::models::ZooModel`] built as a [`crate::models::ZooNet`], one definition for both
//! crates): run a
//! model workload on the meta device and report its memory — the peak
//! allocated and reserved, the peak above what existed before the forward, the category
//! breakdown at the peak, and the allocator's `memory_stats` / `memory_summary`.
//!
//! Design note: the workload is the PyTorch loop people write, statement for statement:
//! model and optimizer built, inputs on the device, then (infer) one forward in eval mode
//! under `no_grad` or with grad on, or (train) `accum` micro-steps of forward, loss / N and
//! either `backward()` each micro-step or a summed loss with one `backward()`, then
//! `optimizer.step()` and `zero_grad(set_to_none=True)`. "Before the forward" is after the
//! model, the optimizer object and the inputs exist, and (`warm`, the default) after the
//! library handles an earlier iteration would have created (cuBLAS workspaces).
//! The meta device is [`Device::meta_caching`], so cuDNN and cuBLAS workspaces are
//! PyTorch's ([`crate::workspace::CudaLikeWorkspace`]).

use std::collections::BTreeMap;

use vramroom_alloc::AllocatorConfig;

use crate::autograd::{no_grad, set_grad_enabled};
use crate::device::{BlasThread, Device};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::models::ZooModel;
use crate::nn::Init;
use crate::optim::{Adam, Optimizer, Sgd};
use crate::tensor::Tensor;
pub use crate::vocab::{AccumPattern, Mode, OptimKind};

pub use crate::models::zoo::MLP_SIZES;

#[derive(Debug, Clone)]
pub struct PredictOptions {
    /// The model and its shape (MLP sizes, ResNet classes, GPT config).
    pub model: ZooModel,
    pub batch: usize,
    /// GPT-2 sequence length (ignored by the other models).
    pub seq: usize,
    /// Inference, or training with its optimizer, micro-steps and accumulation pattern
    /// (generation is not a zoo prediction).
    pub mode: Mode,
    /// Inference only: forward with grad on (activations kept) instead of `no_grad`.
    pub grad: bool,
    /// Optimizer steps to run (the second step is where SGD/Adam state already exists).
    pub steps: usize,
    pub dtype: DType,
    pub alloc_conf: AllocatorConfig,
    /// Simulated device capacity in bytes.
    pub capacity: u64,
    /// ResNet: image side (square images).
    pub image_side: usize,
    /// The workload has run before in this process (the default, and how the ground-truth
    /// figures were measured): the cuBLAS handle workspaces it uses already exist and count
    /// in `base_bytes`. `false`: the first iteration of a fresh process, whose first matmul
    /// on each thread allocates them inside the measured region.
    pub warm: bool,
}

/// Default capacity: large enough that no workload here OOMs unless a capacity is asked.
pub const UNBOUNDED: u64 = 1 << 44;

impl Default for PredictOptions {
    fn default() -> Self {
        PredictOptions {
            model: ZooModel::resnet50(),
            batch: 1,
            seq: 1024,
            mode: Mode::Inference,
            grad: false,
            steps: 1,
            dtype: DType::F32,
            alloc_conf: AllocatorConfig::default(),
            capacity: UNBOUNDED,
            image_side: 224,
            warm: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Prediction {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Peak minus what was allocated before the forward (model, optimizer, inputs).
    pub peak_over_input_bytes: u64,
    /// Allocated before the forward.
    pub base_bytes: u64,
    /// Bytes per category at the moment of the peak.
    pub categories: BTreeMap<&'static str, u64>,
    pub stats: BTreeMap<String, i64>,
    pub summary: String,
}

fn validate(o: &PredictOptions) -> Result<()> {
    let bad = |m: &str| Err(TensorError::invalid("predict", m.to_string()));
    if o.batch == 0 {
        return bad("batch must be at least 1");
    }
    match o.mode {
        Mode::Training { accum_steps: 0, .. } => return bad("accum must be at least 1"),
        Mode::Generate { .. } => return bad("generate is not a zoo prediction"),
        _ => {}
    }
    if o.capacity == 0 {
        return bad("capacity must be more than 0 bytes");
    }
    if let ZooModel::Gpt2(c) = &o.model {
        if o.seq == 0 || o.seq > c.n_positions {
            return Err(TensorError::invalid(
                "predict",
                format!("seq must be in 1..={}", c.n_positions),
            ));
        }
    }
    Ok(())
}

/// Runs the workload on a fresh meta device and measures it.
pub fn predict(o: &PredictOptions) -> Result<Prediction> {
    validate(o)?;
    let dev = Device::meta_caching(o.capacity, o.alloc_conf.clone());
    run(o, &dev)
}

/// Runs the workload on `dev` (any device: the cpu device runs it for real).
pub fn run(o: &PredictOptions, dev: &Device) -> Result<Prediction> {
    validate(o)?;
    let init = Init::new(dev, o.dtype);
    let mut net = o.model.build(&init)?;
    let size = match o.model {
        ZooModel::Gpt2(_) => o.seq,
        _ => o.image_side,
    };
    let (x, target) = o.model.inputs(o.batch, size, o.dtype, dev)?;
    match o.mode {
        Mode::Generate { .. } => Err(TensorError::invalid(
            "predict",
            "generate is not a zoo prediction".to_string(),
        )),
        Mode::Inference => {
            net.train(false);
            if o.warm {
                dev.init_blas_handle(BlasThread::Forward)?;
            }
            let base = dev.memory_allocated();
            dev.reset_peak_memory_stats();
            {
                let _g = if o.grad {
                    set_grad_enabled(true)
                } else {
                    no_grad()
                };
                let y = net.forward(&x)?;
                drop(y);
            }
            Ok(measure(dev, base))
        }
        Mode::Training {
            optimizer,
            accum_steps,
            pattern,
        } => {
            net.train(true);
            let params = net.parameters();
            let mut opt: Box<dyn Optimizer> = match optimizer {
                OptimKind::Sgd => Box::new(Sgd::new(params, 0.1, 0.9, 0.0)?),
                OptimKind::AdamW => Box::new(Adam::adamw(params, 1e-3, 0.01)?),
            };
            if o.warm {
                dev.init_blas_handle(BlasThread::Forward)?;
                dev.init_blas_handle(BlasThread::Backward)?;
            }
            let base = dev.memory_allocated();
            dev.reset_peak_memory_stats();
            let n = accum_steps as f64;
            for _ in 0..o.steps.max(1) {
                match pattern {
                    AccumPattern::Each => {
                        for _ in 0..accum_steps {
                            let loss = net.loss(&net.forward(&x)?, &target)?.div_scalar(n)?;
                            loss.backward()?;
                        }
                    }
                    AccumPattern::Sum => {
                        let mut total: Option<Tensor> = None;
                        for _ in 0..accum_steps {
                            let loss = net.loss(&net.forward(&x)?, &target)?.div_scalar(n)?;
                            total = Some(match total {
                                Some(t) => t.add(&loss)?,
                                None => loss,
                            });
                        }
                        if let Some(t) = total {
                            t.backward()?;
                        }
                    }
                }
                opt.step()?;
                opt.zero_grad(true)?;
            }
            Ok(measure(dev, base))
        }
    }
}

fn measure(dev: &Device, base: u64) -> Prediction {
    let stats = dev.allocator().memory_stats();
    let peak = dev.max_memory_allocated();
    let peak_reserved = stats
        .get("reserved_bytes.all.peak")
        .map(|&v| v.max(0) as u64)
        .unwrap_or_else(|| dev.memory_reserved());
    Prediction {
        peak_allocated_bytes: peak,
        peak_reserved_bytes: peak_reserved,
        peak_over_input_bytes: peak.saturating_sub(base),
        base_bytes: base,
        categories: dev.peak_memory_by_category().to_map(),
        summary: dev.allocator().memory_summary(false),
        stats,
    }
}

/// The largest batch that runs within `o.capacity` without OOM: doubling from 1, then
/// bisection between the last fit and the first failure. `None` when batch 1 does not fit.
/// `limit` bounds the search (a model whose memory does not grow with batch would
/// otherwise double forever).
pub fn max_batch(o: &PredictOptions, limit: usize) -> Result<Option<(usize, Prediction)>> {
    largest_fitting(
        limit,
        |b| {
            let mut oo = o.clone();
            oo.batch = b;
            predict(&oo)
        },
        TensorError::is_oom,
    )
}

/// The largest `b` in `1..=limit` for which `run(b)` does not run out of memory, assuming
/// what fits at `b` fits below it: doubling from 1, then bisection between the last fit
/// and the first OOM (`is_oom`). `None` when 1 does not fit; other errors end the search.
pub fn largest_fitting<P, E>(
    limit: usize,
    mut run: impl FnMut(usize) -> std::result::Result<P, E>,
    is_oom: impl Fn(&E) -> bool,
) -> std::result::Result<Option<(usize, P)>, E> {
    let mut try_b = |b: usize| -> std::result::Result<Option<P>, E> {
        match run(b) {
            Ok(p) => Ok(Some(p)),
            Err(e) if is_oom(&e) => Ok(None),
            Err(e) => Err(e),
        }
    };
    let Some(mut best) = try_b(1)? else {
        return Ok(None);
    };
    let (mut lo, mut hi) = (1usize, None::<usize>);
    while hi.is_none() && lo < limit {
        let b = (lo * 2).min(limit);
        match try_b(b)? {
            Some(p) => {
                lo = b;
                best = p;
            }
            None => hi = Some(b),
        }
    }
    if let Some(mut hi) = hi {
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match try_b(mid)? {
                Some(p) => {
                    lo = mid;
                    best = p;
                }
                None => hi = mid,
            }
        }
    }
    Ok(Some((lo, best)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fits_up_to(n: usize) -> impl FnMut(usize) -> Result<usize> {
        move |b| {
            if b <= n {
                Ok(b)
            } else {
                Err(TensorError::oom(format!("{b} does not fit")))
            }
        }
    }

    #[test]
    fn largest_fitting_finds_the_last_fit_below_the_limit() {
        for n in [1, 2, 3, 37, 64, 99] {
            let got = largest_fitting(100, fits_up_to(n), TensorError::is_oom).unwrap();
            assert_eq!(got, Some((n, n)), "fits up to {n}");
        }
        // Everything fits: the limit bounds the search.
        assert_eq!(
            largest_fitting(100, fits_up_to(1000), TensorError::is_oom).unwrap(),
            Some((100, 100))
        );
        assert_eq!(
            largest_fitting(100, fits_up_to(0), TensorError::is_oom).unwrap(),
            None
        );
        // Another error ends the search.
        let bad = |_: usize| -> Result<usize> { Err(TensorError::Interrupted) };
        assert!(largest_fitting(100, bad, TensorError::is_oom).is_err());
    }
}
