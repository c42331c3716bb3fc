//! A model's parameters and buffers as transformers' module tree holds them: created in the
//! order `model.to(device, dtype)` moves them, listed in the order `model.parameters()`
//! gives them, filled from a checkpoint or initialised.
//!
//! Design note: on the GPU the weights are allocated by `Module._apply`, which walks the
//! tree children first (post-order), moving each module's parameters and then its buffers;
//! a tied parameter (GPT-2's `lm_head.weight` is `transformer.wte.weight`) is one tensor,
//! allocated where the walk first meets it. The optimizer instead sees
//! `named_parameters()`: each module's own parameters before its children's (pre-order),
//! ties counted once. Both orders decide memory (block placement for the weights, state
//! order for AdamW), so the tree is described once ([`Node`]) and both walks come from it.
//! On the meta device nothing is read: the config alone sizes the model.

use std::collections::{HashMap, HashSet};

use super::error::{HfError, HfResult};
use super::weights::WeightIndex;
use crate::device::Device;
use crate::dtype::DType;
use crate::memory::{category_scope, MemoryCategory};
use crate::tensor::Tensor;

/// How a tensor is initialised when the checkpoint does not provide it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum InitKind {
    Normal(f64),
    Zeros,
    Ones,
    /// `torch.arange(n)` (BERT's `position_ids` buffer).
    Arange,
    /// RoPE's `inv_freq`: `1 / theta^(2i / dim)`, computed in f32 as transformers does.
    InvFreq {
        theta: f64,
        dim: usize,
    },
}

/// One parameter or buffer of a module.
#[derive(Debug, Clone)]
pub(crate) struct Leaf {
    name: String,
    shape: Vec<usize>,
    init: InitKind,
    /// `None`: the model's dtype (floating buffers are cast by `.to(dtype)` too).
    dtype: Option<DType>,
    buffer: bool,
    /// The full name of the tensor this one is tied to.
    tie: Option<String>,
}

/// A module: its own tensors (parameters first, then buffers, as `_apply` moves them) and
/// its children, in registration order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    name: String,
    leaves: Vec<Leaf>,
    children: Vec<Node>,
}

impl Node {
    pub fn new(name: impl Into<String>) -> Node {
        Node {
            name: name.into(),
            ..Node::default()
        }
    }
    pub fn param(mut self, name: &str, shape: &[usize], init: InitKind) -> Node {
        self.leaves.push(Leaf {
            name: name.into(),
            shape: shape.to_vec(),
            init,
            dtype: None,
            buffer: false,
            tie: None,
        });
        self
    }
    /// A parameter that is another one (`tie`: its full name).
    pub fn tied(mut self, name: &str, shape: &[usize], tie: &str) -> Node {
        self.leaves.push(Leaf {
            name: name.into(),
            shape: shape.to_vec(),
            init: InitKind::Zeros,
            dtype: None,
            buffer: false,
            tie: Some(tie.into()),
        });
        self
    }
    pub fn buffer(
        mut self,
        name: &str,
        shape: &[usize],
        init: InitKind,
        dtype: Option<DType>,
    ) -> Node {
        self.leaves.push(Leaf {
            name: name.into(),
            shape: shape.to_vec(),
            init,
            dtype,
            buffer: true,
            tie: None,
        });
        self
    }
    pub fn child(mut self, c: Node) -> Node {
        self.children.push(c);
        self
    }
    /// Bytes of the tensors of this subtree (ties counted once, at their target), in u128
    /// so that a model past the 64-bit address space is a number, not a wrap.
    pub fn weight_bytes(&self, dtype: DType) -> u128 {
        let own: u128 = self
            .leaves
            .iter()
            .filter(|l| l.tie.is_none())
            .map(|l| {
                let n = l
                    .shape
                    .iter()
                    .fold(1u128, |a, &d| a.saturating_mul(d as u128));
                n.saturating_mul(l.dtype.unwrap_or(dtype).size() as u128)
            })
            .fold(0u128, u128::saturating_add);
        self.children
            .iter()
            .map(|c| c.weight_bytes(dtype))
            .fold(own, u128::saturating_add)
    }
    /// `nn.Linear(inp, out, bias)` named `name`.
    pub fn linear(name: &str, inp: usize, out: usize, bias: bool, std: f64) -> Node {
        let n = Node::new(name).param("weight", &[out, inp], InitKind::Normal(std));
        if bias {
            n.param("bias", &[out], InitKind::Zeros)
        } else {
            n
        }
    }
    /// `nn.LayerNorm(d)`.
    pub fn layer_norm(name: &str, d: usize) -> Node {
        Node::new(name)
            .param("weight", &[d], InitKind::Ones)
            .param("bias", &[d], InitKind::Zeros)
    }
    /// `nn.Embedding(n, d)`.
    pub fn embedding(name: &str, n: usize, d: usize, std: f64) -> Node {
        Node::new(name).param("weight", &[n, d], InitKind::Normal(std))
    }
}

/// The tensors of a built model, by full name.
pub struct ParamStore {
    map: HashMap<String, Tensor>,
    alias: HashMap<String, String>,
    params: Vec<(String, Tensor)>,
    buffers: Vec<(String, Tensor)>,
    dtype: DType,
}

impl ParamStore {
    /// The tensor named `name` (a tied name resolves to its target).
    pub fn get(&self, name: &str) -> HfResult<Tensor> {
        let key = self.alias.get(name).map(String::as_str).unwrap_or(name);
        self.map
            .get(key)
            .cloned()
            .ok_or_else(|| HfError::Invalid(format!("internal: no tensor {name}")))
    }
    /// `model.named_parameters()`: pre-order, ties once.
    pub fn named_parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }
    pub fn named_buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }
    /// The model dtype the tensors were made in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Bytes of all parameters and buffers (requested sizes).
    pub fn nbytes(&self) -> u64 {
        self.map.values().map(|t| t.nbytes()).sum()
    }
}

/// What building found in the checkpoint.
#[derive(Debug, Clone, Default)]
pub struct BuildReport {
    /// Parameters filled from the checkpoint.
    pub loaded: usize,
    /// Parameters the checkpoint lacked (initialised instead).
    pub missing: Vec<String>,
}

struct Builder<'a> {
    device: &'a Device,
    dtype: DType,
    weights: Option<&'a WeightIndex>,
    store: ParamStore,
    report: BuildReport,
    /// Names already in `store.params` (false) or `store.buffers` (true).
    listed: HashSet<(bool, String)>,
}

fn inv_freq(theta: f64, dim: usize) -> Vec<f64> {
    (0..dim)
        .step_by(2)
        .map(|i| {
            let x = i as f32 / dim as f32;
            (1.0f32 / (theta as f32).powf(x)) as f64
        })
        .collect()
}

impl Builder<'_> {
    fn post_order(&mut self, node: &Node, prefix: &str) -> HfResult<()> {
        for c in &node.children {
            self.post_order(c, &format!("{prefix}{}.", c.name))?;
        }
        // `_apply` moves `_parameters`, then `_buffers`.
        for buffers in [false, true] {
            for l in node.leaves.iter().filter(|l| l.buffer == buffers) {
                let full = format!("{prefix}{}", l.name);
                let canon = l.tie.clone().unwrap_or_else(|| full.clone());
                if canon != full {
                    self.store.alias.insert(full.clone(), canon.clone());
                }
                if self.store.map.contains_key(&canon) {
                    continue;
                }
                let t = self.make(l, &canon, &full)?;
                self.store.map.insert(canon, t);
            }
        }
        Ok(())
    }

    fn make(&mut self, l: &Leaf, canon: &str, full: &str) -> HfResult<Tensor> {
        let dtype = l.dtype.unwrap_or(self.dtype);
        let t = {
            let _c = category_scope(MemoryCategory::Parameter);
            Tensor::empty(&l.shape, dtype, self.device)?
        };
        if !self.device.is_meta() {
            let from_file = if l.buffer {
                None
            } else {
                self.weights.filter(|w| !w.is_empty()).and_then(|w| {
                    w.find(canon)
                        .or_else(|| w.find(full))
                        .map(|(n, e)| (w, n.to_string(), e.clone()))
                })
            };
            match from_file {
                Some((w, name, e)) => {
                    if e.shape != l.shape {
                        return Err(HfError::Weights {
                            path: w.files[e.file].display().to_string(),
                            msg: format!(
                                "{name} has shape {:?}, the config gives {:?}",
                                e.shape, l.shape
                            ),
                        });
                    }
                    t.copy_from_f64(&w.read(&e)?)?;
                    self.report.loaded += 1;
                }
                None => {
                    if !l.buffer && self.weights.is_some_and(|w| !w.is_empty()) {
                        self.report.missing.push(canon.to_string());
                    }
                    match l.init {
                        InitKind::Normal(std) => t.normal_(0.0, std)?,
                        InitKind::Zeros => t.fill_(0.0)?,
                        InitKind::Ones => t.fill_(1.0)?,
                        InitKind::Arange => {
                            let n = t.numel();
                            t.copy_from_f64(&(0..n).map(|i| i as f64).collect::<Vec<_>>())?
                        }
                        InitKind::InvFreq { theta, dim } => {
                            t.copy_from_f64(&inv_freq(theta, dim))?
                        }
                    }
                }
            }
        }
        if !l.buffer {
            t.requires_grad_(true)?;
        }
        Ok(t)
    }

    fn pre_order(&mut self, node: &Node, prefix: &str) -> HfResult<()> {
        for buffers in [false, true] {
            for l in node.leaves.iter().filter(|l| l.buffer == buffers) {
                let full = format!("{prefix}{}", l.name);
                let canon = l.tie.clone().unwrap_or(full);
                let t = self.store.get(&canon)?;
                let list = if buffers {
                    &mut self.store.buffers
                } else {
                    &mut self.store.params
                };
                // A set, not a scan of the list: the scan made building quadratic in the
                // parameter count (10,000 layers took 15 s).
                if !self.listed.insert((buffers, canon.clone())) {
                    continue;
                }
                list.push((canon, t));
            }
        }
        for c in &node.children {
            self.pre_order(c, &format!("{prefix}{}.", c.name))?;
        }
        Ok(())
    }
}

/// Creates the tensors of the tree under `root` on `device` in `dtype`, filled from
/// `weights` where it has them (never read on the meta device).
pub(crate) fn build(
    root: &Node,
    device: &Device,
    dtype: DType,
    weights: Option<&WeightIndex>,
) -> HfResult<(ParamStore, BuildReport)> {
    let mut b = Builder {
        device,
        dtype,
        weights,
        store: ParamStore {
            map: HashMap::new(),
            alias: HashMap::new(),
            params: Vec::new(),
            buffers: Vec::new(),
            dtype,
        },
        report: BuildReport::default(),
        listed: HashSet::new(),
    };
    let prefix = if root.name.is_empty() {
        String::new()
    } else {
        format!("{}.", root.name)
    };
    b.post_order(root, &prefix)?;
    b.pre_order(root, &prefix)?;
    Ok((b.store, b.report))
}
