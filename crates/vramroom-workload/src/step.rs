//! The step: one request of a workload (an inference or a training step), run the way a
//! PyTorch loop runs it.
//!
//! Design note: a request is the loop body a PyTorch user writes, statement for statement,
//! on vramroom-tensor's runtime, so the allocator sees the request sequence PyTorch's would.
//! Inference workers share one model (threads of one server process share its weights);
//! training workers each own a replica and an optimizer (N training jobs in one process),
//! because concurrent backward passes into one set of `.grad`s would race, in PyTorch too.
//! Input sizes are drawn per request number (see `InputDist::draw`), so the same run on
//! meta and on cpu sees the same sizes in the same order.
//!
//! A Hugging Face model's request is transformers' loop: `model(input_ids=ids,
//! use_cache=...)` under `no_grad`, `model.generate(ids, max_new_tokens=N)` (the drawn size
//! is the prompt), or `model(input_ids=ids, labels=ids).loss` then backward and the
//! optimizer (AdamW's lr is transformers' Trainer default).

use std::sync::Arc;

use parking_lot::Mutex;

use vramroom_tensor::models::hf::{self, GenerateOptions};
use vramroom_tensor::optim::{Adam, Optimizer, Sgd};
use vramroom_tensor::{
    category_scope, enable_grad, no_grad, DType, Device, MemoryCategory, Tensor, TensorError,
};

use crate::error::{Result, WorkloadError};
use crate::net::Net;
use crate::spec::{AccumPattern, InputDist, Mode, ModelSpec, OptimKind, Scenario, ZooModel};

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
    let params = net.parameters();
    Ok(match (kind, net) {
        (OptimKind::Sgd, _) => Box::new(Sgd::new(params, 0.01, 0.9, 0.0)?),
        // transformers' Trainer default learning rate.
        (OptimKind::AdamW, Net::Hf(_)) => Box::new(Adam::adamw(params, 1e-4, 0.01)?),
        (OptimKind::AdamW, _) => Box::new(Adam::adamw(params, 1e-3, 0.01)?),
    })
}

impl Workload {
    /// Builds the model (and, for training, worker 0's optimizer) on `device`.
    pub fn build(scenario: &Scenario, device: &Device) -> Result<Workload> {
        scenario.validate()?;
        let mut net = {
            let _p = category_scope(MemoryCategory::Parameter);
            Net::build_for(
                &scenario.model,
                device,
                scenario.dtype,
                scenario.is_training(),
            )
            .map_err(WorkloadError::Setup)?
        };
        let (net, first_replica) = match &scenario.mode {
            Mode::Inference | Mode::Generate { .. } => {
                net.set_train(false);
                (Some(Arc::new(net)), None)
            }
            Mode::Training { optimizer, .. } => {
                net.set_train(true);
                let opt = make_optimizer(&net, *optimizer).map_err(WorkloadError::Setup)?;
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
            ModelSpec::Zoo(ZooModel::Mlp { sizes }) => {
                let inp = sizes.first().copied().unwrap_or(1);
                Ok((
                    Tensor::zeros(&[size, inp], sc.dtype, dev)?,
                    Tensor::zeros(&[size], DType::I64, dev)?,
                ))
            }
            ModelSpec::Zoo(ZooModel::ResNet18 { .. })
            | ModelSpec::Zoo(ZooModel::ResNet50 { .. }) => Ok((
                Tensor::zeros(&[rows, 3, size, size], sc.dtype, dev)?,
                Tensor::zeros(&[rows], DType::I64, dev)?,
            )),
            ModelSpec::Zoo(ZooModel::Gpt2(_)) => Ok((
                Tensor::zeros(&[rows, size], DType::I64, dev)?,
                Tensor::zeros(&[rows * size], DType::I64, dev)?,
            )),
            // transformers' labels are the ids themselves (shifted inside the loss).
            ModelSpec::Hf(_) => {
                let ids = Tensor::zeros(&[rows, size], DType::I64, dev)?;
                Ok((ids.clone(), ids))
            }
        }
    }

    /// Samples a request of this size processes.
    fn items(&self, size: usize) -> u64 {
        match self.scenario.model {
            ModelSpec::Zoo(ZooModel::Mlp { .. }) => size as u64,
            _ => self.scenario.batch as u64,
        }
    }

    /// The size drawn for request `request`. The MLP's variable dimension is its rows; a
    /// fixed MLP input uses `batch` rows.
    pub fn size_for(&self, request: u64) -> usize {
        let sc = &self.scenario;
        match (&sc.model, &sc.input) {
            (ModelSpec::Zoo(ZooModel::Mlp { .. }), InputDist::Fixed(_)) => sc.batch,
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
            Mode::Generate { new_tokens, cache } => {
                let Some(Net::Hf(model)) = self.net.as_deref() else {
                    return Err(TensorError::invalid(
                        "loadtest",
                        "generate needs a Hugging Face decoder",
                    ));
                };
                let (ids, _) = self.input(size, sc.batch)?;
                let mask = {
                    let _c = category_scope(MemoryCategory::Input);
                    Tensor::ones(ids.shape(), DType::I64, &self.device)?
                };
                let _g = no_grad();
                let out = hf::generate(
                    model,
                    &ids,
                    &mask,
                    &GenerateOptions {
                        max_new_tokens: *new_tokens,
                        min_new_tokens: None,
                        cache: *cache,
                    },
                )?;
                drop((ids, mask));
                self.device.backend().synchronize()?;
                if sc.mistakes.keep_outputs {
                    self.kept.lock().push(out);
                } else {
                    drop(out);
                }
                Ok(self.items(size))
            }
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
                let y = if matches!(net.as_ref(), Net::Hf(_)) {
                    net.hf_forward(&x, sc.use_cache, None)?.0
                } else {
                    net.forward(&x, sc.mistakes.named_temporaries)?
                };
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
                                Net::build_for(&sc.model, &self.device, sc.dtype, true)?
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
                        let (out, loss) = if matches!(net, Net::Hf(_)) {
                            // `model(input_ids=ids, labels=ids)`: the loss is computed inside.
                            let (out, loss) = net.hf_forward(&x, false, Some(&t))?;
                            let loss = loss.ok_or_else(|| {
                                TensorError::invalid("loadtest", "the model computed no loss")
                            })?;
                            (out, loss)
                        } else {
                            let out = net.forward(&x, sc.mistakes.named_temporaries)?;
                            let loss = net.loss(&out, &t)?;
                            (out, loss)
                        };
                        let loss = loss.div_scalar(n)?;
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
            e.contains("unknown model") && e.contains("zoo-gpt-tiny"),
            "{e}"
        );
    }
}
