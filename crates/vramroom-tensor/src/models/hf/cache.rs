//! The KV caches of transformers 5.17: `DynamicCache` and `StaticCache`.
//!
//! Design note — `DynamicLayer.update` is `self.keys = torch.cat([self.keys, key_states],
//! dim=-2)` (and the same for values), starting from an empty tensor. So even the prefill
//! copies the layer's keys and values into fresh [B, H, T, D] tensors, and every decode step
//! allocates the grown [B, H, L+1, D] pair and frees the old one, layer by layer: the cache
//! never sits in one preallocated block, and at each layer's update the old and new copies
//! coexist. These tensors are part of a forward's output (`past_key_values`) and live as
//! long as the caller keeps the output, which is why `use_cache=True` (transformers'
//! default) costs memory even in a single forward. `StaticLayer` instead allocates zeros of
//! the full length at its first update and writes into them in place (`index_copy_`), with
//! a device-side length counter and a small `cache_position` tensor per update.

use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

/// `DynamicCache`: one growing (keys, values) pair per layer.
#[derive(Default)]
pub struct DynamicCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl DynamicCache {
    pub fn new(num_layers: usize) -> DynamicCache {
        DynamicCache {
            layers: vec![None; num_layers],
        }
    }
    /// Tokens held (layer 0's key length).
    pub fn seq_len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map(|(k, _)| k.shape()[2])
            .unwrap_or(0)
    }
    /// `update(key_states, value_states, layer_idx)`: the concatenations, returned.
    pub fn update(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| TensorError::invalid("DynamicCache", format!("no layer {layer}")))?;
        let (keys, values) = match slot.take() {
            // torch.cat([torch.tensor([]), key_states], dim=-2): a copy of key_states.
            None => {
                let keys = Tensor::cat(&[k], 2)?;
                (keys, Tensor::cat(&[v], 2)?)
            }
            Some((ok, ov)) => {
                let keys = Tensor::cat(&[&ok, k], 2)?;
                drop(ok);
                let values = Tensor::cat(&[&ov, v], 2)?;
                drop(ov);
                (keys, values)
            }
        };
        *slot = Some((keys.clone(), values.clone()));
        Ok((keys, values))
    }
    /// Every cached tensor (for accounting).
    pub fn tensors(&self) -> Vec<Tensor> {
        self.layers
            .iter()
            .flatten()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect()
    }
}

/// `StaticCache(max_cache_len)`: per layer, zeros of the full length, written in place.
pub struct StaticCache {
    layers: Vec<Option<(Tensor, Tensor, Tensor)>>,
    max_len: usize,
    filled: usize,
}

impl StaticCache {
    pub fn new(num_layers: usize, max_len: usize) -> StaticCache {
        StaticCache {
            layers: (0..num_layers).map(|_| None).collect(),
            max_len,
            filled: 0,
        }
    }
    pub fn max_len(&self) -> usize {
        self.max_len
    }
    /// Tokens written so far.
    pub fn seq_len(&self) -> usize {
        self.filled
    }
    /// `StaticLayer.update`: lazily the zeros (and the length counter), then the keys and
    /// values copied to their positions; returns the full-length tensors.
    pub fn update(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let _g = no_grad();
        let max_len = self.max_len;
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| TensorError::invalid("StaticCache", format!("no layer {layer}")))?;
        if slot.is_none() {
            let (b, h) = (k.shape()[0], k.shape()[1]);
            let keys = Tensor::zeros(&[b, h, max_len, k.shape()[3]], k.dtype(), k.device())?;
            let values = Tensor::zeros(&[b, h, max_len, v.shape()[3]], v.dtype(), v.device())?;
            // cumulative_length.to(device)
            let counter = Tensor::zeros(&[], DType::I64, k.device())?;
            *slot = Some((keys, values, counter));
        }
        let Some((keys, values, _)) = slot.as_ref() else {
            return Err(TensorError::invalid("StaticCache", "uninitialised layer"));
        };
        let t = k.shape()[2];
        let start = if layer == 0 {
            self.filled
        } else {
            self.filled - t
        };
        if start + t > max_len {
            return Err(TensorError::invalid(
                "StaticCache",
                format!("{} tokens do not fit a cache of {max_len}", start + t),
            ));
        }
        // cache_position = torch.arange(kv_length) + self.cumulative_length
        let ar = Tensor::empty(&[t], DType::I64, k.device())?;
        let pos = Tensor::empty(&[t], DType::I64, k.device())?;
        drop(ar);
        keys.narrow(2, start, t)?.copy_(k)?;
        values.narrow(2, start, t)?.copy_(v)?;
        drop(pos);
        if layer == 0 {
            self.filled += t;
        }
        Ok((keys.clone(), values.clone()))
    }
    pub fn tensors(&self) -> Vec<Tensor> {
        self.layers
            .iter()
            .flatten()
            .flat_map(|(k, v, c)| [k.clone(), v.clone(), c.clone()])
            .collect()
    }
}

/// The cache a decoder forward runs with.
pub enum Cache {
    Dynamic(DynamicCache),
    Static(StaticCache),
}

impl Cache {
    pub fn seq_len(&self) -> usize {
        match self {
            Cache::Dynamic(c) => c.seq_len(),
            Cache::Static(c) => c.seq_len(),
        }
    }
    pub fn update(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        match self {
            Cache::Dynamic(c) => c.update(layer, k, v),
            Cache::Static(c) => c.update(layer, k, v),
        }
    }
    /// The mask-relevant kind and fill, before this forward's tokens are added.
    pub(crate) fn kind(&self) -> super::masking::CacheKind {
        match self {
            Cache::Dynamic(_) => super::masking::CacheKind::Dynamic,
            Cache::Static(c) => super::masking::CacheKind::Static {
                past: c.seq_len(),
                max_len: c.max_len(),
            },
        }
    }
    pub fn tensors(&self) -> Vec<Tensor> {
        match self {
            Cache::Dynamic(c) => c.tensors(),
            Cache::Static(c) => c.tensors(),
        }
    }
}
