//! `vramroom._native`: the Python API of the wheel, over the Rust crates.
//!
//! Design note: every function is a thin call into vramroom-trace / vramroom-workload, the same
//! calls the CLI makes, so `vramroom.replay(...)` and `vramroom replay --json` give the same
//! numbers (python/tests/ compares them on ../shared/traces/). Results cross into Python as
//! JSON text turned into dicts by Python's `json` module: the CLI's `--json` objects, with no
//! second, hand-written conversion to drift from them. Work runs with the GIL released, so a
//! replay in a thread does not stall the interpreter. Errors: bad input (config, size, model
//! name) raises `ValueError`, an unreadable file `OSError`, a broken trace `ValueError` naming
//! it. The config default is explicit: `alloc_conf=None` is the snapshot's own config (replay)
//! or PyTorch's default (predict); `PYTORCH_CUDA_ALLOC_CONF` is read by the CLI, not here,
//! because a library call should not change meaning with its caller's environment.

use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use vramroom_alloc::size::parse_size;
use vramroom_alloc::AllocatorConfig;
use vramroom_trace::recommend::{recommended, CANDIDATE_CONFS};
use vramroom_trace::{ReplayOptions, ReplayResult, Snapshot};
use vramroom_workload::{
    max_batch as workload_max_batch, predict as workload_predict, PredictDevice, WorkloadFlags,
};

/// A trace handed in: a path (str or os.PathLike) or the pickle's bytes.
enum Trace {
    Path(PathBuf),
    Bytes(Vec<u8>),
}

fn trace_arg(obj: &Bound<'_, PyAny>) -> PyResult<Trace> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Trace::Bytes(b.as_bytes().to_vec()));
    }
    let os = obj.py().import("os")?;
    let p: PathBuf = os.call_method1("fspath", (obj,))?.extract()?;
    Ok(Trace::Path(p))
}

/// The trace read: a snapshot pickle, or an RMM CSV log (a path ending in `.csv`), as the
/// CLI reads them.
fn load(trace: &Trace) -> PyResult<Snapshot> {
    match trace {
        Trace::Bytes(b) => vramroom_trace::read_snapshot(b)
            .map_err(|e| PyValueError::new_err(format!("cannot read snapshot: {e}"))),
        Trace::Path(p) => {
            if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    PyOSError::new_err(format!("cannot read RMM log {}: {e}", p.display()))
                })?;
                let ev = vramroom_trace::read_rmm_csv(&text).map_err(|e| {
                    PyValueError::new_err(format!("cannot read RMM log {}: {e}", p.display()))
                })?;
                return Ok(vramroom_trace::snapshot_from_rmm(&ev));
            }
            if let Err(e) = std::fs::metadata(p) {
                return Err(PyOSError::new_err(format!(
                    "cannot read snapshot {}: {e}",
                    p.display()
                )));
            }
            vramroom_trace::read_snapshot_file(p).map_err(|e| {
                PyValueError::new_err(format!("cannot read snapshot {}: {e}", p.display()))
            })
        }
    }
}

fn conf(s: &str) -> PyResult<AllocatorConfig> {
    let s = s.trim();
    if s.is_empty() || s == "default" {
        return Ok(AllocatorConfig::default());
    }
    AllocatorConfig::parse(s)
        .map_err(|e| PyValueError::new_err(format!("bad alloc_conf '{s}': {e}")))
}

/// `capacity=`: bytes as an int, or a size string ("80GiB", "24GB").
fn capacity_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(obj) = obj else { return Ok(None) };
    if obj.is_none() {
        return Ok(None);
    }
    let v = if let Ok(n) = obj.extract::<u64>() {
        n
    } else {
        let s: String = obj.extract().map_err(|_| {
            PyValueError::new_err("capacity must be bytes (int) or a size string such as '80GiB'")
        })?;
        parse_size(&s).map_err(|e| PyValueError::new_err(format!("bad capacity '{s}': {e}")))?
    };
    if v == 0 {
        return Err(PyValueError::new_err("capacity must be greater than 0"));
    }
    Ok(Some(v))
}

/// The CLI's name for a config: what is in force, "default" for PyTorch's default.
fn label(c: &AllocatorConfig) -> String {
    let s = c.conf_string();
    if s.trim().is_empty() {
        "default".into()
    } else {
        s
    }
}

fn replay_err(e: vramroom_trace::ReplayError) -> PyErr {
    PyValueError::new_err(format!("replay failed: {e}"))
}

/// JSON text into Python objects.
fn to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(v)
        .map_err(|e| PyValueError::new_err(format!("cannot encode result: {e}")))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// One replay row as the CLI's `replay --json` prints it.
fn row(label: &str, r: &ReplayResult) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        // The CLI adds this too; the snapshot's own recording of settings is not repeated.
        o.insert("alloc_conf".into(), label.into());
    }
    v
}

fn options(config: AllocatorConfig, capacity: Option<u64>) -> ReplayOptions {
    ReplayOptions {
        config,
        capacity,
        stop_at_oom: true,
        record_history: false,
        ..ReplayOptions::default()
    }
}

/// replay(trace, alloc_conf=None, capacity=None, min_capacity=False) -> dict
///
/// Replays a PyTorch memory snapshot (a path, or the pickle's bytes; a `.csv` path is an RMM
/// log) through Vramroom's allocator, as `vramroom replay --json` does. alloc_conf: a
/// PYTORCH_CUDA_ALLOC_CONF string ("" or "default": PyTorch's default; None: the snapshot's
/// own). capacity: bytes or a size string (None: the recording's GPU). min_capacity=True adds
/// `min_capacity_bytes`. Returns the row as a dict (peak_allocated_bytes,
/// peak_reserved_bytes, num_ooms, oom_event, stats, alloc_conf, ...).
#[pyfunction]
#[pyo3(signature = (trace, alloc_conf=None, capacity=None, min_capacity=false))]
fn replay(
    py: Python<'_>,
    trace: &Bound<'_, PyAny>,
    alloc_conf: Option<&str>,
    capacity: Option<&Bound<'_, PyAny>>,
    min_capacity: bool,
) -> PyResult<Py<PyAny>> {
    let t = trace_arg(trace)?;
    let cap = capacity_arg(capacity)?;
    let explicit = alloc_conf.map(conf).transpose()?;
    let v = py.detach(|| -> PyResult<serde_json::Value> {
        let snap = load(&t)?;
        let c = match explicit {
            Some(c) => c,
            None => AllocatorConfig::from_settings(&snap.allocator_settings).map_err(|e| {
                PyValueError::new_err(format!("the snapshot's allocator_settings: {e}"))
            })?,
        };
        let opts = options(c.clone(), cap);
        let mut r = vramroom_trace::replay(&snap, &opts).map_err(replay_err)?;
        if min_capacity {
            r.min_capacity_bytes =
                Some(vramroom_trace::min_capacity(&snap, &opts).map_err(replay_err)?);
        }
        Ok(row(&label(&c), &r))
    })?;
    to_py(py, &v)
}

/// min_capacity(trace, alloc_conf=None) -> int
///
/// The smallest GPU (bytes, to 2 MiB) on which the trace replays without an OOM, as
/// `vramroom replay --min-capacity` searches it. Passing it as `capacity=` never OOMs.
#[pyfunction]
#[pyo3(signature = (trace, alloc_conf=None))]
fn min_capacity(
    py: Python<'_>,
    trace: &Bound<'_, PyAny>,
    alloc_conf: Option<&str>,
) -> PyResult<u64> {
    let t = trace_arg(trace)?;
    let explicit = alloc_conf.map(conf).transpose()?;
    py.detach(|| {
        let snap = load(&t)?;
        let c = match explicit {
            Some(c) => c,
            None => vramroom_trace::replay::own_config(&snap),
        };
        vramroom_trace::min_capacity(&snap, &options(c, None)).map_err(replay_err)
    })
}

/// recommend(trace, alloc_confs=None, capacity=None) -> dict
///
/// Replays the trace under its own config and candidate configs (or the given list), as
/// `vramroom replay --recommend`, and returns {"recommended": conf or None, "results": [rows,
/// each with "recommended": bool]}. The pick: no OOM, then the lowest peak reserved.
#[pyfunction]
#[pyo3(signature = (trace, alloc_confs=None, capacity=None))]
fn recommend(
    py: Python<'_>,
    trace: &Bound<'_, PyAny>,
    alloc_confs: Option<Vec<String>>,
    capacity: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let t = trace_arg(trace)?;
    let cap = capacity_arg(capacity)?;
    let given: Option<Vec<AllocatorConfig>> = alloc_confs
        .map(|l| l.iter().map(|c| conf(c)).collect())
        .transpose()?;
    let v = py.detach(|| -> PyResult<serde_json::Value> {
        let snap = load(&t)?;
        let own = AllocatorConfig::from_settings(&snap.allocator_settings).map_err(|e| {
            PyValueError::new_err(format!("the snapshot's allocator_settings: {e}"))
        })?;
        let mut configs = vec![own];
        match given {
            Some(g) => configs.extend(g),
            None => {
                for c in CANDIDATE_CONFS {
                    configs.push(conf(c)?);
                }
            }
        }
        let mut seen = Vec::new();
        configs.retain(|c| {
            let l = label(c);
            let new = !seen.contains(&l);
            seen.push(l);
            new
        });
        let mut results = Vec::new();
        for c in &configs {
            let r = vramroom_trace::replay(&snap, &options(c.clone(), cap)).map_err(replay_err)?;
            results.push((label(c), r));
        }
        let pick = recommended(&results);
        let rows: Vec<serde_json::Value> = results
            .iter()
            .enumerate()
            .map(|(i, (l, r))| {
                let mut v = row(l, r);
                if let Some(o) = v.as_object_mut() {
                    o.insert("recommended".into(), (pick == Some(i)).into());
                }
                v
            })
            .collect();
        Ok(serde_json::json!({
            "recommended": pick.map(|i| results[i].0.clone()),
            "results": rows,
        }))
    })?;
    to_py(py, &v)
}

/// summary(trace, alloc_conf=None, capacity=None, abbreviated=False) -> str
///
/// PyTorch's `torch.cuda.memory_summary()` table after replaying the trace, as
/// `vramroom summary` prints it.
#[pyfunction]
#[pyo3(signature = (trace, alloc_conf=None, capacity=None, abbreviated=false))]
fn summary(
    py: Python<'_>,
    trace: &Bound<'_, PyAny>,
    alloc_conf: Option<&str>,
    capacity: Option<&Bound<'_, PyAny>>,
    abbreviated: bool,
) -> PyResult<String> {
    let t = trace_arg(trace)?;
    let cap = capacity_arg(capacity)?;
    let explicit = alloc_conf.map(conf).transpose()?;
    py.detach(|| {
        let snap = load(&t)?;
        let c = match explicit {
            Some(c) => c,
            None => AllocatorConfig::from_settings(&snap.allocator_settings).map_err(|e| {
                PyValueError::new_err(format!("the snapshot's allocator_settings: {e}"))
            })?,
        };
        let r = vramroom_trace::replay(&snap, &options(c, cap)).map_err(replay_err)?;
        let stats = vramroom_alloc::DeviceStats::from_memory_stats(&r.stats);
        Ok(vramroom_alloc::summary::memory_summary(
            &stats,
            0,
            abbreviated,
        ))
    })
}

/// predict(model=None, batch=None, seq=None, mode=None, grad=False, optimizer=None,
///         accum=None, accum_pattern=None, dtype=None, seed=None, new=None, cache=None,
///         use_cache=None, steps=None, alloc_conf=None, capacity=None, find_max_batch=False) -> dict
///
/// One request of a workload on the meta device (no GPU), as `vramroom predict --json`,
/// with the same arguments as its flags (None: the flag left out): model is a zoo name or
/// the path of a Hugging Face config.json (or its folder); seq an int or a distribution
/// ("uniform:16..128"); mode "infer", "train" or "generate"; grad=True is `--grad-on`.
/// Returns {"scenario", "size", "batch", "peak_allocated_bytes", "peak_reserved_bytes",
/// "base_bytes", "peak_over_base_bytes", "categories", "stats"}. An out-of-memory under
/// `capacity` raises MemoryError; find_max_batch=True (needs capacity) returns the largest batch
/// that fits.
#[pyfunction]
#[pyo3(signature = (model=None, batch=None, seq=None, mode=None, grad=false, optimizer=None,
    accum=None, accum_pattern=None, dtype=None, seed=None, new=None, cache=None,
    use_cache=None, steps=None, alloc_conf=None, capacity=None, find_max_batch=false))]
#[allow(clippy::too_many_arguments)]
fn predict(
    py: Python<'_>,
    model: Option<&Bound<'_, PyAny>>,
    batch: Option<usize>,
    seq: Option<&Bound<'_, PyAny>>,
    mode: Option<String>,
    grad: bool,
    optimizer: Option<String>,
    accum: Option<usize>,
    accum_pattern: Option<String>,
    dtype: Option<String>,
    seed: Option<u64>,
    new: Option<usize>,
    cache: Option<String>,
    use_cache: Option<bool>,
    steps: Option<usize>,
    alloc_conf: Option<&str>,
    capacity: Option<&Bound<'_, PyAny>>,
    find_max_batch: bool,
) -> PyResult<Py<PyAny>> {
    let model = match model {
        None => None,
        Some(m) if m.is_none() => None,
        Some(m) => match m.extract::<String>() {
            Ok(s) => Some(s),
            Err(_) => {
                let os = py.import("os")?;
                Some(os.call_method1("fspath", (m,))?.extract::<String>()?)
            }
        },
    };
    let seq = match seq {
        None => None,
        Some(s) if s.is_none() => None,
        Some(s) => Some(match s.extract::<usize>() {
            Ok(n) => n.to_string(),
            Err(_) => s.extract::<String>().map_err(|_| {
                PyValueError::new_err(
                    "seq must be an int or a distribution such as 'uniform:16..128'",
                )
            })?,
        }),
    };
    let flags = WorkloadFlags {
        model,
        batch,
        seq,
        mode,
        optimizer,
        accum,
        accum_pattern,
        dtype,
        seed,
        new_tokens: new,
        cache,
        use_cache,
        grad_on: grad,
        ..WorkloadFlags::default()
    };
    let mut sc = flags
        .scenario()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let cap = capacity_arg(capacity)?;
    if find_max_batch && cap.is_none() {
        return Err(PyValueError::new_err("find_max_batch needs capacity"));
    }
    let mut dev = PredictDevice {
        alloc_conf: alloc_conf.map(conf).transpose()?.unwrap_or_default(),
        steps,
        ..PredictDevice::default()
    };
    if let Some(c) = cap {
        dev.capacity = c;
    }
    let v = py.detach(|| -> PyResult<serde_json::Value> {
        let p = if find_max_batch {
            match workload_max_batch(&sc, &dev, 1 << 20)
                .map_err(|e| PyValueError::new_err(e.to_string()))?
            {
                Some((b, p)) => {
                    sc.batch = b;
                    p
                }
                None => {
                    return Err(pyo3::exceptions::PyMemoryError::new_err(
                        "batch 1 does not fit in capacity",
                    ))
                }
            }
        } else {
            match workload_predict(&sc, &dev) {
                Ok(p) => p,
                Err(e) if e.is_oom() => {
                    return Err(pyo3::exceptions::PyMemoryError::new_err(format!(
                        "out of memory: {e}"
                    )))
                }
                Err(e) => return Err(PyValueError::new_err(e.to_string())),
            }
        };
        Ok(p.to_json(&sc))
    })?;
    to_py(py, &v)
}

/// diff(base, new, top=10) -> dict
///
/// Two snapshots compared, as `vramroom diff --json` (one serialization, vramroom-trace's
/// `report_json`, so the keys are the same): `base` and `new` with their `path` (None for
/// bytes) and `figures` (peak_allocated, peak_reserved, fragmentation, oom_count,
/// device_allocs), `thresholds` (empty: gates are the CLI's), `has_stacks`, and the `top`
/// allocation sites whose bytes at the peak changed most (`top_sites`).
#[pyfunction]
#[pyo3(signature = (base, new, top = 10))]
fn diff(
    py: Python<'_>,
    base: &Bound<'_, PyAny>,
    new: &Bound<'_, PyAny>,
    top: usize,
) -> PyResult<Py<PyAny>> {
    let (b, n) = (trace_arg(base)?, trace_arg(new)?);
    let v = py.detach(|| -> PyResult<serde_json::Value> {
        let d = vramroom_trace::diff::diff(&load(&b)?, &load(&n)?).map_err(replay_err)?;
        let path = |t: &Trace| match t {
            Trace::Path(p) => Some(p.display().to_string()),
            Trace::Bytes(_) => None,
        };
        let (bp, np) = (path(&b), path(&n));
        Ok(d.to_json(bp.as_deref(), np.as_deref(), &[], top))
    })?;
    to_py(py, &v)
}

/// parse_size(text) -> int: a byte size as every Vramroom flag reads it ("2GiB", "80GB").
#[pyfunction]
fn parse_size_py(text: &str) -> PyResult<u64> {
    parse_size(text).map_err(|e| PyValueError::new_err(format!("bad size '{text}': {e}")))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(min_capacity, m)?)?;
    m.add_function(wrap_pyfunction!(recommend, m)?)?;
    m.add_function(wrap_pyfunction!(summary, m)?)?;
    m.add_function(wrap_pyfunction!(predict, m)?)?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    let f = wrap_pyfunction!(parse_size_py, m)?;
    m.add("parse_size", f)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
