//! The workload flags `predict` and `loadtest` share (serve takes `--model` and the cache
//! flags): collected as typed, parsed by `vramroom_workload::WorkloadFlags`.

use clap::Args;
use vramroom_workload::WorkloadFlags;

#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// mlp, mlp-small, mlp-tiny, resnet18, resnet50, gpt2 (transformers' GPT2LMHeadModel,
    /// its built-in config), zoo-gpt, zoo-gpt-small, zoo-gpt-tiny (the zoo's own GPT), or the
    /// path of a Hugging Face config.json (or of a folder holding one and, optionally,
    /// *.safetensors): families gpt2, llama, mistral, qwen2, bert. Default: zoo-gpt-small.
    #[arg(long)]
    model: Option<String>,
    /// Samples per request (per micro-batch in training). Default: 4.
    #[arg(long)]
    batch: Option<usize>,
    /// Input size per request: sequence length (gpt2, --model PATH; the prompt for
    /// generate), image side (resnet) or rows (mlp): `128`, `uniform:16..128`,
    /// `choice:32,64,128`.
    #[arg(long, visible_aliases = ["input", "prompt"], value_name = "DIST")]
    seq: Option<String>,
    /// infer, train, or generate (a Hugging Face decoder: prefill, then --new decode steps
    /// on the KV cache).
    #[arg(long)]
    mode: Option<String>,
    /// Generate: new tokens per request (default 32).
    #[arg(long = "new", value_name = "N")]
    new_tokens: Option<usize>,
    /// Generate: dynamic (transformers' DynamicCache, the default) or static.
    #[arg(long, value_name = "KIND")]
    cache: Option<String>,
    /// Hugging Face decoders: transformers' use_cache for a forward (default true).
    #[arg(long = "use-cache", value_name = "BOOL")]
    use_cache: Option<String>,
    /// Same as --use-cache false.
    #[arg(long = "no-cache", conflicts_with = "use_cache")]
    no_cache: bool,
    /// Training: sgd or adamw (default sgd for the zoo, adamw for --model PATH).
    #[arg(long)]
    optimizer: Option<String>,
    /// Training: micro-steps per optimizer step.
    #[arg(long)]
    accum: Option<usize>,
    /// Training: each (backward every micro-step) or sum.
    #[arg(long = "accum-pattern")]
    accum_pattern: Option<String>,
    /// float32 (f32), bfloat16 (bf16) or float16 (f16). Default: float32, or the
    /// config's torch_dtype for --model PATH.
    #[arg(long)]
    dtype: Option<String>,
    /// Seed of the input-size draws.
    #[arg(long)]
    seed: Option<u64>,
    /// Planted mistake: inference with autograd on (no `torch.no_grad()`).
    #[arg(long = "grad-on", alias = "grad")]
    grad_on: bool,
    /// Planted mistake: training sums the micro-steps' losses, then one backward.
    #[arg(long = "sum-losses")]
    sum_losses: bool,
    /// Planted mistake: every request's output is kept (a leak).
    #[arg(long = "keep-outputs")]
    keep_outputs: bool,
    /// Planted "mistake": named temporaries instead of chained calls (a myth: no effect).
    #[arg(long = "named-temporaries")]
    named_temporaries: bool,
}

impl WorkloadArgs {
    pub fn flags(&self) -> Result<WorkloadFlags, vramroom_workload::WorkloadError> {
        let use_cache = match (&self.use_cache, self.no_cache) {
            (_, true) => Some(false),
            (Some(s), false) => Some(vramroom_workload::flags::parse_bool("--use-cache", s)?),
            (None, false) => None,
        };
        Ok(WorkloadFlags {
            model: self.model.clone(),
            batch: self.batch,
            seq: self.seq.clone(),
            mode: self.mode.clone(),
            optimizer: self.optimizer.clone(),
            accum: self.accum,
            accum_pattern: self.accum_pattern.clone(),
            dtype: self.dtype.clone(),
            seed: self.seed,
            new_tokens: self.new_tokens,
            cache: self.cache.clone(),
            use_cache,
            grad_on: self.grad_on,
            sum_losses: self.sum_losses,
            keep_outputs: self.keep_outputs,
            named_temporaries: self.named_temporaries,
        })
    }
}
