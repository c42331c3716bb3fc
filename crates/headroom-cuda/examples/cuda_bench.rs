//! Allocator ns per malloc+free pair on a real GPU: Headroom (`CachingAllocator<CudaDevice>`)
//! against PyTorch's C++ `raw_alloc`/`raw_delete`, the same cases as `headroom bench alloc`,
//! in one process on the same device.
//!
//!     cuda_bench [--torch-shim libtorch_raw_shim.so] [--json out.json] [--pairs N] [--repeats R]
//!                [--rounds K]
//!
//! Each of the K rounds (default 3) runs every case on both allocators, the order swapping
//! from round to round; a case's figure is the median of all its repeats.
//!
//! The shim (scripts/torch_raw_shim.cpp, built against the machine's libtorch) exports
//! `hr_torch_init`, `hr_torch_raw_alloc`, `hr_torch_raw_delete` and `hr_torch_empty_cache`;
//! without it only Headroom's column is measured.

use std::ffi::{c_void, CString};

use headroom_alloc::bench::{
    bench_mixed, bench_single, merge_rounds, BenchCase, BenchOptions, PairAlloc,
};
use headroom_alloc::bench::{MIXED_LIVE, SINGLE_SIZES};
use headroom_alloc::{AllocError, AllocatorConfig, CachingAllocator};
use headroom_cuda::{unavailable_reason, CudaDevice};

struct TorchRaw {
    alloc: unsafe extern "C" fn(usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void),
    empty: unsafe extern "C" fn(),
}

impl PairAlloc for &TorchRaw {
    #[inline]
    fn alloc(&mut self, size: u64) -> Result<u64, AllocError> {
        // SAFETY: the shim's raw_alloc takes a byte count and returns a device pointer or null.
        let p = unsafe { (self.alloc)(size as usize) };
        if p.is_null() {
            return Err(AllocError::Device("torch raw_alloc returned null".into()));
        }
        Ok(p as u64)
    }
    #[inline]
    fn free(&mut self, ptr: u64, _size: u64) -> Result<(), AllocError> {
        // SAFETY: ptr came from raw_alloc above.
        unsafe { (self.free)(ptr as *mut c_void) };
        Ok(())
    }
}

fn load_shim(path: &str) -> Result<TorchRaw, String> {
    let c = CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: dlopen of a path; the handle is kept for the life of the process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a static NUL-terminated string or null.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            "unknown".to_string()
        } else {
            // SAFETY: as above.
            unsafe { std::ffi::CStr::from_ptr(e) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(format!("dlopen {path}: {msg}"));
    }
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let n = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: h is a live handle; n is NUL-terminated.
        let p = unsafe { libc::dlsym(h, n.as_ptr()) };
        if p.is_null() {
            Err(format!("{path} lacks {name}"))
        } else {
            Ok(p)
        }
    };
    // SAFETY: the shim defines these with exactly these C signatures.
    unsafe {
        let init: unsafe extern "C" fn() -> i32 = std::mem::transmute(sym("hr_torch_init")?);
        if init() != 0 {
            return Err("hr_torch_init failed".into());
        }
        Ok(TorchRaw {
            alloc: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(usize) -> *mut c_void>(
                sym("hr_torch_raw_alloc")?,
            ),
            free: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(sym(
                "hr_torch_raw_delete",
            )?),
            empty: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(sym(
                "hr_torch_empty_cache",
            )?),
        })
    }
}

fn main() {
    if let Some(why) = unavailable_reason() {
        eprintln!("SKIP cuda_bench: {why}");
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let opts = BenchOptions {
        pairs: arg("--pairs")
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000),
        repeats: arg("--repeats").and_then(|v| v.parse().ok()).unwrap_or(5),
        warmup: 20_000,
    };
    let rounds: usize = arg("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    // Keeps the primary context alive between the per-case allocators.
    let keep = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cuda_bench: {e}");
            std::process::exit(1);
        }
    };
    let fresh = || -> Result<CachingAllocator<CudaDevice>, String> {
        Ok(CachingAllocator::new(
            CudaDevice::new(0).map_err(|e| e.to_string())?,
            AllocatorConfig::default(),
        ))
    };
    let run = || -> Result<Vec<BenchCase>, String> {
        let mut out = Vec::new();
        for size in SINGLE_SIZES {
            let a = fresh()?;
            out.push(bench_single(&mut &a, size, &opts).map_err(|e| e.to_string())?);
            a.empty_cache();
        }
        for live in MIXED_LIVE {
            let a = fresh()?;
            out.push(bench_mixed(&mut &a, live, &opts).map_err(|e| e.to_string())?);
            a.empty_cache();
        }
        Ok(out)
    };
    let torch_raw: Option<TorchRaw> = arg("--torch-shim").and_then(|p| match load_shim(&p) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("torch shim unavailable: {e}");
            None
        }
    });
    let run_torch = |t: &TorchRaw| -> Result<Vec<BenchCase>, String> {
        let mut out = Vec::new();
        for size in SINGLE_SIZES {
            out.push(bench_single(&mut &*t, size, &opts).map_err(|e| e.to_string())?);
            // SAFETY: the shim's empty_cache takes no arguments.
            unsafe { (t.empty)() };
        }
        for live in MIXED_LIVE {
            out.push(bench_mixed(&mut &*t, live, &opts).map_err(|e| e.to_string())?);
            // SAFETY: as above.
            unsafe { (t.empty)() };
        }
        Ok(out)
    };
    // Rounds alternate which allocator goes first (ABBA...), so that a shared machine's
    // drift (neighbours, clocks) lands on both sides alike; each side's samples are pooled.
    let mut ours_rounds = Vec::new();
    let mut torch_rounds = Vec::new();
    let mut torch_ok = torch_raw.is_some();
    for round in 0..rounds {
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                match run() {
                    Ok(c) => ours_rounds.push(c),
                    Err(e) => {
                        eprintln!("cuda_bench (headroom): {e}");
                        std::process::exit(1);
                    }
                }
            } else if let (true, Some(t)) = (torch_ok, torch_raw.as_ref()) {
                match run_torch(t) {
                    Ok(c) => torch_rounds.push(c),
                    Err(e) => {
                        eprintln!("torch bench: {e}");
                        torch_ok = false;
                    }
                }
            }
        }
    }
    let ours = merge_rounds(ours_rounds);
    let torch: Option<Vec<BenchCase>> = torch_ok.then(|| merge_rounds(torch_rounds));
    drop(keep);
    println!(
        "Allocator ns per malloc+free pair on {} ({} pairs x {} repeats x {} interleaved rounds, median)",
        CudaDevice::new(0)
            .map(|d| d.name().to_string())
            .unwrap_or_default(),
        opts.pairs,
        opts.repeats,
        rounds
    );
    println!(
        "{:<16} {:>14} {:>16} {:>12} {:>10}",
        "case", "headroom ns", "torch C++ ns", "torch/hr", "<=1/5?"
    );
    let mut rows = Vec::new();
    for (i, c) in ours.iter().enumerate() {
        let t = torch.as_ref().and_then(|t| t.get(i));
        let ratio = t.map(|t| t.ns_per_pair_median / c.ns_per_pair_median);
        println!(
            "{:<16} {:>14.1} {:>16} {:>12} {:>10}",
            c.name,
            c.ns_per_pair_median,
            t.map(|t| format!("{:.1}", t.ns_per_pair_median))
                .unwrap_or_else(|| "-".into()),
            ratio
                .map(|r| format!("{r:.2}x"))
                .unwrap_or_else(|| "-".into()),
            ratio
                .map(|r| if r >= 5.0 { "yes" } else { "no" })
                .unwrap_or("-"),
        );
        rows.push(serde_json::json!({
            "case": c.name,
            "headroom_ns": c.ns_per_pair_median,
            "headroom_min": c.ns_min,
            "headroom_max": c.ns_max,
            "torch_cpp_ns": t.map(|t| t.ns_per_pair_median),
            "torch_over_headroom": ratio,
        }));
    }
    if let Some(p) = arg("--json") {
        let body = serde_json::json!({ "pairs": opts.pairs, "repeats": opts.repeats, "rounds": rounds, "cases": rows });
        if let Err(e) = std::fs::write(&p, body.to_string()) {
            eprintln!("write {p}: {e}");
        }
    }
}
