//! # vramroom-torch
//!
//! Vramroom's caching allocator as a drop-in for PyTorch: the two C functions that
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "vramroom_malloc", "vramroom_free")`
//! loads, plus C functions for statistics, the summary, snapshots, `record_stream`,
//! `empty_cache` and the OOM snapshot. `python/vramroom/torch.py` (vramroom.torch) wraps them with ctypes under
//! torch.cuda's names.
//!
//! Design note: one `CachingAllocator<CudaDevice>` per device, created on the first call that
//! names the device (lock-free afterwards: a `OnceLock` per device slot). The configuration is
//! the one given to [`vramroom_init`], or else `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`
//! read at that first call, as PyTorch does. Nothing here may unwind into C: each exported
//! function catches panics, and failures come back as null / a negative code, with the text
//! in [`vramroom_last_error`].
//!
//! PyTorch's pluggable allocator does not check the pointer `alloc_fn` returns, so an OOM
//! cannot be raised as `torch.OutOfMemoryError` from here. On OOM this library (1) keeps
//! PyTorch's exact message for `vramroom_last_error`, (2) writes a snapshot pickle when an OOM
//! snapshot path is set, (3) calls the OOM callback if one is registered, (4) prints the
//! message to stderr, and returns null.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use parking_lot::Mutex;
use vramroom_alloc::{AllocError, AllocatorConfig, HistoryMode, Snapshot};
use vramroom_cuda::{CudaAllocator, CudaDevice};

/// `ssize_t` on the platforms PyTorch supports.
#[allow(non_camel_case_types)]
pub type ssize_t = isize;

/// Devices addressable by index.
pub const MAX_DEVICES: usize = 64;

static ALLOCATORS: [OnceLock<Result<CudaAllocator, String>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];
/// Config for allocators not created yet (`None`: read the environment).
static CONFIG: Mutex<Option<AllocatorConfig>> = Mutex::new(None);
static LAST_ERROR: Mutex<Option<CString>> = Mutex::new(None);
static OOM_SNAPSHOT: Mutex<Option<std::path::PathBuf>> = Mutex::new(None);
/// History settings applied to allocators created later, too.
static HISTORY: Mutex<(HistoryMode, usize)> = Mutex::new((HistoryMode::Off, 0));

/// Called on OOM with (device, requested bytes, PyTorch's message).
pub type OomCallback = extern "C" fn(c_int, ssize_t, *const c_char);
static OOM_CALLBACK: Mutex<Option<OomCallback>> = Mutex::new(None);

fn set_error(msg: impl Into<String>) {
    let s = msg.into().replace('\0', " ");
    *LAST_ERROR.lock() = CString::new(s).ok();
}

fn config_for_new() -> Result<AllocatorConfig, String> {
    if let Some(c) = CONFIG.lock().clone() {
        return Ok(c);
    }
    AllocatorConfig::from_env().map_err(|e| e.to_string())
}

/// The allocator of `device`, created on first use.
pub fn allocator(device: c_int) -> Result<&'static CudaAllocator, String> {
    let slot = usize::try_from(device)
        .ok()
        .and_then(|i| ALLOCATORS.get(i))
        .ok_or_else(|| format!("device index {device} out of range 0..{MAX_DEVICES}"))?;
    let r = slot.get_or_init(|| {
        let cfg = config_for_new()?;
        let dev = CudaDevice::new(device).map_err(|e| e.to_string())?;
        let a = CudaAllocator::new(dev, cfg);
        let (mode, n) = *HISTORY.lock();
        if mode != HistoryMode::Off {
            a.record_memory_history(mode, n);
        }
        Ok(a)
    });
    r.as_ref().map_err(Clone::clone)
}

/// Allocators created so far, with their device index.
pub fn live_allocators() -> impl Iterator<Item = (usize, &'static CudaAllocator)> {
    ALLOCATORS
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s.get() {
            Some(Ok(a)) => Some((i, a)),
            _ => None,
        })
}

fn guard<R>(default: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            set_error("vramroom: internal panic (caught at the C boundary)");
            default
        }
    }
}

fn on_oom(device: c_int, size: ssize_t, a: &CudaAllocator, msg: &str) {
    set_error(msg);
    let path = OOM_SNAPSHOT.lock().clone();
    if let Some(p) = path {
        match vramroom_trace::pickle::write_snapshot_file(&a.snapshot(), &p) {
            Ok(()) => eprintln!("vramroom: OOM snapshot written to {}", p.display()),
            Err(e) => eprintln!("vramroom: could not write the OOM snapshot: {e}"),
        }
    }
    let cb = *OOM_CALLBACK.lock();
    if let Some(cb) = cb {
        if let Ok(c) = CString::new(msg.replace('\0', " ")) {
            cb(device, size, c.as_ptr());
        }
    }
    eprintln!("vramroom: torch.OutOfMemoryError: {msg}");
}

/// `alloc_fn` of `CUDAPluggableAllocator`: `size` bytes on `device`, for `stream`.
/// Returns null on failure (see `vramroom_last_error`).
#[no_mangle]
pub extern "C" fn vramroom_malloc(
    size: ssize_t,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if size <= 0 {
            return std::ptr::null_mut();
        }
        let a = match allocator(device) {
            Ok(a) => a,
            Err(e) => {
                set_error(&e);
                eprintln!("vramroom: {e}");
                return std::ptr::null_mut();
            }
        };
        match a.malloc(size as u64, stream as u64) {
            Ok(x) => x.ptr as *mut c_void,
            Err(e @ AllocError::OutOfMemory(_)) => {
                on_oom(device, size, a, &e.to_string());
                std::ptr::null_mut()
            }
            Err(e) => {
                set_error(e.to_string());
                eprintln!("vramroom: {e}");
                std::ptr::null_mut()
            }
        }
    })
}

/// `free_fn` of `CUDAPluggableAllocator`.
#[no_mangle]
pub extern "C" fn vramroom_free(
    ptr: *mut c_void,
    _size: ssize_t,
    device: c_int,
    _stream: *mut c_void,
) {
    guard((), || {
        if ptr.is_null() {
            return;
        }
        match allocator(device) {
            Ok(a) => {
                if let Err(e) = a.free(ptr as u64) {
                    set_error(e.to_string());
                    eprintln!("vramroom: {e}");
                }
            }
            Err(e) => set_error(e),
        }
    })
}

fn cstr_arg(p: *const c_char) -> Result<String, String> {
    if p.is_null() {
        return Ok(String::new());
    }
    // SAFETY: the caller passes a NUL-terminated string (ctypes does for `bytes`).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map(str::to_string)
        .map_err(|e| format!("argument is not UTF-8: {e}"))
}

/// Set the allocator config (PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax). Applies to devices
/// already initialised too. NULL means: read the environment. 0 on success, -1 on error.
#[no_mangle]
pub extern "C" fn vramroom_init(conf: *const c_char) -> c_int {
    guard(-1, || {
        let cfg = if conf.is_null() {
            AllocatorConfig::from_env().map_err(|e| e.to_string())
        } else {
            cstr_arg(conf).and_then(|s| AllocatorConfig::parse(&s).map_err(|e| e.to_string()))
        };
        let conf_text = cstr_arg(conf).unwrap_or_default();
        match cfg {
            Ok(c) => {
                *CONFIG.lock() = Some(c);
                for (_, a) in live_allocators() {
                    if let Err(e) = a.set_allocator_settings(&conf_text) {
                        set_error(e.to_string());
                        return -1;
                    }
                }
                0
            }
            Err(e) => {
                set_error(e);
                -1
            }
        }
    })
}

/// `Tensor.record_stream`: `ptr`'s memory is also in use on `stream`. 0 on success.
#[no_mangle]
pub extern "C" fn vramroom_record_stream(
    ptr: *mut c_void,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    guard(-1, || {
        if ptr.is_null() {
            return 0;
        }
        match allocator(device).and_then(|a| {
            a.record_stream(ptr as u64, stream as u64)
                .map_err(|e| e.to_string())
        }) {
            Ok(()) => 0,
            Err(e) => {
                set_error(e);
                -1
            }
        }
    })
}

/// `torch.cuda.empty_cache()` for one device, or all initialised ones when `device < 0`.
#[no_mangle]
pub extern "C" fn vramroom_empty_cache(device: c_int) {
    guard((), || {
        if device < 0 {
            for (_, a) in live_allocators() {
                a.empty_cache();
            }
        } else if let Ok(a) = allocator(device) {
            a.empty_cache();
        }
    })
}

fn to_c_string(s: String) -> *mut c_char {
    match CString::new(s.replace('\0', " ")) {
        Ok(c) => c.into_raw(),
        Err(_) => std::ptr::null_mut(),
    }
}

/// `torch.cuda.memory_stats(device)` as a JSON object. Free with `vramroom_string_free`.
#[no_mangle]
pub extern "C" fn vramroom_memory_stats_json(device: c_int) -> *mut c_char {
    guard(std::ptr::null_mut(), || match allocator(device) {
        Ok(a) => match serde_json::to_string(&a.memory_stats()) {
            Ok(s) => to_c_string(s),
            Err(e) => {
                set_error(e.to_string());
                std::ptr::null_mut()
            }
        },
        Err(e) => {
            set_error(e);
            std::ptr::null_mut()
        }
    })
}

/// `torch.cuda.memory_summary(device, abbreviated)`. Free with `vramroom_string_free`.
#[no_mangle]
pub extern "C" fn vramroom_memory_summary(device: c_int, abbreviated: c_int) -> *mut c_char {
    guard(std::ptr::null_mut(), || match allocator(device) {
        Ok(a) => to_c_string(a.memory_summary(abbreviated != 0)),
        Err(e) => {
            set_error(e);
            std::ptr::null_mut()
        }
    })
}

/// Reset the peak statistics (`torch.cuda.reset_peak_memory_stats`).
#[no_mangle]
pub extern "C" fn vramroom_reset_peak_memory_stats(device: c_int) -> c_int {
    guard(-1, || match allocator(device) {
        Ok(a) => {
            a.reset_peak_memory_stats();
            0
        }
        Err(e) => {
            set_error(e);
            -1
        }
    })
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)`.
#[no_mangle]
pub extern "C" fn vramroom_set_memory_fraction(fraction: f64, device: c_int) -> c_int {
    guard(-1, || {
        match allocator(device).and_then(|a| {
            a.set_per_process_memory_fraction(fraction)
                .map_err(|e| e.to_string())
        }) {
            Ok(()) => 0,
            Err(e) => {
                set_error(e);
                -1
            }
        }
    })
}

/// `_record_memory_history(enabled, max_entries)`: `mode` 0 = None, 1 = "state", 2 = "all".
/// Applies to every device, now and later.
#[no_mangle]
pub extern "C" fn vramroom_record_memory_history(mode: c_int, max_entries: usize) {
    guard((), || {
        let m = match mode {
            1 => HistoryMode::State,
            2 => HistoryMode::All,
            _ => HistoryMode::Off,
        };
        *HISTORY.lock() = (m, max_entries);
        for (_, a) in live_allocators() {
            a.record_memory_history(m, max_entries);
        }
    })
}

/// One snapshot of every initialised device, as `torch.cuda.memory._snapshot()` shapes it:
/// segments of all devices, `device_traces[i]` for device `i`.
pub fn snapshot_all() -> Snapshot {
    let mut out = Snapshot {
        segments: Vec::new(),
        device_traces: Vec::new(),
        allocator_settings: config_for_new()
            .map(|c| c.to_settings())
            .unwrap_or_else(|_| AllocatorConfig::default().to_settings()),
        external_annotations: Vec::new(),
    };
    let mut first = true;
    for (i, a) in live_allocators() {
        let s = a.snapshot();
        if first {
            out.allocator_settings = s.allocator_settings.clone();
            first = false;
        }
        out.segments.extend(s.segments);
        if out.device_traces.len() <= i {
            out.device_traces.resize(i + 1, Vec::new());
        }
        out.device_traces[i] = s.device_traces.into_iter().next().unwrap_or_default();
    }
    out
}

/// The snapshot as pickle bytes (what `pickle.dump(torch.cuda.memory._snapshot())` writes).
/// Stores the length in `*len`; free with `vramroom_bytes_free(ptr, len)`.
///
/// # Safety
/// `len` must be null or point to writable memory for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn vramroom_snapshot_pickle(len: *mut usize) -> *mut u8 {
    guard(std::ptr::null_mut(), || {
        if len.is_null() {
            set_error("len must not be null");
            return std::ptr::null_mut();
        }
        let bytes = vramroom_trace::pickle::write_snapshot(&snapshot_all()).into_boxed_slice();
        // SAFETY: len is a valid out-pointer (checked non-null).
        unsafe { *len = bytes.len() };
        Box::into_raw(bytes) as *mut u8
    })
}

/// The snapshot as JSON (Vramroom's serde form of the same data). Free with
/// `vramroom_string_free`.
#[no_mangle]
pub extern "C" fn vramroom_snapshot_json() -> *mut c_char {
    guard(std::ptr::null_mut(), || {
        match serde_json::to_string(&snapshot_all()) {
            Ok(s) => to_c_string(s),
            Err(e) => {
                set_error(e.to_string());
                std::ptr::null_mut()
            }
        }
    })
}

/// Write the snapshot pickle to `path`. 0 on success.
#[no_mangle]
pub extern "C" fn vramroom_dump_snapshot(path: *const c_char) -> c_int {
    guard(-1, || {
        let p = match cstr_arg(path) {
            Ok(p) if !p.is_empty() => p,
            Ok(_) => {
                set_error("empty path");
                return -1;
            }
            Err(e) => {
                set_error(e);
                return -1;
            }
        };
        match vramroom_trace::pickle::write_snapshot_file(&snapshot_all(), std::path::Path::new(&p))
        {
            Ok(()) => 0,
            Err(e) => {
                set_error(e.to_string());
                -1
            }
        }
    })
}

/// Write a snapshot to `path` whenever an allocation fails with OOM (NULL or "" turns it off).
#[no_mangle]
pub extern "C" fn vramroom_set_oom_snapshot(path: *const c_char) -> c_int {
    guard(-1, || match cstr_arg(path) {
        Ok(p) => {
            *OOM_SNAPSHOT.lock() = if p.is_empty() { None } else { Some(p.into()) };
            0
        }
        Err(e) => {
            set_error(e);
            -1
        }
    })
}

/// Register a function called on every OOM (NULL removes it). It runs on the allocating
/// thread, outside the allocator's lock, so it may call the functions here.
#[no_mangle]
pub extern "C" fn vramroom_set_oom_callback(cb: Option<OomCallback>) {
    *OOM_CALLBACK.lock() = cb;
}

/// The last error's text (PyTorch's OOM message after an OOM), or NULL. Free with
/// `vramroom_string_free`.
#[no_mangle]
pub extern "C" fn vramroom_last_error() -> *mut c_char {
    guard(std::ptr::null_mut(), || match LAST_ERROR.lock().as_ref() {
        Some(c) => c.clone().into_raw(),
        None => std::ptr::null_mut(),
    })
}

/// Forget the last error.
#[no_mangle]
pub extern "C" fn vramroom_clear_error() {
    *LAST_ERROR.lock() = None;
}

/// Number of CUDA devices (0 without a driver).
#[no_mangle]
pub extern "C" fn vramroom_device_count() -> c_int {
    guard(0, vramroom_cuda::device_count)
}

/// Free a string returned by this library.
///
/// # Safety
/// `s` must be null or a string this library returned, not freed before.
#[no_mangle]
pub unsafe extern "C" fn vramroom_string_free(s: *mut c_char) {
    if s.is_null() {
        return;
    }
    // SAFETY: s came from `CString::into_raw` in this library and is freed once.
    drop(unsafe { CString::from_raw(s) });
}

/// Free bytes returned by `vramroom_snapshot_pickle`.
///
/// # Safety
/// `p`/`len` must be null or exactly what `vramroom_snapshot_pickle` returned, not freed
/// before.
#[no_mangle]
pub unsafe extern "C" fn vramroom_bytes_free(p: *mut u8, len: usize) {
    if p.is_null() {
        return;
    }
    // SAFETY: p/len came from `Box<[u8]>::into_raw` in `vramroom_snapshot_pickle`.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)) });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(s: *mut c_char) -> Option<String> {
        if s.is_null() {
            return None;
        }
        // SAFETY: strings from this library.
        let t = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
        // SAFETY: returned by this library, freed once.
        unsafe { vramroom_string_free(s) };
        Some(t)
    }

    #[test]
    fn entry_points_fail_cleanly_without_a_gpu() {
        if vramroom_cuda::unavailable_reason().is_none() {
            eprintln!("SKIP: a GPU is present (tests/torch.py covers it)");
            return;
        }
        assert!(vramroom_malloc(1024, 0, std::ptr::null_mut()).is_null());
        let e = take(vramroom_last_error()).unwrap();
        assert!(e.contains("CUDA") || e.contains("device"), "{e}");
        vramroom_free(std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
        vramroom_free(8 as *mut c_void, 0, 0, std::ptr::null_mut());
        assert!(vramroom_memory_stats_json(0).is_null());
        assert!(vramroom_memory_summary(0, 0).is_null());
        assert_eq!(
            vramroom_record_stream(8 as *mut c_void, 0, std::ptr::null_mut()),
            -1
        );
        assert!(vramroom_malloc(1024, -1, std::ptr::null_mut()).is_null());
        assert!(vramroom_malloc(1024, 1000, std::ptr::null_mut()).is_null());
        vramroom_empty_cache(-1);
        assert_eq!(vramroom_device_count(), 0);
        let mut n = 0usize;
        // SAFETY: n is a valid out-pointer; p/n are freed once.
        let p = unsafe { vramroom_snapshot_pickle(&mut n) };
        assert!(!p.is_null() && n > 0);
        unsafe { vramroom_bytes_free(p, n) };
        let j = take(vramroom_snapshot_json()).unwrap();
        assert!(j.contains("\"segments\":[]"), "{j}");
    }

    #[test]
    fn init_parses_pytorch_config_syntax() {
        let good = CString::new("expandable_segments:True,max_split_size_mb:128").unwrap();
        assert_eq!(vramroom_init(good.as_ptr()), 0);
        let bad = CString::new("expandable_segments:maybe").unwrap();
        assert_eq!(vramroom_init(bad.as_ptr()), -1);
        assert!(take(vramroom_last_error()).is_some());
        let none = CString::new("").unwrap();
        assert_eq!(vramroom_init(none.as_ptr()), 0);
    }
}
