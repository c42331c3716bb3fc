//! Models with PyTorch's layouts and state_dict names: an MLP, torchvision's ResNet-18 and
//! ResNet-50, and Hugging Face's GPT-2 (configurable size) — the zoo — and, in [`hf`],
//! Hugging Face models read from their `config.json` (GPT-2, Llama, Mistral, Qwen2, BERT)
//! as transformers 5.17 runs them.

pub mod gpt2;
pub mod hf;
pub mod mlp;
pub mod resnet;
pub mod zoo;

pub use gpt2::{Gpt2, Gpt2Config};
pub use mlp::Mlp;
pub use resnet::ResNet;
pub use zoo::{ZooModel, ZooNet, MLP_SIZES};
