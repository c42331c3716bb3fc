//! `CudaLikeWorkspace`: the library workspaces PyTorch 2.11's CUDA path takes from the
//! caching allocator, as measured on an H200, for the meta device to reproduce.
//!
//! Design note — what PyTorch does. `cudnn_convolution` allocates its output, asks cuDNN's
//! heuristics for an algorithm (`torch.backends.cudnn.benchmark` off, the default), then
//! allocates that algorithm's workspace from the caching allocator, runs the kernel and frees
//! the workspace before returning; backward does the same after grad_input and after
//! grad_weight. The size depends on the algorithm cuDNN picks for the exact shape, so no
//! closed formula gives it. cuBLAS is different: the first matmul a handle runs allocates
//! the handle's workspace (32 MiB on Hopper, `CUBLAS_WORKSPACE_CONFIG=:4096:8`), which stays
//! for the life of the process; handles are per thread, so the forward thread and autograd's
//! device thread each pay it once, and the first matmul of the process also allocates 1 MiB
//! more (the cuBLASLt workspace) that stays too.
//!
//! Design note — where the numbers come from. `data/cudnn_workspaces_h200.json` holds, per
//! conv shape and pass, the workspace bytes PyTorch allocated at each batch size, read out of
//! the real traces in `shared/traces/`: every allocation that the meta device's (otherwise
//! identical) sequence does not make, allocated right after a conv's output and freed right
//! after, is that conv's workspace. `tests/cudnn_workspaces.rs` re-derives the file from the
//! pickles and fails if it differs (`VRAMROOM_BLESS=1` rewrites it). Forward: ResNet-50 at
//! batches 1, 3, 5, 8, 17, 32, 48, 64 (`resnet50_infer_nograd`); backward: batch 32
//! (`resnet50_train_sgd`). The two cuBLAS sizes come from the same traces.
//!
//! Design note — the size rule, for a query of batch `N`:
//! - the shape (per-image input, weight, stride, padding, dilation, groups, f32) was
//!   measured at `N`: that size;
//! - measured at batches around `N`: linear interpolation between the two nearest. Within
//!   one algorithm the workspace is affine in `N` (conv1 forward: 3813376·N + 37648 bytes
//!   from N = 3 to 64, exactly), so this is exact unless cuDNN switches algorithm between
//!   the two measured batches;
//! - above the largest measured batch (or when only one was measured, as for backward):
//!   proportional scaling from the nearest measured batch, `ws(N0)·N/N0`;
//! - below the smallest: the smallest batch's size;
//! - a shape that was never measured: the median ratio of workspace to the larger of the
//!   input and output bytes over the measured table, per pass and kind (1x1 stride-1 convs
//!   need no forward or backward-data workspace; their backward-filter takes one weight-sized
//!   buffer per image, capped). It is an estimate (the measured ratios spread from about
//!   1.3x to 2.5x around the 1.5x median) and is never used for ResNet-50 in f32.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};

use crate::device::{ConvPass, ConvWorkspaceQuery, WorkspacePolicy};
use crate::dtype::DType;
use crate::error::{Result, TensorError};

/// The shape part of a conv workspace query: everything but the batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConvShape {
    pub pass: ConvPass,
    /// Per-image input `[C, H, W]`.
    pub input: [usize; 3],
    pub weight: [usize; 4],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl ConvShape {
    pub fn of(q: &ConvWorkspaceQuery) -> ConvShape {
        ConvShape {
            pass: q.pass,
            input: [q.input[1], q.input[2], q.input[3]],
            weight: q.weight,
            stride: q.stride,
            padding: q.padding,
            dilation: q.dilation,
            groups: q.groups,
        }
    }
}

fn pass_name(p: ConvPass) -> &'static str {
    match p {
        ConvPass::Forward => "forward",
        ConvPass::BackwardInput => "backward_input",
        ConvPass::BackwardWeight => "backward_weight",
    }
}

/// Measured workspaces: per shape, `batch -> bytes` (f32 only).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkspaceTable {
    pub conv: BTreeMap<ConvShape, BTreeMap<usize, u64>>,
    /// One cuBLAS handle's workspace.
    pub cublas_handle_bytes: u64,
    /// Allocated once per process with the first handle (cuBLASLt).
    pub cublas_device_bytes: u64,
    /// Where the numbers come from, carried into the JSON.
    pub source: String,
}

const TABLE_JSON: &str = include_str!("../data/cudnn_workspaces_h200.json");

impl WorkspaceTable {
    /// The table measured on an H200 with PyTorch 2.11 (see the module notes).
    pub fn h200() -> &'static WorkspaceTable {
        static T: OnceLock<WorkspaceTable> = OnceLock::new();
        T.get_or_init(|| {
            WorkspaceTable::from_json(TABLE_JSON).expect("data/cudnn_workspaces_h200.json")
        })
    }

    pub fn from_json(text: &str) -> Result<WorkspaceTable> {
        let bad = |m: String| TensorError::invalid("workspace table", m);
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let u = |v: &Value, what: &str| -> Result<u64> {
            v.as_u64()
                .ok_or_else(|| bad(format!("{what}: not an unsigned integer")))
        };
        let arr = |v: &Value, n: usize, what: &str| -> Result<Vec<usize>> {
            let a = v
                .as_array()
                .filter(|a| a.len() == n)
                .ok_or_else(|| bad(format!("{what}: expected {n} integers")))?;
            a.iter().map(|x| u(x, what).map(|x| x as usize)).collect()
        };
        let mut t = WorkspaceTable {
            cublas_handle_bytes: u(&v["cublas_handle_bytes"], "cublas_handle_bytes")?,
            cublas_device_bytes: u(&v["cublas_device_bytes"], "cublas_device_bytes")?,
            source: v["source"].as_str().unwrap_or_default().to_string(),
            ..Default::default()
        };
        for e in v["conv"]
            .as_array()
            .ok_or_else(|| bad("conv: not a list".into()))?
        {
            let pass = match e["pass"].as_str() {
                Some("forward") => ConvPass::Forward,
                Some("backward_input") => ConvPass::BackwardInput,
                Some("backward_weight") => ConvPass::BackwardWeight,
                p => return Err(bad(format!("unknown pass {p:?}"))),
            };
            let i = arr(&e["input"], 3, "input")?;
            let w = arr(&e["weight"], 4, "weight")?;
            let s = arr(&e["stride"], 2, "stride")?;
            let p = arr(&e["padding"], 2, "padding")?;
            let d = arr(&e["dilation"], 2, "dilation")?;
            let key = ConvShape {
                pass,
                input: [i[0], i[1], i[2]],
                weight: [w[0], w[1], w[2], w[3]],
                stride: [s[0], s[1]],
                padding: [p[0], p[1]],
                dilation: [d[0], d[1]],
                groups: u(&e["groups"], "groups")? as usize,
            };
            let pts = t.conv.entry(key).or_default();
            for pt in e["bytes"]
                .as_array()
                .ok_or_else(|| bad("bytes: not a list".into()))?
            {
                let pt = arr(pt, 2, "bytes entry")?;
                pts.insert(pt[0], pt[1] as u64);
            }
        }
        Ok(t)
    }

    /// The JSON form, one conv shape per line so that a re-derivation diffs cleanly.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{\n");
        out += &format!("  \"source\": {},\n", json!(self.source));
        out += &format!(
            "  \"cublas_handle_bytes\": {},\n  \"cublas_device_bytes\": {},\n  \"conv\": [\n",
            self.cublas_handle_bytes, self.cublas_device_bytes
        );
        let n = self.conv.len();
        for (k, (s, pts)) in self.conv.iter().enumerate() {
            let e = json!({
                "pass": pass_name(s.pass),
                "input": s.input,
                "weight": s.weight,
                "stride": s.stride,
                "padding": s.padding,
                "dilation": s.dilation,
                "groups": s.groups,
                "bytes": pts.iter().map(|(b, n)| json!([b, n])).collect::<Vec<_>>(),
            });
            out += &format!("    {e}{}\n", if k + 1 < n { "," } else { "" });
        }
        out += "  ]\n}\n";
        out
    }

    /// The same table with only the given batch sizes kept (to test the interpolation on
    /// batches it did not see).
    pub fn with_batches(&self, keep: &[usize]) -> WorkspaceTable {
        let mut t = self.clone();
        for pts in t.conv.values_mut() {
            pts.retain(|b, _| keep.contains(b));
        }
        t.conv.retain(|_, pts| !pts.is_empty());
        t
    }

    /// The measured size for `q` under the interpolation rule, `None` if the shape (in f32)
    /// was never measured.
    pub fn measured(&self, q: &ConvWorkspaceQuery) -> Option<u64> {
        if q.dtype != DType::F32 {
            return None;
        }
        let pts = self.conv.get(&ConvShape::of(q))?;
        let n = q.input[0];
        if let Some(&b) = pts.get(&n) {
            return Some(b);
        }
        let below = pts.range(..n).next_back();
        let above = pts.range(n..).next();
        Some(match (below, above) {
            (Some((&n0, &b0)), Some((&n1, &b1))) => {
                let t = (n - n0) as f64 / (n1 - n0) as f64;
                (b0 as f64 + t * (b1 as f64 - b0 as f64)).round() as u64
            }
            (Some((&n0, &b0)), None) => (b0 as f64 * n as f64 / n0 as f64).round() as u64,
            (None, Some((_, &b1))) => b1,
            (None, None) => return None,
        })
    }
}

/// Estimate for a shape the table does not hold (see the module notes).
pub fn fallback_conv_workspace(q: &ConvWorkspaceQuery) -> u64 {
    let es = q.dtype.size() as u64;
    let numel = |s: &[usize; 4]| s.iter().map(|&x| x as u64).product::<u64>();
    let (inb, outb, wb) = (
        numel(&q.input) * es,
        numel(&q.output) * es,
        numel(&q.weight) * es,
    );
    let big = inb.max(outb) as f64;
    let pointwise = q.weight[2] == 1 && q.weight[3] == 1 && q.stride == [1, 1];
    let est = match (q.pass, pointwise) {
        (ConvPass::Forward | ConvPass::BackwardInput, true) => 0.0,
        (ConvPass::Forward, false) => 1.5 * big,
        (ConvPass::BackwardInput, false) => 1.74 * big,
        (ConvPass::BackwardWeight, true) => ((q.input[0] as u64 * wb) as f64).min(1.25 * big),
        (ConvPass::BackwardWeight, false) => 1.62 * big,
    };
    est.round() as u64
}

/// PyTorch's CUDA library workspaces on the meta device: cuDNN conv workspaces by the
/// measured table (fallback estimate for unmeasured shapes), cuBLAS handle workspaces.
#[derive(Clone)]
pub struct CudaLikeWorkspace {
    table: Arc<WorkspaceTable>,
}

impl CudaLikeWorkspace {
    /// The H200 / PyTorch 2.11 measurements.
    pub fn h200() -> CudaLikeWorkspace {
        CudaLikeWorkspace::with_table(WorkspaceTable::h200().clone())
    }
    pub fn with_table(table: WorkspaceTable) -> CudaLikeWorkspace {
        CudaLikeWorkspace {
            table: Arc::new(table),
        }
    }
    pub fn table(&self) -> &WorkspaceTable {
        &self.table
    }
}

impl Default for CudaLikeWorkspace {
    fn default() -> Self {
        CudaLikeWorkspace::h200()
    }
}

impl WorkspacePolicy for CudaLikeWorkspace {
    fn conv2d(&self, q: &ConvWorkspaceQuery) -> u64 {
        self.table
            .measured(q)
            .unwrap_or_else(|| fallback_conv_workspace(q))
    }
    fn blas_handle(&self) -> u64 {
        self.table.cublas_handle_bytes
    }
    fn blas_device(&self) -> u64 {
        self.table.cublas_device_bytes
    }
}
