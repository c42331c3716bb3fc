//! A plain MLP as `nn.Sequential(Linear, ReLU, ..., Linear)`: names `net.0.weight`,
//! `net.2.weight`, ... (the ReLUs take the odd indices, as in a Sequential).

use crate::error::Result;
use crate::nn::{prefixed, Init, Linear, Module};
use crate::tensor::Tensor;

pub struct Mlp {
    pub layers: Vec<Linear>,
}

impl Mlp {
    /// `sizes`: `[in, hidden..., out]`; at least two entries.
    pub fn new(init: &Init, sizes: &[usize]) -> Result<Mlp> {
        let layers = sizes
            .windows(2)
            .map(|w| Linear::new(init, w[0], w[1], true))
            .collect::<Result<Vec<_>>>()?;
        Ok(Mlp { layers })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        let last = self.layers.len().saturating_sub(1);
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i < last {
                // Not in place, like `nn.ReLU()` default: ReLU saves its output.
                h = h.relu()?;
            }
        }
        Ok(h)
    }
}

impl Module for Mlp {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| prefixed(&format!("net.{}", 2 * i), l.named_parameters()))
            .collect()
    }
}
