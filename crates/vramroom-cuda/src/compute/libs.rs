//! Finding the CUDA libraries (NVRTC, cuBLAS, cuDNN) at run time.
//!
//! Design note: cudarc opens each library by its soname (`libnvrtc.so.13`, `libcublas.so.13`,
//! `libcudnn.so.9`) and panics when it is missing. Before that first open, [`ensure`] checks
//! presence with cudarc's own `is_culib_present`, and when the plain name is not on the
//! loader's path it looks in the usual install places and opens the file by its full path:
//! glibc then hands cudarc that already-loaded copy when it asks for the soname. A library
//! that cannot be found becomes a typed [`CudaError::Library`] naming what was searched, so a
//! machine without CUDA (or with only a driver) gets an error, never a panic.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::driver::CudaError;

/// The libraries the compute side uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lib {
    Nvrtc,
    Cublas,
    Cudnn,
}

impl Lib {
    pub fn name(self) -> &'static str {
        match self {
            Lib::Nvrtc => "NVRTC",
            Lib::Cublas => "cuBLAS",
            Lib::Cudnn => "cuDNN",
        }
    }
    /// The file cudarc opens.
    fn soname(self) -> &'static str {
        match self {
            Lib::Nvrtc => "libnvrtc.so.13",
            Lib::Cublas => "libcublas.so.13",
            Lib::Cudnn => "libcudnn.so.9",
        }
    }
    /// Files to open from a folder, in dependency order: the library and what it opens by
    /// name at run time (NVRTC its builtins, cuBLAS cuBLASLt, cuDNN its sub-libraries), so
    /// that those name lookups find the copies already loaded.
    fn prefixes(self) -> &'static [&'static str] {
        match self {
            Lib::Nvrtc => &["libnvrtc-builtins.so.13", "libnvrtc.so.13"],
            Lib::Cublas => &["libcublasLt.so.13", "libcublas.so.13"],
            Lib::Cudnn => &[
                "libcudnn_graph.so.9",
                "libcudnn_engines_precompiled.so.9",
                "libcudnn_engines_runtime_compiled.so.9",
                "libcudnn_heuristic.so.9",
                "libcudnn_ops.so.9",
                "libcudnn_cnn.so.9",
                "libcudnn_adv.so.9",
                "libcudnn.so.9",
            ],
        }
    }
    fn present(self) -> bool {
        // SAFETY: each only tries dlopen on candidate names and drops the handle.
        unsafe {
            match self {
                Lib::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Lib::Cublas => cudarc::cublas::sys::is_culib_present(),
                Lib::Cudnn => cudarc::cudnn::sys::is_culib_present(),
            }
        }
    }
}

/// Directories searched when a library is not on the loader's path: `VRAMROOM_CUDA_LIB_DIRS`
/// (colon-separated), `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`, and the `nvidia/*/lib`
/// folders of a Python environment given by `VRAMROOM_PYTHON_SITE` (where pip's CUDA wheels,
/// the ones PyTorch uses, put them).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(v) = std::env::var("VRAMROOM_CUDA_LIB_DIRS") {
        dirs.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            dirs.push(Path::new(&v).join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    if let Ok(site) = std::env::var("VRAMROOM_PYTHON_SITE") {
        let nv = Path::new(&site).join("nvidia");
        if let Ok(rd) = std::fs::read_dir(&nv) {
            for e in rd.flatten() {
                dirs.push(e.path().join("lib"));
            }
        }
    }
    dirs
}

static STATE: OnceLock<Mutex<std::collections::HashMap<Lib, Result<(), CudaError>>>> =
    OnceLock::new();

/// Make `lib` loadable by cudarc, or say why it is not. Cached per process.
pub fn ensure(lib: Lib) -> Result<(), CudaError> {
    let m = STATE.get_or_init(|| Mutex::new(std::collections::HashMap::new()));
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = g.get(&lib) {
        return r.clone();
    }
    let r = find(lib);
    g.insert(lib, r.clone());
    r
}

fn find(lib: Lib) -> Result<(), CudaError> {
    if lib.present() {
        return Ok(());
    }
    let dirs = search_dirs();
    for dir in &dirs {
        if !dir.join(lib.soname()).exists() {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        for prefix in lib.prefixes() {
            for name in names.iter().filter(|n| n.starts_with(prefix)) {
                // SAFETY: loading a CUDA library runs its initialisers, which is what any user
                // of the library does; the handle is leaked so the code stays mapped for the
                // life of the process (cudarc keeps its own handle to the same object).
                if let Ok(l) = unsafe { libloading::Library::new(dir.join(name)) } {
                    std::mem::forget(l);
                }
            }
        }
        if lib.present() {
            return Ok(());
        }
    }
    Err(CudaError::Library {
        lib: lib.name(),
        why: format!(
            "{} not found on the loader path nor in {} (set VRAMROOM_CUDA_LIB_DIRS or \
             LD_LIBRARY_PATH to the folder that holds it)",
            lib.soname(),
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}
