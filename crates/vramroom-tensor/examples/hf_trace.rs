//! Prints a Hugging Face workload's allocation sequence on the meta device (PyTorch's
//! caching allocator, H200 workspaces), one event a line, for matching against a recorded
//! PyTorch snapshot (`scripts/hf_trace_diff.py`).
//!
//!     cargo run --release -p vramroom-tensor --example hf_trace -- DIR KIND DTYPE ARGS...
//!
//! KIND: `forward B T use_cache(true|false)`, `generate B P N dynamic|static`,
//! `train B T STEPS`; DTYPE: float32 | bfloat16; `--warmth cold|forward|full`.
//! Output: `base <bytes>`, `peak <bytes>`, then `+<id> <bytes>` / `-<id> <bytes>` from the
//! start of the workload (the weights and warm workspaces before it are not listed).
//! `scripts/hf_trace_diff.py SNAPSHOT` runs this for a recorded snapshot and aligns the two.

use std::sync::Arc;

use parking_lot::Mutex;
use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};
use vramroom_tensor::models::hf::config::parse_dtype;
use vramroom_tensor::models::hf::scenario::Optim;
use vramroom_tensor::models::hf::{run, CacheImpl, RunOptions, Warmth, Workload};
use vramroom_tensor::{Allocation, CudaLikeWorkspace, Device, StorageAllocator};

/// (events: alloc?, id, bytes), live blocks (ptr -> id, bytes), the last id.
type Events = (
    Vec<(bool, u64, u64)>,
    std::collections::HashMap<u64, (u64, u64)>,
    u64,
);

/// Logs allocations and frees from the last peak reset on (the workload's start).
struct Log {
    inner: CachingAllocator<SimDevice>,
    ev: Mutex<Events>,
}

impl StorageAllocator for Log {
    fn allocate(&self, n: u64) -> vramroom_tensor::Result<Allocation> {
        let a = StorageAllocator::allocate(&self.inner, n)?;
        let mut g = self.ev.lock();
        g.2 += 1;
        let id = g.2;
        g.1.insert(a.ptr, (id, n));
        g.0.push((true, id, n));
        Ok(a)
    }
    fn free(&self, ptr: u64) {
        let mut g = self.ev.lock();
        if let Some((id, n)) = g.1.remove(&ptr) {
            g.0.push((false, id, n));
        }
        drop(g);
        StorageAllocator::free(&self.inner, ptr)
    }
    fn memory_allocated(&self) -> u64 {
        StorageAllocator::memory_allocated(&self.inner)
    }
    fn memory_reserved(&self) -> u64 {
        StorageAllocator::memory_reserved(&self.inner)
    }
    fn max_memory_allocated(&self) -> u64 {
        StorageAllocator::max_memory_allocated(&self.inner)
    }
    fn reset_peak_memory_stats(&self) {
        let mut g = self.ev.lock();
        g.0.clear();
        // Blocks alive now were made before the workload: their frees show as id 0.
        for v in g.1.values_mut() {
            v.0 = 0;
        }
        drop(g);
        StorageAllocator::reset_peak_memory_stats(&self.inner)
    }
    fn memory_stats(&self) -> std::collections::BTreeMap<String, i64> {
        StorageAllocator::memory_stats(&self.inner)
    }
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: hf_trace DIR forward|generate|train DTYPE ARGS... [--warmth cold|forward|full]";
    if a.len() < 4 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let num = |i: usize| -> usize {
        a.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            eprintln!("{usage}");
            std::process::exit(2)
        })
    };
    let w = match a[1].as_str() {
        "forward" => Workload::Forward {
            batch: num(3),
            seq: num(4),
            use_cache: a.get(5).map(|s| s == "true" || s == "True"),
        },
        "generate" => Workload::Generate {
            batch: num(3),
            prompt: num(4),
            new_tokens: num(5),
            cache: if a.get(6).map(String::as_str) == Some("static") {
                CacheImpl::Static
            } else {
                CacheImpl::Dynamic
            },
        },
        "train" => Workload::Train {
            batch: num(3),
            seq: num(4),
            steps: num(5),
            optimizer: Optim::default(),
        },
        _ => {
            eprintln!("{usage}");
            std::process::exit(2)
        }
    };
    let warmth = a
        .iter()
        .position(|s| s == "--warmth")
        .and_then(|i| a.get(i + 1))
        .map(|s| match s.as_str() {
            "cold" => Warmth::Cold,
            "full" => Warmth::Full,
            _ => Warmth::Forward,
        });
    let log = Arc::new(Log {
        inner: CachingAllocator::new(SimDevice::new(1 << 44), AllocatorConfig::default()),
        ev: Mutex::new(Default::default()),
    });
    let dev = Device::meta(log.clone());
    dev.set_workspace_policy(Arc::new(CudaLikeWorkspace::h200()));
    let o = RunOptions {
        dtype: parse_dtype(&a[2]),
        warmth,
        seed: 0,
    };
    let r = match run(std::path::Path::new(&a[0]), &dev, &w, &o) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    };
    println!("base {}", r.base_allocated_bytes);
    println!("peak {}", r.peak_allocated_bytes);
    println!("reserved {}", r.peak_reserved_bytes);
    let ev = &log.ev.lock().0;
    // The model's own tensors, dropped when `run` returns, end the log: not the workload's.
    let end = ev.len() - ev.iter().rev().take_while(|e| !e.0 && e.1 == 0).count();
    for (alloc, id, n) in &ev[..end] {
        println!("{}{} {}", if *alloc { '+' } else { '-' }, id, n);
    }
}
