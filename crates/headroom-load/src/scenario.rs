//! Scenarios: what one request does, with the known mistakes as switches.
//!
//! Design note: a request is the loop body a PyTorch user writes, statement for statement,
//! on headroom-tensor's runtime — so the allocator sees the request sequence PyTorch's would.
//! Inference workers share one model (threads of one server process share its weights);
//! training workers each own a replica and an optimizer (N training jobs in one process),
//! because concurrent backward passes into one set of `.grad`s would race, in PyTorch too.
//!
//! The variable dimension of a request is drawn from a seeded distribution keyed by the
//! request's sequence number, not by the worker or the clock, so the same run on meta and
//! on cpu sees the same input sizes in the same order.
//!
//! The planted mistakes:
//! - `grad_at_inference`: the forward runs with autograd on; every op saves its inputs for
//!   a backward that never comes, until the output is dropped.
//! - `sum_losses`: `total = total + loss / N` then one `backward()` — the graphs of all N
//!   micro-steps stay alive together.
//! - `keep_outputs`: every request's output is appended to a list that lives as long as the
//!   run (a leak; with grad on it also keeps each graph).
//! - `named_temporaries`: `h1 = f1(x); h2 = f2(h1); ...; return hn` — every intermediate
//!   stays alive until the request returns, as Python locals do, instead of dying as soon as
//!   the next layer has consumed it.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use parking_lot::Mutex;

use headroom_tensor::models::{Gpt2, Gpt2Config, Mlp, ResNet};
use headroom_tensor::nn::{Init, Module};
use headroom_tensor::optim::{Adam, Optimizer, Sgd};
use headroom_tensor::{
    category_scope, enable_grad, no_grad, ops, DType, Device, MemoryCategory, Tensor, TensorError,
};

use crate::error::{LoadError, Result};
use crate::results::{Mistakes, ScenarioInfo};

/// The model a scenario runs.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSpec {
    /// `nn.Sequential(Linear, ReLU, ..., Linear)` with these sizes `[in, hidden..., out]`.
    Mlp {
        sizes: Vec<usize>,
    },
    ResNet18 {
        classes: usize,
    },
    ResNet50 {
        classes: usize,
    },
    Gpt2(Gpt2Config),
}

/// Names accepted by [`ModelSpec::from_str`].
pub const MODEL_NAMES: [&str; 8] = [
    "mlp",
    "mlp-small",
    "mlp-tiny",
    "resnet18",
    "resnet50",
    "gpt2",
    "gpt2-small",
    "gpt2-tiny",
];

impl ModelSpec {
    /// A 4-layer GPT-2 of width 128: big enough to show variable-length behaviour, small
    /// enough for real compute on two cores.
    pub fn gpt2_small_config() -> Gpt2Config {
        Gpt2Config {
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
            vocab_size: 4096,
            n_positions: 256,
            dropout: 0.0,
            layer_norm_epsilon: 1e-5,
        }
    }
    pub fn name(&self) -> String {
        match self {
            ModelSpec::Mlp { sizes } if *sizes == [1024, 4096, 4096, 1000] => "mlp".into(),
            ModelSpec::Mlp { sizes } if *sizes == [256, 1024, 1024, 10] => "mlp-small".into(),
            ModelSpec::Mlp { sizes } if *sizes == [64, 128, 128, 10] => "mlp-tiny".into(),
            ModelSpec::Mlp { sizes } => format!(
                "mlp[{}]",
                sizes
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join("-")
            ),
            ModelSpec::ResNet18 { .. } => "resnet18".into(),
            ModelSpec::ResNet50 { .. } => "resnet50".into(),
            ModelSpec::Gpt2(c) if *c == Gpt2Config::gpt2() => "gpt2".into(),
            ModelSpec::Gpt2(c) if *c == Gpt2Config::tiny() => "gpt2-tiny".into(),
            ModelSpec::Gpt2(c) if *c == Self::gpt2_small_config() => "gpt2-small".into(),
            ModelSpec::Gpt2(c) => format!("gpt2[{}x{}]", c.n_layer, c.n_embd),
        }
    }
    /// What the drawn input size means for this model.
    pub fn size_dim(&self) -> &'static str {
        match self {
            ModelSpec::Mlp { .. } => "rows",
            ModelSpec::ResNet18 { .. } | ModelSpec::ResNet50 { .. } => "image_side",
            ModelSpec::Gpt2(_) => "seq_len",
        }
    }
}

impl FromStr for ModelSpec {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "mlp" => ModelSpec::Mlp {
                sizes: vec![1024, 4096, 4096, 1000],
            },
            "mlp-small" => ModelSpec::Mlp {
                sizes: vec![256, 1024, 1024, 10],
            },
            "mlp-tiny" => ModelSpec::Mlp {
                sizes: vec![64, 128, 128, 10],
            },
            "resnet18" => ModelSpec::ResNet18 { classes: 1000 },
            "resnet50" => ModelSpec::ResNet50 { classes: 1000 },
            "gpt2" => ModelSpec::Gpt2(Gpt2Config::gpt2()),
            "gpt2-small" => ModelSpec::Gpt2(ModelSpec::gpt2_small_config()),
            "gpt2-tiny" => ModelSpec::Gpt2(Gpt2Config::tiny()),
            other => {
                return Err(LoadError::Scenario(format!(
                    "unknown model {other:?} (expected one of {})",
                    MODEL_NAMES.join(", ")
                )))
            }
        })
    }
}

/// The distribution of a request's variable dimension (sequence length for GPT-2, image
/// side for ResNet, rows for the MLP).
#[derive(Debug, Clone, PartialEq)]
pub enum InputDist {
    Fixed(usize),
    /// Uniform over `lo..=hi`.
    Uniform {
        lo: usize,
        hi: usize,
    },
    /// One of these, uniformly.
    Choice(Vec<usize>),
}

impl InputDist {
    /// The size for request number `request` under `seed`: a pure function, so every device
    /// and every interleaving of workers sees the same sizes.
    pub fn draw(&self, seed: u64, request: u64) -> usize {
        let r = splitmix64(seed ^ request.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        match self {
            InputDist::Fixed(n) => *n,
            InputDist::Uniform { lo, hi } => {
                let span = (hi - lo + 1) as u64;
                lo + (r % span) as usize
            }
            InputDist::Choice(v) => v
                .get((r % v.len().max(1) as u64) as usize)
                .copied()
                .unwrap_or(1),
        }
    }
    pub fn max(&self) -> usize {
        match self {
            InputDist::Fixed(n) => *n,
            InputDist::Uniform { hi, .. } => *hi,
            InputDist::Choice(v) => v.iter().copied().max().unwrap_or(1),
        }
    }
    pub fn min(&self) -> usize {
        match self {
            InputDist::Fixed(n) => *n,
            InputDist::Uniform { lo, .. } => *lo,
            InputDist::Choice(v) => v.iter().copied().min().unwrap_or(1),
        }
    }
    pub fn is_fixed(&self) -> bool {
        self.min() == self.max()
    }
}

impl fmt::Display for InputDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputDist::Fixed(n) => write!(f, "fixed:{n}"),
            InputDist::Uniform { lo, hi } => write!(f, "uniform:{lo}..{hi}"),
            InputDist::Choice(v) => write!(
                f,
                "choice:{}",
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

impl FromStr for InputDist {
    type Err = LoadError;
    /// `128`, `fixed:128`, `uniform:16..128`, `choice:32,64,128`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |m: &str| {
            LoadError::Scenario(format!(
                "input size {s:?}: {m} (expected N, fixed:N, uniform:LO..HI or choice:A,B,...)"
            ))
        };
        let num = |t: &str| -> Result<usize> {
            match t.trim().parse::<usize>() {
                Ok(0) => Err(bad("sizes must be at least 1")),
                Ok(n) => Ok(n),
                Err(_) => Err(bad(&format!("{:?} is not a whole number", t.trim()))),
            }
        };
        let t = s.trim();
        let (kind, rest) = match t.split_once(':') {
            Some((k, r)) => (k.trim().to_ascii_lowercase(), r),
            None => ("fixed".to_string(), t),
        };
        match kind.as_str() {
            "fixed" => Ok(InputDist::Fixed(num(rest)?)),
            "uniform" => {
                let (lo, hi) = rest
                    .split_once("..")
                    .ok_or_else(|| bad("uniform needs LO..HI"))?;
                let (lo, hi) = (num(lo)?, num(hi.trim_start_matches('='))?);
                if lo > hi {
                    return Err(bad("LO must not exceed HI"));
                }
                Ok(InputDist::Uniform { lo, hi })
            }
            "choice" => {
                let v = rest.split(',').map(num).collect::<Result<Vec<_>>>()?;
                if v.is_empty() {
                    return Err(bad("choice needs at least one size"));
                }
                Ok(InputDist::Choice(v))
            }
            _ => Err(bad(&format!("unknown distribution {kind:?}"))),
        }
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimKind {
    Sgd,
    AdamW,
}

impl FromStr for OptimKind {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sgd" => Ok(OptimKind::Sgd),
            "adamw" => Ok(OptimKind::AdamW),
            o => Err(LoadError::Scenario(format!(
                "unknown optimizer {o:?} (expected sgd, adamw)"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccumPattern {
    /// `(loss / N).backward()` every micro-step.
    Each,
    /// Sum the losses, one backward: the planted mistake.
    Sum,
}

impl FromStr for AccumPattern {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "each" => Ok(AccumPattern::Each),
            "sum" => Ok(AccumPattern::Sum),
            o => Err(LoadError::Scenario(format!(
                "unknown accumulation pattern {o:?} (expected each, sum)"
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Inference,
    Training {
        optimizer: OptimKind,
        accum_steps: usize,
        /// `Sum` is the `sum_losses` mistake; [`Mistakes::sum_losses`] forces it too.
        pattern: AccumPattern,
    },
}

/// A workload: model, batch, input sizes, mode and planted mistakes.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub model: ModelSpec,
    /// Samples per request (ignored for the MLP when the drawn size gives the rows).
    pub batch: usize,
    pub input: InputDist,
    pub mode: Mode,
    pub mistakes: Mistakes,
    pub seed: u64,
    pub dtype: DType,
}

impl Default for Scenario {
    /// The default `headroom loadtest` workload: a small GPT-2 serving requests of variable
    /// length (16..=128 tokens, batch 4), clean. Variable length is what makes a caching
    /// allocator's reserved memory drift from its allocated memory, so the default run has
    /// something to show in the timeline and the what-if table.
    fn default() -> Self {
        Scenario {
            name: "default".into(),
            model: ModelSpec::Gpt2(ModelSpec::gpt2_small_config()),
            batch: 4,
            input: InputDist::Uniform { lo: 16, hi: 128 },
            mode: Mode::Inference,
            mistakes: Mistakes::default(),
            seed: 7,
            dtype: DType::F32,
        }
    }
}

impl Scenario {
    /// An inference scenario with a fixed size.
    pub fn inference(model: ModelSpec, batch: usize, input: InputDist) -> Scenario {
        Scenario {
            name: format!("{}-infer", model.name()),
            model,
            batch,
            input,
            ..Scenario::default()
        }
    }
    /// A training scenario.
    pub fn training(
        model: ModelSpec,
        batch: usize,
        input: InputDist,
        optimizer: OptimKind,
        accum_steps: usize,
        pattern: AccumPattern,
    ) -> Scenario {
        Scenario {
            name: format!("{}-train", model.name()),
            model,
            batch,
            input,
            mode: Mode::Training {
                optimizer,
                accum_steps,
                pattern,
            },
            ..Scenario::default()
        }
    }
    pub fn is_training(&self) -> bool {
        matches!(self.mode, Mode::Training { .. })
    }
    pub fn accum_steps(&self) -> usize {
        match self.mode {
            Mode::Training { accum_steps, .. } => accum_steps,
            Mode::Inference => 1,
        }
    }
    /// The accumulation pattern after the `sum_losses` switch is applied.
    pub fn effective_pattern(&self) -> Option<AccumPattern> {
        match self.mode {
            Mode::Training { pattern, .. } if self.mistakes.sum_losses => {
                let _ = pattern;
                Some(AccumPattern::Sum)
            }
            Mode::Training { pattern, .. } => Some(pattern),
            Mode::Inference => None,
        }
    }

    /// Checks the scenario before anything is built.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(LoadError::Scenario(m));
        if self.batch == 0 {
            return bad("batch must be at least 1".into());
        }
        if let Mode::Training { accum_steps, .. } = self.mode {
            if accum_steps == 0 {
                return bad("accumulation steps must be at least 1".into());
            }
        }
        match &self.model {
            ModelSpec::Mlp { sizes } => {
                if sizes.len() < 2 || sizes.contains(&0) {
                    return bad(format!("mlp sizes {sizes:?}: need at least two, none 0"));
                }
            }
            ModelSpec::Gpt2(c) => {
                if self.input.max() > c.n_positions {
                    return bad(format!(
                        "sequence length up to {} exceeds the model's n_positions {}",
                        self.input.max(),
                        c.n_positions
                    ));
                }
            }
            ModelSpec::ResNet18 { .. } | ModelSpec::ResNet50 { .. } => {
                if self.input.min() < 32 {
                    return bad(format!(
                        "image side {} is too small for a ResNet (need at least 32)",
                        self.input.min()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The plain-data description that goes into the result.
    pub fn info(&self) -> ScenarioInfo {
        let (kind, optimizer, accum_steps, accum_pattern) = match &self.mode {
            Mode::Inference => ("inference", None, None, None),
            Mode::Training {
                optimizer,
                accum_steps,
                ..
            } => (
                "training",
                Some(
                    match optimizer {
                        OptimKind::Sgd => "sgd",
                        OptimKind::AdamW => "adamw",
                    }
                    .to_string(),
                ),
                Some(*accum_steps),
                Some(
                    match self.effective_pattern() {
                        Some(AccumPattern::Sum) => "sum",
                        _ => "each",
                    }
                    .to_string(),
                ),
            ),
        };
        let input = format!(
            "{} {}{}",
            self.model.size_dim(),
            self.input,
            if self.input.is_fixed() {
                String::new()
            } else {
                format!(" (seed {})", self.seed)
            }
        );
        let m = self.mistakes;
        let mut planted = Vec::new();
        if m.grad_at_inference {
            planted.push("grad on at inference");
        }
        if m.sum_losses {
            planted.push("losses summed before backward");
        }
        if m.keep_outputs {
            planted.push("outputs kept");
        }
        if m.named_temporaries {
            planted.push("named temporaries");
        }
        let description = format!(
            "{} {} batch {}, {}{}{}",
            self.model.name(),
            kind,
            self.batch,
            input,
            match (&optimizer, accum_steps) {
                (Some(o), Some(n)) => format!(
                    ", {o}, {n} micro-steps ({})",
                    accum_pattern.as_deref().unwrap_or("each")
                ),
                _ => String::new(),
            },
            if planted.is_empty() {
                String::new()
            } else {
                format!("; planted: {}", planted.join(", "))
            }
        );
        ScenarioInfo {
            name: self.name.clone(),
            kind: kind.into(),
            model: self.model.name(),
            batch: self.batch,
            input,
            optimizer,
            accum_steps,
            accum_pattern,
            mistakes: self.mistakes,
            seed: self.seed,
            description,
        }
    }
}

/// A model built on a device.
pub enum Net {
    Mlp(Mlp),
    ResNet(ResNet),
    Gpt2(Gpt2),
}

impl Net {
    pub fn build(
        spec: &ModelSpec,
        dev: &Device,
        dtype: DType,
    ) -> std::result::Result<Net, TensorError> {
        let init = Init::new(dev, dtype);
        Ok(match spec {
            ModelSpec::Mlp { sizes } => Net::Mlp(Mlp::new(&init, sizes)?),
            ModelSpec::ResNet18 { classes } => Net::ResNet(ResNet::resnet18(&init, *classes)?),
            ModelSpec::ResNet50 { classes } => Net::ResNet(ResNet::resnet50(&init, *classes)?),
            ModelSpec::Gpt2(c) => Net::Gpt2(Gpt2::new(&init, *c)?),
        })
    }
    pub fn module(&self) -> &dyn Module {
        match self {
            Net::Mlp(m) => m,
            Net::ResNet(m) => m,
            Net::Gpt2(m) => m,
        }
    }
    pub fn set_train(&mut self, on: bool) {
        match self {
            Net::Mlp(m) => m.train(on),
            Net::ResNet(m) => m.train(on),
            Net::Gpt2(m) => m.train(on),
        }
    }
    /// The model's forward. With `named`, every intermediate (each layer's output for the
    /// MLP, each block's for ResNet and GPT-2) is kept in a local until the forward returns,
    /// as `h1 = ...; h2 = ...` in a Python function keeps them; otherwise each dies once the
    /// next layer has consumed it.
    pub fn forward(&self, x: &Tensor, named: bool) -> std::result::Result<Tensor, TensorError> {
        if !named {
            return match self {
                Net::Mlp(m) => m.forward(x),
                Net::ResNet(m) => m.forward(x),
                Net::Gpt2(m) => m.forward(x),
            };
        }
        let mut locals: Vec<Tensor> = Vec::new();
        let out = match self {
            Net::Mlp(m) => {
                let last = m.layers.len().saturating_sub(1);
                let mut h = x.clone();
                for (i, l) in m.layers.iter().enumerate() {
                    let z = l.forward(&h)?;
                    locals.push(h);
                    h = if i < last {
                        let a = z.relu()?;
                        locals.push(z);
                        a
                    } else {
                        z
                    };
                }
                h
            }
            Net::ResNet(m) => {
                let mut h = m.conv1.forward(x)?;
                locals.push(h.clone());
                h = m.bn1.forward(&h)?;
                locals.push(h.clone());
                h = h.relu()?;
                locals.push(h.clone());
                h = m.maxpool.forward(&h)?;
                for layer in &m.layers {
                    for b in layer {
                        locals.push(h.clone());
                        h = b.forward(&h)?;
                    }
                }
                locals.push(h.clone());
                h = m.avgpool.forward(&h)?.flatten(1, -1)?;
                m.fc.forward(&h)?
            }
            Net::Gpt2(m) => {
                let t = x.shape().get(1).copied().unwrap_or(0);
                let pos = {
                    let _c = category_scope(MemoryCategory::Input);
                    Tensor::arange(t, DType::I64, x.device())?.reshape(&[1, t])?
                };
                let tok = m.wte.forward(x)?;
                let pose = m.wpe.forward(&pos)?;
                let mut h = tok.add(&pose)?;
                locals.extend([pos, tok, pose]);
                h = m.drop.forward(&h)?;
                for block in &m.h {
                    locals.push(h.clone());
                    h = block.forward(&h)?;
                }
                locals.push(h.clone());
                h = m.ln_f.forward(&h)?;
                locals.push(h.clone());
                ops::linear(&h, &m.wte.weight, None)?
            }
        };
        drop(locals);
        Ok(out)
    }
    fn loss(&self, out: &Tensor, target: &Tensor) -> std::result::Result<Tensor, TensorError> {
        match self {
            Net::Gpt2(m) => m.loss(out, target),
            _ => ops::cross_entropy(out, target),
        }
    }
}

/// Everything a worker needs that is not shared.
pub struct WorkerState {
    /// Training: this worker's replica and optimizer (built on its first request).
    replica: Option<(Net, Box<dyn Optimizer + Send>)>,
}

impl WorkerState {
    pub fn new() -> WorkerState {
        WorkerState { replica: None }
    }
}

impl Default for WorkerState {
    fn default() -> Self {
        WorkerState::new()
    }
}

/// A scenario built on a device: the shared model and the kept-outputs list.
pub struct Workload {
    pub scenario: Scenario,
    pub device: Device,
    /// Inference: the shared model (training workers use replicas instead).
    net: Option<Arc<Net>>,
    /// Training: the first worker takes the setup replica (so the baseline holds one model
    /// and its optimizer); later workers build their own.
    first_replica: Mutex<Option<(Net, Box<dyn Optimizer + Send>)>>,
    /// The `keep_outputs` leak: outputs of every request.
    kept: Mutex<Vec<Tensor>>,
}

// Compile-time check that the model can be shared by worker threads.
#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<Net>();
    f::<Tensor>();
}

fn make_optimizer(
    net: &Net,
    kind: OptimKind,
) -> std::result::Result<Box<dyn Optimizer + Send>, TensorError> {
    let params = net.module().parameters();
    Ok(match kind {
        OptimKind::Sgd => Box::new(Sgd::new(params, 0.01, 0.9, 0.0)?),
        OptimKind::AdamW => Box::new(Adam::adamw(params, 1e-3, 0.01)?),
    })
}

impl Workload {
    /// Builds the model (and, for training, worker 0's optimizer) on `device`.
    pub fn build(scenario: &Scenario, device: &Device) -> Result<Workload> {
        scenario.validate()?;
        let mut net = {
            let _p = category_scope(MemoryCategory::Parameter);
            Net::build(&scenario.model, device, scenario.dtype).map_err(LoadError::Setup)?
        };
        let (net, first_replica) = match &scenario.mode {
            Mode::Inference => {
                net.set_train(false);
                (Some(Arc::new(net)), None)
            }
            Mode::Training { optimizer, .. } => {
                net.set_train(true);
                let opt = make_optimizer(&net, *optimizer).map_err(LoadError::Setup)?;
                (None, Some((net, opt)))
            }
        };
        Ok(Workload {
            scenario: scenario.clone(),
            device: device.clone(),
            net,
            first_replica: Mutex::new(first_replica),
            kept: Mutex::new(Vec::new()),
        })
    }

    /// Bytes of outputs kept by the `keep_outputs` leak (their storages' block sizes are in
    /// `memory_allocated` already; this is just the count).
    pub fn kept_outputs(&self) -> usize {
        self.kept.lock().len()
    }

    /// Drops the kept outputs and any training replicas' state that the workload holds.
    pub fn release(&self) {
        self.kept.lock().clear();
        *self.first_replica.lock() = None;
    }

    fn input(
        &self,
        size: usize,
        rows: usize,
    ) -> std::result::Result<(Tensor, Tensor), TensorError> {
        let dev = &self.device;
        let sc = &self.scenario;
        let _c = category_scope(MemoryCategory::Input);
        match &sc.model {
            ModelSpec::Mlp { sizes } => {
                let inp = sizes.first().copied().unwrap_or(1);
                Ok((
                    Tensor::zeros(&[size, inp], sc.dtype, dev)?,
                    Tensor::zeros(&[size], DType::I64, dev)?,
                ))
            }
            ModelSpec::ResNet18 { .. } | ModelSpec::ResNet50 { .. } => Ok((
                Tensor::zeros(&[rows, 3, size, size], sc.dtype, dev)?,
                Tensor::zeros(&[rows], DType::I64, dev)?,
            )),
            ModelSpec::Gpt2(_) => Ok((
                Tensor::zeros(&[rows, size], DType::I64, dev)?,
                Tensor::zeros(&[rows * size], DType::I64, dev)?,
            )),
        }
    }

    /// Samples a request of this size processes.
    fn items(&self, size: usize) -> u64 {
        match self.scenario.model {
            ModelSpec::Mlp { .. } => size as u64,
            _ => self.scenario.batch as u64,
        }
    }

    /// The size drawn for request `request`. The MLP's variable dimension is its rows; a
    /// fixed MLP input uses `batch` rows.
    pub fn size_for(&self, request: u64) -> usize {
        let sc = &self.scenario;
        match (&sc.model, &sc.input) {
            (ModelSpec::Mlp { .. }, InputDist::Fixed(_)) => sc.batch,
            _ => sc.input.draw(sc.seed, request),
        }
    }

    /// Runs request number `request` on the calling thread. Returns the samples processed.
    /// An error (OOM included) fails this request only: everything it allocated is freed
    /// as the error propagates, as when PyTorch raises inside a request handler.
    pub fn run_request(
        &self,
        state: &mut WorkerState,
        request: u64,
    ) -> std::result::Result<u64, TensorError> {
        let sc = &self.scenario;
        let size = self.size_for(request);
        match &sc.mode {
            Mode::Inference => {
                let (x, _t) = self.input(size, sc.batch)?;
                let _g = if sc.mistakes.grad_at_inference {
                    enable_grad()
                } else {
                    no_grad()
                };
                let Some(net) = self.net.as_ref() else {
                    return Err(TensorError::invalid(
                        "loadtest",
                        "inference without a model",
                    ));
                };
                let y = net.forward(&x, sc.mistakes.named_temporaries)?;
                // A service answers with the result: on a GPU the request ends when its
                // kernels have run (a no-op on cpu and meta).
                self.device.backend().synchronize()?;
                if sc.mistakes.keep_outputs {
                    self.kept.lock().push(y);
                } else {
                    drop(y);
                }
                Ok(self.items(size))
            }
            Mode::Training {
                optimizer,
                accum_steps,
                ..
            } => {
                if state.replica.is_none() {
                    let taken = self.first_replica.lock().take();
                    state.replica = match taken {
                        Some(r) => Some(r),
                        None => {
                            let mut net = {
                                let _p = category_scope(MemoryCategory::Parameter);
                                Net::build(&sc.model, &self.device, sc.dtype)?
                            };
                            net.set_train(true);
                            let opt = make_optimizer(&net, *optimizer)?;
                            Some((net, opt))
                        }
                    };
                }
                let Some((net, opt)) = state.replica.as_mut() else {
                    return Err(TensorError::invalid("loadtest", "no replica"));
                };
                let n = *accum_steps as f64;
                let pattern = sc.effective_pattern().unwrap_or(AccumPattern::Each);
                let mut total: Option<Tensor> = None;
                let mut items = 0;
                let result = (|| -> std::result::Result<(), TensorError> {
                    for k in 0..*accum_steps {
                        // Each micro-step draws its own size (a new batch from the loader).
                        let size = if k == 0 {
                            size
                        } else {
                            sc.input
                                .draw(sc.seed, request.wrapping_mul(1_000_003) + k as u64)
                        };
                        let (x, t) = self.input(size, sc.batch)?;
                        let out = net.forward(&x, sc.mistakes.named_temporaries)?;
                        let loss = net.loss(&out, &t)?.div_scalar(n)?;
                        if sc.mistakes.keep_outputs && k + 1 == *accum_steps {
                            // `outputs.append(out)`: the logits outlive the step (after
                            // backward they no longer hold saved tensors, only themselves).
                            self.kept.lock().push(out);
                        } else {
                            drop(out);
                        }
                        items += self.items(size);
                        match pattern {
                            AccumPattern::Each => loss.backward()?,
                            AccumPattern::Sum => {
                                total = Some(match total.take() {
                                    Some(tt) => tt.add(&loss)?,
                                    None => loss,
                                })
                            }
                        }
                    }
                    if let Some(tt) = total.take() {
                        tt.backward()?;
                    }
                    opt.step()?;
                    Ok(())
                })();
                // Whether or not the step finished, gradients are dropped as
                // `zero_grad(set_to_none=True)` would, so a failed request leaves no state.
                opt.zero_grad(true)?;
                result?;
                self.device.backend().synchronize()?;
                Ok(items)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_input_dists() {
        assert_eq!("64".parse::<InputDist>().unwrap(), InputDist::Fixed(64));
        assert_eq!(
            "uniform:16..128".parse::<InputDist>().unwrap(),
            InputDist::Uniform { lo: 16, hi: 128 }
        );
        assert_eq!(
            "choice:1,2".parse::<InputDist>().unwrap(),
            InputDist::Choice(vec![1, 2])
        );
        for bad in ["0", "uniform:9..3", "normal:3", "choice:", "x"] {
            assert!(bad.parse::<InputDist>().is_err(), "{bad}");
        }
    }

    #[test]
    fn draws_are_deterministic_and_in_range() {
        let d = InputDist::Uniform { lo: 16, hi: 128 };
        let a: Vec<usize> = (0..100).map(|i| d.draw(7, i)).collect();
        let b: Vec<usize> = (0..100).map(|i| d.draw(7, i)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|&x| (16..=128).contains(&x)));
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 30);
    }

    #[test]
    fn unknown_model_is_a_clear_error() {
        let e = "resnet9000".parse::<ModelSpec>().unwrap_err().to_string();
        assert!(
            e.contains("unknown model") && e.contains("gpt2-tiny"),
            "{e}"
        );
    }
}
