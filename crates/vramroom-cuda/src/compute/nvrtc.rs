//! Compiling kernels.cu (and flash.cu, appended to it) with NVRTC, with an on-disk cache.
//!
//! Design note: the kernels are compiled at run time for the exact GPU (`sm_XY` from the
//! device's compute capability) straight to a CUBIN, so loading needs no PTX JIT. Compiling
//! takes seconds, and a test suite or a load test opens many devices in many processes, so
//! the CUBIN is cached on disk, keyed by a hash of the source, the architecture and the NVRTC
//! version (`$VRAMROOM_CACHE_DIR`, else `$XDG_CACHE_HOME/vramroom`, else
//! `~/.cache/vramroom`). A cache that cannot be read or written is skipped silently: it only
//! saves time.

use std::ffi::{CStr, CString};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use cudarc::nvrtc::sys as nv;

use super::libs::{ensure, Lib};
use crate::driver::CudaError;

/// The kernel source: kernels.cu, then the fast attention kernels of flash.cu (which use its
/// descriptors and helpers), compiled as one program into one module.
pub const SOURCE: &str = concat!(include_str!("kernels.cu"), include_str!("flash.cu"));

/// Where kernel `name`'s parameter list starts in [`SOURCE`] (just past `name(` on a line
/// `__global__ void [__launch_bounds__(..)] name(`), for the tests that check the launch
/// table and each launch's argument count against the source.
#[cfg(test)]
pub(crate) fn kernel_params(name: &str) -> Option<usize> {
    let call = format!(" {name}(");
    SOURCE
        .match_indices(&call)
        .map(|(i, _)| i)
        .find(|&i| {
            let line = SOURCE[..i].rfind('\n').map_or(0, |n| n + 1);
            SOURCE[line..i].contains("__global__ void")
        })
        .map(|i| i + call.len())
}

fn nvrtc_check(call: &'static str, r: nv::nvrtcResult) -> Result<(), CudaError> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::LibraryCall {
            call,
            status: format!("{r:?}"),
        })
    }
}

/// NVRTC's version, (major, minor).
pub fn version() -> Result<(i32, i32), CudaError> {
    ensure(Lib::Nvrtc)?;
    // SAFETY: the library is loaded; every nvrtc symbol used here exists since CUDA 11.
    crate::driver::require_symbols(
        unsafe { nv::culib() },
        "NVRTC",
        &[
            "nvrtcVersion",
            "nvrtcCreateProgram",
            "nvrtcCompileProgram",
            "nvrtcGetProgramLogSize",
            "nvrtcGetProgramLog",
            "nvrtcGetCUBINSize",
            "nvrtcGetCUBIN",
            "nvrtcDestroyProgram",
        ],
    )?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: out-pointers.
    nvrtc_check("nvrtcVersion", unsafe { nv::nvrtcVersion(&mut a, &mut b) })?;
    Ok((a, b))
}

fn cache_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("VRAMROOM_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Ok(d) = std::env::var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("vramroom"));
    }
    std::env::var("HOME")
        .ok()
        .map(|h| PathBuf::from(h).join(".cache").join("vramroom"))
}

/// The CUBIN of `src` for `sm_{major}{minor}`, from the cache or freshly compiled.
pub fn cubin(src: &str, arch: (i32, i32)) -> Result<Vec<u8>, CudaError> {
    let ver = version()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    src.hash(&mut h);
    arch.hash(&mut h);
    ver.hash(&mut h);
    let key = format!("kernels-sm{}{}-{:016x}.cubin", arch.0, arch.1, h.finish());
    let path = cache_dir().map(|d| d.join(&key));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let bin = compile(src, arch)?;
    if let Some(p) = &path {
        if let Some(dir) = p.parent() {
            if std::fs::create_dir_all(dir).is_ok() {
                // atomic for a regular file, and never replacing a link or device there;
                // a cache that cannot be written is only a slower next start
                if let Err(e) = vramroom_alloc::output::write_file(p, &bin) {
                    tracing::debug!("kernel cache {} not written: {e}", p.display());
                }
            }
        }
    }
    Ok(bin)
}

/// Compile `src` to a CUBIN for `sm_{major}{minor}` (no cache). Public so that tests can
/// check the source compiles on machines that have NVRTC but no GPU.
pub fn compile(src: &str, arch: (i32, i32)) -> Result<Vec<u8>, CudaError> {
    version()?;
    let csrc = CString::new(src).map_err(|_| CudaError::Compile("NUL in source".into()))?;
    let name = c"vramroom_kernels.cu";
    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid C strings; no headers.
    nvrtc_check("nvrtcCreateProgram", unsafe {
        nv::nvrtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    struct Prog(nv::nvrtcProgram);
    impl Drop for Prog {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            unsafe { nv::nvrtcDestroyProgram(&mut self.0) };
        }
    }
    let prog = Prog(prog);
    let opts = [
        CString::new(format!("--gpu-architecture=sm_{}{}", arch.0, arch.1)).unwrap_or_default(),
        CString::new("-std=c++17").unwrap_or_default(),
    ];
    let ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: prog is live; options are valid C strings that outlive the call.
    let rc = unsafe { nv::nvrtcCompileProgram(prog.0, ptrs.len() as i32, ptrs.as_ptr()) };
    if rc != nv::nvrtcResult::NVRTC_SUCCESS {
        let mut n = 0usize;
        // SAFETY: prog is live; out-pointer.
        unsafe { nv::nvrtcGetProgramLogSize(prog.0, &mut n) };
        let mut log = vec![0 as std::ffi::c_char; n.max(1)];
        // SAFETY: log has n bytes.
        unsafe { nv::nvrtcGetProgramLog(prog.0, log.as_mut_ptr()) };
        // SAFETY: NVRTC NUL-terminates the log.
        let text = unsafe { CStr::from_ptr(log.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        return Err(CudaError::Compile(format!("{rc:?}: {text}")));
    }
    let mut n = 0usize;
    // SAFETY: compiled program; out-pointer.
    nvrtc_check("nvrtcGetCUBINSize", unsafe {
        nv::nvrtcGetCUBINSize(prog.0, &mut n)
    })?;
    let mut bin = vec![0u8; n];
    // SAFETY: bin has n bytes.
    nvrtc_check("nvrtcGetCUBIN", unsafe {
        nv::nvrtcGetCUBIN(prog.0, bin.as_mut_ptr() as *mut std::ffi::c_char)
    })?;
    Ok(bin)
}
