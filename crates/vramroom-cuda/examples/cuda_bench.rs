//! Allocator ns per malloc+free pair on a real GPU: Vramroom (`CachingAllocator<CudaDevice>`)
//! against PyTorch's C++ `raw_alloc`/`raw_delete`, the same cases as `vramroom bench alloc`,
//! in one process on the same device.
//!
//!     cuda_bench [--torch-shim libtorch_raw_shim.so] [--json out.json] [--pairs N] [--repeats R]
//!
//! Each case runs on both allocators at once, their R repeats (default 15) alternating, so
//! that drift on a shared machine hits both alike; a case's ratio is the median of the
//! per-repeat ratios.
//!
//! The shim (scripts/torch_raw_shim.cpp, built against the machine's libtorch) exports
//! `hr_torch_init`, `hr_torch_raw_alloc`, `hr_torch_raw_delete` and `hr_torch_empty_cache`;
//! without it only Vramroom's column is measured.

use std::ffi::{c_void, CString};

use vramroom_alloc::bench::{
    bench_mixed_paired, bench_single_paired, paired_ratio, BenchCase, BenchOptions, PairAlloc, Side,
};
use vramroom_alloc::bench::{MIXED_LIVE, SINGLE_SIZES};
use vramroom_alloc::{AllocError, AllocatorConfig, CachingAllocator};
use vramroom_cuda::{unavailable_reason, CudaDevice};

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
        repeats: arg("--repeats").and_then(|v| v.parse().ok()).unwrap_or(15),
        warmup: 20_000,
    };
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
    let mut torch_raw: Option<TorchRaw> = arg("--torch-shim").and_then(|p| match load_shim(&p) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("torch shim unavailable: {e}");
            None
        }
    });
    // Case by case, both allocators side by side: their repeats alternate, so each figure of
    // one has a figure of the other taken just before or after it (see `paired_ratio`).
    let mut rows: Vec<(BenchCase, Option<BenchCase>)> = Vec::new();
    let cases = SINGLE_SIZES
        .iter()
        .map(|&s| (Some(s), 0))
        .chain(MIXED_LIVE.iter().map(|&l| (None, l)));
    for (single, live) in cases {
        let a = match fresh() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("cuda_bench (vramroom): {e}");
                std::process::exit(1);
            }
        };
        let mut t = torch_raw.as_ref();
        let res = match single {
            Some(size) => bench_single_paired(&mut &a, t.as_mut(), size, &opts),
            None => bench_mixed_paired(&mut &a, t.as_mut(), live, &opts),
        };
        a.empty_cache();
        if let Some(t) = torch_raw.as_ref() {
            // SAFETY: the shim's empty_cache takes no arguments.
            unsafe { (t.empty)() };
        }
        match res {
            Ok(r) => rows.push(r),
            Err(e) if e.side == Side::Peer => {
                // PyTorch's side failed: go on measuring Vramroom alone.
                eprintln!(
                    "cuda_bench (torch): {}; continuing without the torch column",
                    e.source
                );
                torch_raw = None;
            }
            Err(e) => {
                eprintln!("cuda_bench (vramroom): {}", e.source);
                std::process::exit(1);
            }
        }
    }
    drop(keep);
    println!(
        "Allocator ns per malloc+free pair on {} ({} pairs x {} repeats, the two allocators' repeats alternating; medians, torch/hr = median of per-repeat ratios)",
        CudaDevice::new(0)
            .map(|d| d.name().to_string())
            .unwrap_or_default(),
        opts.pairs,
        opts.repeats,
    );
    println!(
        "{:<16} {:>14} {:>16} {:>12} {:>10}",
        "case", "vramroom ns", "torch C++ ns", "torch/hr", "<=1/5?"
    );
    let mut json_rows = Vec::new();
    for (c, t) in &rows {
        let ratio = t.as_ref().and_then(|t| paired_ratio(c, t));
        println!(
            "{:<16} {:>14.1} {:>16} {:>12} {:>10}",
            c.name,
            c.ns_per_pair_median,
            t.as_ref()
                .map(|t| format!("{:.1}", t.ns_per_pair_median))
                .unwrap_or_else(|| "-".into()),
            ratio
                .map(|r| format!("{r:.2}x"))
                .unwrap_or_else(|| "-".into()),
            ratio
                .map(|r| if r >= 5.0 { "yes" } else { "no" })
                .unwrap_or("-"),
        );
        json_rows.push(serde_json::json!({
            "case": c.name,
            "vramroom_ns": c.ns_per_pair_median,
            "vramroom_min": c.ns_min,
            "vramroom_max": c.ns_max,
            "torch_cpp_ns": t.as_ref().map(|t| t.ns_per_pair_median),
            "torch_over_vramroom": ratio,
            "vramroom_samples": c.samples_in_order,
            "torch_samples": t.as_ref().map(|t| t.samples_in_order.clone()),
        }));
    }
    if let Some(p) = arg("--json") {
        let body =
            serde_json::json!({ "pairs": opts.pairs, "repeats": opts.repeats, "cases": json_rows });
        if let Err(e) = std::fs::write(&p, body.to_string()) {
            eprintln!("write {p}: {e}");
        }
    }
}
