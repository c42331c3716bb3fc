//! A small safetensors reader and writer (the format: an 8-byte little-endian header
//! length, a JSON header `{name: {dtype, shape, data_offsets: [begin, end]}}` with an
//! optional `__metadata__`, then the raw little-endian bytes).
//!
//! Design note: written here rather than pulled in because the format is tiny and the
//! tensors must be created through this runtime's allocator (tagged `parameter`). On the
//! meta device loading creates the tensors by shape only, which sizes a checkpoint without
//! reading its bytes.

use std::collections::BTreeMap;
use std::path::Path;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::memory::{category_scope, MemoryCategory};
use crate::nn::Module;
use crate::tensor::Tensor;

const OP: &str = "safetensors";

fn code(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I64 => "I64",
        DType::I32 => "I32",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
    }
}

fn from_code(s: &str) -> Result<DType> {
    Ok(match s {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I64" => DType::I64,
        "I32" => DType::I32,
        "U8" => DType::U8,
        "BOOL" => DType::Bool,
        other => {
            return Err(TensorError::invalid(
                OP,
                format!("unsupported dtype {other}"),
            ))
        }
    })
}

fn encode(d: DType, vals: &[f64], out: &mut Vec<u8>) {
    for &v in vals {
        match d {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::U8 => out.push(v as u8),
            DType::Bool => out.push((v != 0.0) as u8),
        }
    }
}

/// Little-endian safetensors bytes of `d` as f64 values (the loaders' common currency).
pub(crate) fn decode(d: DType, b: &[u8]) -> Vec<f64> {
    match d {
        DType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        DType::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DType::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DType::I64 => b
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                i64::from_le_bytes(a) as f64
            })
            .collect(),
        DType::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        DType::U8 | DType::Bool => b.iter().map(|&x| x as f64).collect(),
    }
}

/// Serialises named tensors (data must be readable: not the meta device).
pub fn serialize(tensors: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, t) in tensors {
        let begin = data.len();
        encode(t.dtype(), &t.to_vec_f64()?, &mut data);
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": code(t.dtype()),
                "shape": t.shape(),
                "data_offsets": [begin, data.len()],
            }),
        );
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    // The spec pads the header with spaces to an 8-byte boundary.
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + data.len());
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    Ok(out)
}

/// Parses a safetensors buffer into tensors on `device` (tagged `parameter`).
pub fn deserialize(bytes: &[u8], device: &Device) -> Result<Vec<(String, Tensor)>> {
    let bad = |m: String| TensorError::invalid(OP, m);
    if bytes.len() < 8 {
        return Err(bad("file shorter than its 8-byte header length".into()));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&bytes[..8]);
    let hlen = u64::from_le_bytes(n) as usize;
    let hend = 8usize
        .checked_add(hlen)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad(format!("header length {hlen} past the end of the file")))?;
    let header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&bytes[8..hend])
        .map_err(|e| bad(format!("bad header JSON: {e}")))?;
    let data = &bytes[hend..];
    let _c = category_scope(MemoryCategory::Parameter);
    let mut out = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = from_code(info["dtype"].as_str().unwrap_or(""))?;
        let shape: Vec<usize> = info["shape"]
            .as_array()
            .ok_or_else(|| bad(format!("{name}: no shape")))?
            .iter()
            .map(|v| v.as_u64().map(|x| x as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("{name}: bad shape")))?;
        let offs = info["data_offsets"]
            .as_array()
            .and_then(|a| Some((a.first()?.as_u64()? as usize, a.get(1)?.as_u64()? as usize)))
            .ok_or_else(|| bad(format!("{name}: bad data_offsets")))?;
        let numel: usize = shape.iter().product();
        if offs.0 > offs.1 || offs.1 > data.len() || offs.1 - offs.0 != numel * dtype.size() {
            return Err(bad(format!(
                "{name}: data_offsets {offs:?} do not fit {numel} x {} bytes in {} bytes",
                dtype.size(),
                data.len()
            )));
        }
        let t = Tensor::empty(&shape, dtype, device)?;
        if !device.is_meta() {
            t.copy_from_f64(&decode(dtype, &data[offs.0..offs.1]))?;
        }
        out.push((name, t));
    }
    Ok(out)
}

pub fn save(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    let b = serialize(tensors)?;
    std::fs::write(path.as_ref(), b)
        .map_err(|e| TensorError::invalid(OP, format!("{}: {e}", path.as_ref().display())))
}

pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    let b = std::fs::read(path.as_ref())
        .map_err(|e| TensorError::invalid(OP, format!("{}: {e}", path.as_ref().display())))?;
    deserialize(&b, device)
}

/// Loads a checkpoint into a module by state_dict name. Entries the module does not have as
/// parameters or buffers are ignored only when `strict` is false (HF files carry e.g.
/// `lm_head.weight` for a tied head, or `attn.bias` masks).
pub fn load_into(module: &dyn Module, path: impl AsRef<Path>, strict: bool) -> Result<()> {
    let dev = match module.parameters().first() {
        Some(p) => p.device().clone(),
        None => return Ok(()),
    };
    let mut src = load(path, &dev)?;
    if !strict {
        let names: Vec<String> = module.state_dict().into_iter().map(|(n, _)| n).collect();
        src.retain(|(n, _)| names.contains(n));
    }
    module.load_state_dict(&src)
}
