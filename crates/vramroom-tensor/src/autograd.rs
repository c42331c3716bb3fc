//! Autograd: grad modes, graph nodes, and the backward engine.
//!
//! Design note — ownership: the graph is owned *forwards from the outputs*. A tensor holds
//! an `Arc` to the node that made it; a node holds `Arc`s to the nodes of its inputs and to
//! the gradient cells of leaf inputs; saved tensors are stored *detached* (data and version
//! only, never their own `grad_fn`). No pointer runs from a node back to its outputs, so
//! there are no cycles: dropping the last output frees its nodes and saved tensors at once,
//! whether or not backward ever ran.
//!
//! Design note — the engine follows PyTorch's single-device engine so that memory is freed
//! in PyTorch's order: a node runs when all its consumers have delivered their gradients,
//! ready nodes run highest sequence number first (latest created first), leaf accumulation
//! runs as soon as it is ready, gradients arriving at the same input are summed (in place
//! when the buffer is not shared), and each node's saved tensors are released right after
//! it runs unless `retain_graph`. A leaf's first gradient is stolen when nothing else refers
//! to it, otherwise copied; later ones accumulate in place.

use std::cell::Cell;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Result, TensorError};
use crate::memory::MemoryCategory;
use crate::tensor::Tensor;

// ---------------------------------------------------------------------------------------
// Grad modes

#[derive(Clone, Copy)]
struct Mode {
    grad: bool,
    inference: bool,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode { grad: true, inference: false }) };
    static IN_BACKWARD: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is running the backward engine. PyTorch runs a CUDA device's
/// backward on autograd's device thread, which has its own cuBLAS handle (and workspace).
pub(crate) fn in_backward() -> bool {
    IN_BACKWARD.with(|b| b.get())
}

struct BackwardGuard(bool);
impl BackwardGuard {
    fn enter() -> BackwardGuard {
        BackwardGuard(IN_BACKWARD.with(|b| b.replace(true)))
    }
}
impl Drop for BackwardGuard {
    fn drop(&mut self) {
        IN_BACKWARD.with(|b| b.set(self.0));
    }
}

/// Restores the previous grad mode of this thread when dropped.
#[must_use = "the mode reverts when the guard drops"]
pub struct GradModeGuard {
    prev: Mode,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        MODE.with(|m| m.set(self.prev));
    }
}

fn set_mode(f: impl FnOnce(&mut Mode)) -> GradModeGuard {
    MODE.with(|m| {
        let prev = m.get();
        let mut new = prev;
        f(&mut new);
        m.set(new);
        GradModeGuard { prev }
    })
}

/// `torch.no_grad()`: ops record no graph and save nothing while the guard lives.
pub fn no_grad() -> GradModeGuard {
    set_mode(|m| m.grad = false)
}
/// `torch.inference_mode()`: as `no_grad` for memory purposes.
pub fn inference_mode() -> GradModeGuard {
    set_mode(|m| {
        m.grad = false;
        m.inference = true;
    })
}
/// `torch.enable_grad()`.
pub fn enable_grad() -> GradModeGuard {
    set_mode(|m| {
        m.grad = true;
        m.inference = false;
    })
}
/// `torch.set_grad_enabled(b)` as a guard.
pub fn set_grad_enabled(enabled: bool) -> GradModeGuard {
    set_mode(|m| m.grad = enabled)
}
pub fn is_grad_enabled() -> bool {
    MODE.with(|m| m.get().grad)
}
pub fn is_inference_mode_enabled() -> bool {
    MODE.with(|m| m.get().inference)
}

// ---------------------------------------------------------------------------------------
// Graph

/// The `.grad` cell of a leaf that requires grad (PyTorch's AccumulateGrad target).
#[derive(Default)]
pub(crate) struct LeafGrad {
    pub grad: Mutex<Option<Tensor>>,
}

#[derive(Clone)]
pub(crate) enum Edge {
    Node(Arc<Node>, usize),
    Leaf(Arc<LeafGrad>),
}

/// One op's backward. `grads` has one entry per output of the op (None: no gradient flowed
/// into that output); the result has one entry per input (None: not needed or zero).
pub(crate) trait BackwardFn: Send {
    fn backward(
        &mut self,
        grads: Vec<Option<Tensor>>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor>>>;
}

pub(crate) struct Node {
    seq: u64,
    pub name: &'static str,
    next: Vec<Option<Edge>>,
    n_outputs: usize,
    f: Mutex<Option<Box<dyn BackwardFn>>>,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Whether an op on `inputs` must record a node.
pub(crate) fn should_record(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// Records a node whose inputs are `inputs` and whose outputs are `outputs`.
pub(crate) fn record(
    name: &'static str,
    inputs: &[Option<&Tensor>],
    outputs: &[&Tensor],
    f: Box<dyn BackwardFn>,
) {
    let node = Arc::new(Node {
        seq: SEQ.fetch_add(1, Ordering::Relaxed),
        name,
        next: inputs.iter().map(|t| t.and_then(|t| t.edge())).collect(),
        n_outputs: outputs.len(),
        f: Mutex::new(Some(f)),
    });
    for (i, o) in outputs.iter().enumerate() {
        o.set_edge(Some(Edge::Node(node.clone(), i)));
    }
}

/// A tensor saved for backward: shares storage, remembers the version it was saved at.
pub(crate) struct Saved {
    t: Tensor,
    version: u64,
}

impl Saved {
    pub fn new(t: &Tensor) -> Saved {
        let d = t.detach();
        d.storage()
            .retag_if(MemoryCategory::Temporary, MemoryCategory::Activation);
        let version = d.storage().version();
        Saved { t: d, version }
    }
    pub fn get(&self, op: &'static str) -> Result<&Tensor> {
        let now = self.t.storage().version();
        if now != self.version {
            return Err(TensorError::ModifiedInPlace {
                op,
                saved: self.version,
                now,
            });
        }
        Ok(&self.t)
    }
}

// ---------------------------------------------------------------------------------------
// Engine

enum Target {
    Node(Arc<Node>),
    Leaf(Arc<LeafGrad>),
}

struct Task {
    deps: usize,
    buffer: Vec<Option<Tensor>>,
    target: Target,
    seq: u64,
}

fn key_of(e: &Edge) -> usize {
    match e {
        Edge::Node(n, _) => Arc::as_ptr(n) as usize,
        Edge::Leaf(l) => Arc::as_ptr(l) as usize,
    }
}

/// Sums an incoming gradient into a buffer slot: stolen when the slot is empty, added in
/// place when the slot's tensor is not shared with anything, out of place otherwise.
fn accumulate(slot: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    match slot.take() {
        None => *slot = Some(g),
        Some(old) => {
            if old.is_exclusive()
                && old.is_contiguous()
                && old.shape() == g.shape()
                && old.dtype() == g.dtype()
            {
                old.add_raw_(&g)?;
                *slot = Some(old);
            } else {
                *slot = Some(old.add(&g)?);
            }
        }
    }
    Ok(())
}

fn accumulate_leaf(leaf: &LeafGrad, g: Tensor) -> Result<()> {
    let mut cell = leaf.grad.lock();
    match cell.as_ref() {
        None => {
            let g = if g.is_exclusive() && g.is_contiguous() {
                g
            } else {
                g.deep_copy()?
            };
            g.storage().set_category(MemoryCategory::Gradient);
            *cell = Some(g);
        }
        Some(old) => {
            old.add_raw_(&g)?;
        }
    }
    Ok(())
}

pub(crate) fn run_backward(root: &Tensor, grad: Option<Tensor>, retain_graph: bool) -> Result<()> {
    let edge = root.edge().ok_or(TensorError::NoGrad)?;
    let grad = match grad {
        Some(g) => {
            if g.shape() != root.shape() {
                return Err(TensorError::shape(
                    "backward",
                    format!(
                        "grad of shape {:?} for a tensor of shape {:?}",
                        g.shape(),
                        root.shape()
                    ),
                ));
            }
            g
        }
        None => {
            if root.numel() != 1 {
                return Err(TensorError::Autograd(
                    "grad can be implicitly created only for scalar outputs".into(),
                ));
            }
            let _g = no_grad();
            Tensor::ones(root.shape(), root.dtype(), root.device())?
        }
    };
    let _mode = no_grad();
    let _engine = BackwardGuard::enter();

    // Dependency counts over the reachable graph.
    let mut tasks: HashMap<usize, Task> = HashMap::new();
    let mut stack = vec![edge.clone()];
    let new_task = |e: &Edge| -> Task {
        match e {
            Edge::Node(n, _) => Task {
                deps: 0,
                buffer: vec![None; n.n_outputs],
                target: Target::Node(n.clone()),
                seq: n.seq,
            },
            Edge::Leaf(l) => Task {
                deps: 0,
                buffer: vec![None],
                target: Target::Leaf(l.clone()),
                seq: u64::MAX,
            },
        }
    };
    tasks.insert(key_of(&edge), new_task(&edge));
    while let Some(e) = stack.pop() {
        if let Edge::Node(n, _) = &e {
            for next in n.next.iter().flatten() {
                let k = key_of(next);
                let fresh = !tasks.contains_key(&k);
                let t = tasks.entry(k).or_insert_with(|| new_task(next));
                t.deps += 1;
                if fresh {
                    stack.push(next.clone());
                }
            }
        }
    }

    let mut ready: BinaryHeap<(u64, usize)> = BinaryHeap::new();
    {
        let k = key_of(&edge);
        let nr = match &edge {
            Edge::Node(_, nr) => *nr,
            Edge::Leaf(_) => 0,
        };
        if let Some(t) = tasks.get_mut(&k) {
            t.buffer[nr] = Some(grad);
            ready.push((t.seq, k));
        }
    }

    while let Some((_, k)) = ready.pop() {
        let Some(task) = tasks.remove(&k) else {
            continue;
        };
        let node = match task.target {
            Target::Leaf(l) => {
                if let Some(g) = task.buffer.into_iter().next().flatten() {
                    accumulate_leaf(&l, g)?;
                }
                continue;
            }
            Target::Node(n) => n,
        };
        let needs: Vec<bool> = node.next.iter().map(|e| e.is_some()).collect();
        let outs = {
            let mut f = node.f.lock();
            let Some(func) = f.as_mut() else {
                return Err(TensorError::Autograd(format!(
                    "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed) in {}. Specify retain_graph=true if you need to backward a second time.",
                    node.name
                )));
            };
            let outs = func.backward(task.buffer, &needs)?;
            if !retain_graph {
                // Saved tensors go now, before the gradients travel on (PyTorch's order).
                *f = None;
            }
            outs
        };
        for (g, e) in outs.into_iter().zip(node.next.iter()) {
            let (Some(g), Some(e)) = (g, e) else {
                continue;
            };
            let nk = key_of(e);
            let Some(t) = tasks.get_mut(&nk) else {
                continue;
            };
            let nr = match e {
                Edge::Node(_, nr) => *nr,
                Edge::Leaf(_) => 0,
            };
            accumulate(&mut t.buffer[nr], g)?;
            t.deps -= 1;
            if t.deps == 0 {
                ready.push((t.seq, nk));
            }
        }
    }
    Ok(())
}

/// The name of the node behind an edge, for `grad_fn_name()`.
pub(crate) fn edge_name(e: &Edge) -> &'static str {
    match e {
        Edge::Node(n, _) => n.name,
        Edge::Leaf(_) => "AccumulateGrad",
    }
}
