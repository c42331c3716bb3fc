//! The zoo's models as one vocabulary: [`ZooModel`] says which model (and its shape), and
//! [`ZooNet`] is that model built on a device.
//!
//! Design note: vramroom-workload's model spec holds a [`ZooModel`] as it is and builds a
//! [`ZooNet`], and the zoo's prediction ([`crate::predict`]) runs the same two, so a zoo
//! model is written down once, at this crate (data flows tensor → workload), with no
//! translation between two copies that could drift. The workload's named-temporaries
//! forward reaches into the built layers ([`ZooNet`]'s variants are public for that).

use crate::dtype::DType;
use crate::error::Result;
use crate::memory::{category_scope, MemoryCategory};
use crate::models::{Gpt2, Gpt2Config, Mlp, ResNet};
use crate::nn::{Init, Module};
use crate::ops;
use crate::tensor::Tensor;
use crate::Device;

/// MLP workload shape: `[1024] -> 4096 -> 4096 -> [1000]`.
pub const MLP_SIZES: [usize; 4] = [1024, 4096, 4096, 1000];

/// A zoo model and its shape.
#[derive(Debug, Clone, PartialEq)]
pub enum ZooModel {
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
    /// The zoo's own GPT (GPT-2's layer layout, written by hand): not transformers'
    /// `GPT2LMHeadModel`, whose forward keeps more (see vramroom-workload's model names).
    Gpt2(Gpt2Config),
}

impl ZooModel {
    pub fn mlp() -> ZooModel {
        ZooModel::Mlp {
            sizes: MLP_SIZES.to_vec(),
        }
    }
    pub fn resnet18() -> ZooModel {
        ZooModel::ResNet18 { classes: 1000 }
    }
    pub fn resnet50() -> ZooModel {
        ZooModel::ResNet50 { classes: 1000 }
    }
    pub fn gpt2() -> ZooModel {
        ZooModel::Gpt2(Gpt2Config::gpt2())
    }

    /// The model's weights on the device `init` names.
    pub fn build(&self, init: &Init) -> Result<ZooNet> {
        Ok(match self {
            ZooModel::Mlp { sizes } => ZooNet::Mlp(Mlp::new(init, sizes)?),
            ZooModel::ResNet18 { classes } => ZooNet::ResNet(ResNet::resnet18(init, *classes)?),
            ZooModel::ResNet50 { classes } => ZooNet::ResNet(ResNet::resnet50(init, *classes)?),
            ZooModel::Gpt2(c) => ZooNet::Gpt2(Gpt2::new(init, *c)?),
        })
    }

    /// A batch of `batch` inputs of size `size` (image side, sequence length; the MLP's
    /// rows are the batch) and its targets, zeros, in the input category.
    pub fn inputs(
        &self,
        batch: usize,
        size: usize,
        dtype: DType,
        dev: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let _c = category_scope(MemoryCategory::Input);
        let b = batch;
        Ok(match self {
            ZooModel::ResNet50 { .. } | ZooModel::ResNet18 { .. } => (
                Tensor::zeros(&[b, 3, size, size], dtype, dev)?,
                Tensor::zeros(&[b], DType::I64, dev)?,
            ),
            ZooModel::Gpt2(_) => (
                Tensor::zeros(&[b, size], DType::I64, dev)?,
                Tensor::zeros(&[b * size], DType::I64, dev)?,
            ),
            ZooModel::Mlp { sizes } => (
                Tensor::zeros(&[b, sizes.first().copied().unwrap_or(1)], dtype, dev)?,
                Tensor::zeros(&[b], DType::I64, dev)?,
            ),
        })
    }
}

/// A zoo model built on a device.
pub enum ZooNet {
    Mlp(Mlp),
    ResNet(ResNet),
    Gpt2(Gpt2),
}

impl ZooNet {
    pub fn module(&self) -> &dyn Module {
        match self {
            ZooNet::ResNet(m) => m,
            ZooNet::Gpt2(m) => m,
            ZooNet::Mlp(m) => m,
        }
    }
    /// `model.parameters()`.
    pub fn parameters(&self) -> Vec<Tensor> {
        self.module().parameters()
    }
    /// `model.train(on)`.
    pub fn train(&mut self, on: bool) {
        match self {
            ZooNet::ResNet(m) => m.train(on),
            ZooNet::Gpt2(m) => m.train(on),
            ZooNet::Mlp(m) => m.train(on),
        }
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            ZooNet::ResNet(m) => m.forward(x),
            ZooNet::Gpt2(m) => m.forward(x),
            ZooNet::Mlp(m) => m.forward(x),
        }
    }
    /// The training loss of an output: GPT's shifted language-model loss, else cross
    /// entropy over classes.
    pub fn loss(&self, out: &Tensor, target: &Tensor) -> Result<Tensor> {
        match self {
            ZooNet::Gpt2(m) => m.loss(out, target),
            _ => ops::cross_entropy(out, target),
        }
    }
}
