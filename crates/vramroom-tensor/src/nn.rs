//! Layers: a `Module` trait with PyTorch's state_dict names, and the layers the models use.
//!
//! Design note: a module owns its parameters as `Tensor` handles (leaf tensors that require
//! grad, tagged `parameter`) and its buffers (BatchNorm running stats, tagged `parameter`
//! too: they are model state, not activations). `named_parameters()` and `named_buffers()`
//! return them in PyTorch's registration order, which is also the order an optimizer sees
//! them, so optimizer state is allocated in PyTorch's order. Forward methods mirror the
//! PyTorch module's `forward` statement by statement, because the order in which
//! intermediates are created and dropped *is* the memory profile.

use crate::autograd::no_grad;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::memory::{category_scope, MemoryCategory};
use crate::ops::{self, Conv2dParams, Pool2dParams};
use crate::tensor::Tensor;

/// A layer or model. Names follow `torch.nn.Module.state_dict()`.
pub trait Module {
    /// Trainable parameters with their dotted names, in registration order.
    fn named_parameters(&self) -> Vec<(String, Tensor)>;
    /// Non-trainable state (running stats) with dotted names.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// `model.train(on)` / `model.eval()`: BatchNorm and Dropout behaviour.
    fn train(&mut self, _on: bool) {}
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }
    /// Parameters then buffers, as the state_dict holds them (ordering within each kind is
    /// PyTorch's; PyTorch interleaves per module, which no loader depends on).
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut v = self.named_parameters();
        v.extend(self.named_buffers());
        v
    }
    /// Copies tensors by name into this module's parameters and buffers. Every state_dict
    /// entry must be present with the same shape (PyTorch's `strict=True`); extra entries in
    /// `src` are an error too, so a mislabelled file is caught.
    fn load_state_dict(&self, src: &[(String, Tensor)]) -> Result<()> {
        let mine = self.state_dict();
        for (name, t) in &mine {
            let Some((_, s)) = src.iter().find(|(n, _)| n == name) else {
                return Err(TensorError::invalid(
                    "load_state_dict",
                    format!("missing key {name}"),
                ));
            };
            if s.shape() != t.shape() {
                return Err(TensorError::shape(
                    "load_state_dict",
                    format!(
                        "{name}: file has {:?}, model has {:?}",
                        s.shape(),
                        t.shape()
                    ),
                ));
            }
            let _g = no_grad();
            t.copy_(s)?;
        }
        for (n, _) in src {
            if !mine.iter().any(|(m, _)| m == n) {
                return Err(TensorError::invalid(
                    "load_state_dict",
                    format!("unexpected key {n}"),
                ));
            }
        }
        Ok(())
    }
}

/// Prefixes child names: `prefix.name`.
pub(crate) fn prefixed(prefix: &str, v: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    v.into_iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t))
        .collect()
}

/// How parameters are created: on which device, in which dtype.
#[derive(Clone)]
pub struct Init {
    pub device: Device,
    pub dtype: DType,
}

impl Init {
    pub fn new(device: &Device, dtype: DType) -> Init {
        Init {
            device: device.clone(),
            dtype,
        }
    }
    /// A parameter: uniform(-bound, bound) like PyTorch's kaiming-uniform default (on the
    /// meta device the fill is a no-op), tagged `parameter`, requires grad.
    pub fn param(&self, shape: &[usize], bound: f64) -> Result<Tensor> {
        let _c = category_scope(MemoryCategory::Parameter);
        let t = Tensor::empty(shape, self.dtype, &self.device)?;
        t.uniform_(-bound, bound)?;
        t.requires_grad_(true)?;
        Ok(t)
    }
    pub fn param_const(&self, shape: &[usize], v: f64) -> Result<Tensor> {
        let _c = category_scope(MemoryCategory::Parameter);
        let t = Tensor::full(shape, v, self.dtype, &self.device)?;
        t.requires_grad_(true)?;
        Ok(t)
    }
    pub fn buffer(&self, shape: &[usize], v: f64, dtype: DType) -> Result<Tensor> {
        let _c = category_scope(MemoryCategory::Parameter);
        Tensor::full(shape, v, dtype, &self.device)
    }
}

fn one(name: &str, t: &Tensor) -> (String, Tensor) {
    (name.to_string(), t.clone())
}

/// `nn.Linear(in, out, bias)`: weight `[out, in]`.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(init: &Init, inp: usize, out: usize, bias: bool) -> Result<Linear> {
        let bound = 1.0 / (inp.max(1) as f64).sqrt();
        Ok(Linear {
            weight: init.param(&[out, inp], bound)?,
            bias: if bias {
                Some(init.param(&[out], bound)?)
            } else {
                None
            },
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, &self.weight, self.bias.as_ref())
    }
}

impl Module for Linear {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![one("weight", &self.weight)];
        if let Some(b) = &self.bias {
            v.push(one("bias", b));
        }
        v
    }
}

/// `nn.Conv2d(cin, cout, k, stride, padding, bias)`.
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub params: Conv2dParams,
}

impl Conv2d {
    pub fn new(
        init: &Init,
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    ) -> Result<Conv2d> {
        let bound = 1.0 / ((cin * k * k).max(1) as f64).sqrt();
        Ok(Conv2d {
            weight: init.param(&[cout, cin, k, k], bound)?,
            bias: if bias {
                Some(init.param(&[cout], bound)?)
            } else {
                None
            },
            params: Conv2dParams::new(stride, padding),
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::conv2d(x, &self.weight, self.bias.as_ref(), &self.params)
    }
}

impl Module for Conv2d {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![one("weight", &self.weight)];
        if let Some(b) = &self.bias {
            v.push(one("bias", b));
        }
        v
    }
}

/// `nn.BatchNorm2d(c)`: affine, running stats, momentum 0.1, eps 1e-5.
pub struct BatchNorm2d {
    pub weight: Tensor,
    pub bias: Tensor,
    pub running_mean: Tensor,
    pub running_var: Tensor,
    pub num_batches_tracked: Tensor,
    pub training: bool,
    pub momentum: f64,
    pub eps: f64,
}

impl BatchNorm2d {
    pub fn new(init: &Init, c: usize) -> Result<BatchNorm2d> {
        // Running stats are f32 like the parameters (PyTorch keeps them in the module's
        // dtype); the counter is an int64 scalar (one 512-byte block on CUDA).
        Ok(BatchNorm2d {
            weight: init.param_const(&[c], 1.0)?,
            bias: init.param_const(&[c], 0.0)?,
            running_mean: init.buffer(&[c], 0.0, init.dtype)?,
            running_var: init.buffer(&[c], 1.0, init.dtype)?,
            num_batches_tracked: init.buffer(&[], 0.0, DType::I64)?,
            training: true,
            momentum: 0.1,
            eps: 1e-5,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.apply(ops::batch_norm, x)
    }

    /// `relu_(self.forward(x))`, fused where the backend can (see [`ops::batch_norm_relu`]).
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        self.apply(ops::batch_norm_relu, x)
    }

    #[allow(clippy::type_complexity)]
    fn apply(
        &self,
        f: fn(
            &Tensor,
            Option<&Tensor>,
            Option<&Tensor>,
            Option<&Tensor>,
            Option<&Tensor>,
            bool,
            f64,
            f64,
        ) -> Result<Tensor>,
        x: &Tensor,
    ) -> Result<Tensor> {
        f(
            x,
            Some(&self.running_mean),
            Some(&self.running_var),
            Some(&self.weight),
            Some(&self.bias),
            self.training,
            self.momentum,
            self.eps,
        )
    }
}

impl Module for BatchNorm2d {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![one("weight", &self.weight), one("bias", &self.bias)]
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            one("running_mean", &self.running_mean),
            one("running_var", &self.running_var),
            one("num_batches_tracked", &self.num_batches_tracked),
        ]
    }
    fn train(&mut self, on: bool) {
        self.training = on;
    }
}

/// `nn.ReLU(inplace)`. In-place returns the same tensor (its storage is reused).
pub struct ReLU {
    pub inplace: bool,
}

impl ReLU {
    pub fn forward(&self, x: Tensor) -> Result<Tensor> {
        if self.inplace {
            x.relu_()?;
            Ok(x)
        } else {
            x.relu()
        }
    }
}

impl Module for ReLU {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// `nn.GELU(approximate)`; GPT-2's `gelu_new` is the tanh form.
pub struct GELU {
    pub tanh: bool,
}

impl GELU {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.gelu(self.tanh)
    }
}

impl Module for GELU {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// `nn.MaxPool2d(kernel, stride, padding)`.
pub struct MaxPool2d {
    pub params: Pool2dParams,
}

impl MaxPool2d {
    pub fn new(kernel: usize, stride: usize, padding: usize) -> MaxPool2d {
        MaxPool2d {
            params: Pool2dParams::new(kernel, stride, padding),
        }
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::max_pool2d(x, &self.params)
    }
}

impl Module for MaxPool2d {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// `nn.AdaptiveAvgPool2d(out)`.
pub struct AdaptiveAvgPool2d {
    pub out: [usize; 2],
}

impl AdaptiveAvgPool2d {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::adaptive_avg_pool2d(x, self.out)
    }
}

impl Module for AdaptiveAvgPool2d {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// `nn.LayerNorm(d, eps)`.
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(init: &Init, d: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: init.param_const(&[d], 1.0)?,
            bias: init.param_const(&[d], 0.0)?,
            eps,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = self.weight.shape()[0];
        ops::layer_norm(x, &[d], Some(&self.weight), Some(&self.bias), self.eps)
    }
}

impl Module for LayerNorm {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![one("weight", &self.weight), one("bias", &self.bias)]
    }
}

/// `nn.Embedding(n, d)`.
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    pub fn new(init: &Init, n: usize, d: usize, std: f64) -> Result<Embedding> {
        let _c = category_scope(MemoryCategory::Parameter);
        let w = Tensor::empty(&[n, d], init.dtype, &init.device)?;
        w.normal_(0.0, std)?;
        w.requires_grad_(true)?;
        Ok(Embedding { weight: w })
    }
    pub fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        ops::embedding(&self.weight, idx)
    }
}

impl Module for Embedding {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![one("weight", &self.weight)]
    }
}

/// `nn.Dropout(p)`: identity in eval mode, a mask saved for backward in train mode.
pub struct Dropout {
    pub p: f64,
    pub training: bool,
}

impl Dropout {
    pub fn new(p: f64) -> Dropout {
        Dropout { p, training: true }
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::dropout(x, self.p, self.training)
    }
}

impl Module for Dropout {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn train(&mut self, on: bool) {
        self.training = on;
    }
}

/// Hugging Face's `Conv1D`: a linear layer with weight stored `[in, out]` and computed as
/// `addmm(bias, x.view(-1, in), weight)`, which is what GPT-2 checkpoints hold.
pub struct Conv1D {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Conv1D {
    pub fn new(init: &Init, nx: usize, nf: usize) -> Result<Conv1D> {
        let _c = category_scope(MemoryCategory::Parameter);
        let w = Tensor::empty(&[nx, nf], init.dtype, &init.device)?;
        w.normal_(0.0, 0.02)?;
        w.requires_grad_(true)?;
        drop(_c);
        Ok(Conv1D {
            weight: w,
            bias: init.param_const(&[nf], 0.0)?,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let nx = self.weight.shape()[0];
        let nf = self.weight.shape()[1];
        let mut out_shape = x.shape().to_vec();
        let last = out_shape.len().saturating_sub(1);
        if out_shape.is_empty() || out_shape[last] != nx {
            return Err(TensorError::shape(
                "Conv1D",
                format!("input {:?} for weight {:?}", x.shape(), self.weight.shape()),
            ));
        }
        out_shape[last] = nf;
        let x2 = x.reshape(&[x.numel() / nx.max(1), nx])?;
        Tensor::addmm(&self.bias, &x2, &self.weight)?.reshape(&out_shape)
    }
}

impl Module for Conv1D {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![one("weight", &self.weight), one("bias", &self.bias)]
    }
}

/// GPT-2's causal multi-head self-attention (`GPT2Attention`, eager path): `c_attn`
/// projects to q, k, v; scores are `q @ k^T / sqrt(d)`, masked above the diagonal,
/// softmaxed, dropped out, applied to v; heads are merged and projected by `c_proj`.
pub struct CausalSelfAttention {
    pub c_attn: Conv1D,
    pub c_proj: Conv1D,
    pub n_head: usize,
    pub attn_dropout: Dropout,
    pub resid_dropout: Dropout,
    /// `[n_positions, n_positions]` bool, true above the diagonal (the positions masked).
    /// A non-persistent buffer like HF's `bias`: not in the state_dict.
    pub mask: Tensor,
}

impl CausalSelfAttention {
    pub fn new(
        init: &Init,
        n_embd: usize,
        n_head: usize,
        mask: Tensor,
        p: f64,
    ) -> Result<CausalSelfAttention> {
        if n_head == 0 || !n_embd.is_multiple_of(n_head) {
            return Err(TensorError::invalid(
                "CausalSelfAttention",
                format!("n_embd {n_embd} is not a multiple of n_head {n_head}"),
            ));
        }
        Ok(CausalSelfAttention {
            c_attn: Conv1D::new(init, n_embd, 3 * n_embd)?,
            c_proj: Conv1D::new(init, n_embd, n_embd)?,
            n_head,
            attn_dropout: Dropout::new(p),
            resid_dropout: Dropout::new(p),
            mask,
        })
    }

    /// `x`: `[B, T, C]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.ndim() != 3 {
            return Err(TensorError::shape(
                "CausalSelfAttention",
                format!("expected [B, T, C], got {:?}", x.shape()),
            ));
        }
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let h = self.n_head;
        let d = c / h;
        if t > self.mask.shape()[0] {
            return Err(TensorError::invalid(
                "CausalSelfAttention",
                format!(
                    "sequence length {t} exceeds n_positions {}",
                    self.mask.shape()[0]
                ),
            ));
        }
        let qkv = self.c_attn.forward(x)?;
        let parts = qkv.split(c, 2)?;
        drop(qkv);
        // split_heads: view [B, T, H, D] then permute to [B, H, T, D] (views, no copies).
        let heads = |t_: &Tensor| -> Result<Tensor> {
            t_.view(&[b as isize, t as isize, h as isize, d as isize])?
                .permute(&[0, 2, 1, 3])
        };
        let q = heads(&parts[0])?;
        let k = heads(&parts[1])?;
        let v = heads(&parts[2])?;
        drop(parts);
        let mut w = q.matmul(&k.transpose(-1, -2)?)?;
        drop((q, k));
        w = w.div_scalar((d as f64).sqrt())?;
        let m = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        w = w.masked_fill(&m, f32::MIN as f64)?;
        w = w.softmax(-1)?;
        w = self.attn_dropout.forward(&w)?;
        let mut y = w.matmul(&v)?;
        drop((w, v));
        // merge_heads: [B, H, T, D] -> [B, T, H, D] contiguous -> [B, T, C].
        y = y
            .permute(&[0, 2, 1, 3])?
            .contiguous()?
            .reshape(&[b, t, c])?;
        y = self.c_proj.forward(&y)?;
        self.resid_dropout.forward(&y)
    }
}

impl Module for CausalSelfAttention {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = prefixed("c_attn", self.c_attn.named_parameters());
        v.extend(prefixed("c_proj", self.c_proj.named_parameters()));
        v
    }
    fn train(&mut self, on: bool) {
        self.attn_dropout.train(on);
        self.resid_dropout.train(on);
    }
}

/// The causal mask: true where column > row.
pub fn causal_mask(n: usize, device: &Device) -> Result<Tensor> {
    let _c = category_scope(MemoryCategory::Parameter);
    if device.is_meta() {
        return Tensor::empty(&[n, n], DType::Bool, device);
    }
    let mut data = vec![0.0; n * n];
    for i in 0..n {
        for j in (i + 1)..n {
            data[i * n + j] = 1.0;
        }
    }
    Tensor::from_f64(&data, &[n, n], DType::Bool, device)
}
