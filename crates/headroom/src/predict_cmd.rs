//! `headroom predict`: a model workload on the meta device, its peak memory and breakdown.

use std::process::ExitCode;

use clap::Args;

use crate::UserError;

#[derive(Args)]
pub struct PredictArgs {
    /// resnet50, resnet18, gpt2 or mlp.
    #[arg(long)]
    model: String,
}

pub fn predict(a: PredictArgs) -> Result<ExitCode, UserError> {
    Err(anyhow::anyhow!("predict: model {} not wired yet", a.model).into())
}
