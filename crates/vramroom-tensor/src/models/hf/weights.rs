//! The `*.safetensors` files of a model folder, read tensor by tensor.
//!
//! Design note: a checkpoint can be many gigabytes in several shards, so only the headers
//! are read up front; each tensor's bytes are read from its file when its parameter is
//! filled, and converted to the parameter's dtype on the way in. Names are looked up the
//! way transformers' loader tolerates them: with or without the base model's prefix
//! (`transformer.`, `model.`, `bert.`) and with BERT's old `gamma`/`beta` LayerNorm names.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::error::{HfError, HfResult};
use crate::dtype::DType;

/// Where one tensor lives.
#[derive(Debug, Clone)]
pub struct Entry {
    pub file: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub begin: u64,
    pub end: u64,
}

/// The tensors of every `*.safetensors` file of a folder.
#[derive(Debug, Default)]
pub struct WeightIndex {
    pub files: Vec<PathBuf>,
    pub entries: BTreeMap<String, Entry>,
}

fn io(path: &Path, e: impl ToString) -> HfError {
    HfError::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

fn bad(path: &Path, msg: String) -> HfError {
    HfError::Weights {
        path: path.display().to_string(),
        msg,
    }
}

fn dtype_of(code: &str) -> Option<DType> {
    Some(match code {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I64" => DType::I64,
        "I32" => DType::I32,
        "U8" => DType::U8,
        "BOOL" => DType::Bool,
        _ => return None,
    })
}

impl WeightIndex {
    /// The `*.safetensors` files in `dir` (none: an empty index).
    pub fn open_dir(dir: &Path) -> HfResult<WeightIndex> {
        let mut idx = WeightIndex::default();
        let rd = std::fs::read_dir(dir).map_err(|e| io(dir, e))?;
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        for f in files {
            idx.add_file(&f)?;
        }
        Ok(idx)
    }

    fn add_file(&mut self, path: &Path) -> HfResult<()> {
        // Never a plain open: a FIFO named `*.safetensors` would block start-up forever.
        let mut f = vramroom_alloc::input::open_nonblocking(path).map_err(|e| io(path, e))?;
        let meta = f.metadata().map_err(|e| io(path, e))?;
        if !meta.is_file() {
            return Err(bad(
                path,
                "not a regular file (a FIFO, device or folder cannot hold weights)".into(),
            ));
        }
        let len = meta.len();
        let mut n = [0u8; 8];
        f.read_exact(&mut n).map_err(|e| io(path, e))?;
        let hlen = u64::from_le_bytes(n);
        if hlen > len.saturating_sub(8) || hlen > (100 << 20) {
            return Err(bad(
                path,
                format!("header length {hlen} does not fit the file"),
            ));
        }
        let mut h = vec![0u8; hlen as usize];
        f.read_exact(&mut h).map_err(|e| io(path, e))?;
        let header: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(&h).map_err(|e| bad(path, format!("bad header: {e}")))?;
        let data_start = 8 + hlen;
        let file = self.files.len();
        self.files.push(path.to_path_buf());
        for (name, info) in header {
            if name == "__metadata__" {
                continue;
            }
            let code = info["dtype"].as_str().unwrap_or("");
            let dtype = dtype_of(code)
                .ok_or_else(|| bad(path, format!("{name}: unsupported dtype {code:?}")))?;
            let shape: Vec<usize> = info["shape"]
                .as_array()
                .and_then(|a| a.iter().map(|v| v.as_u64().map(|x| x as usize)).collect())
                .ok_or_else(|| bad(path, format!("{name}: bad shape")))?;
            let offs = info["data_offsets"]
                .as_array()
                .and_then(|a| Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?)))
                .ok_or_else(|| bad(path, format!("{name}: bad data_offsets")))?;
            let numel = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
                .ok_or_else(|| bad(path, format!("{name}: shape {shape:?} overflows")))?;
            let (begin, end) = (
                data_start.saturating_add(offs.0),
                data_start.saturating_add(offs.1),
            );
            let nbytes = numel.checked_mul(dtype.size() as u64);
            if offs.0 > offs.1 || end > len || Some(offs.1 - offs.0) != nbytes {
                return Err(bad(
                    path,
                    format!("{name}: data_offsets {offs:?} do not hold {numel} x {code}"),
                ));
            }
            self.entries.insert(
                name,
                Entry {
                    file,
                    dtype,
                    shape,
                    begin,
                    end,
                },
            );
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for a model's parameter name, under the names checkpoints use for it.
    pub fn find(&self, name: &str) -> Option<(&str, &Entry)> {
        let mut cands = vec![name.to_string()];
        for p in ["transformer.", "model.", "bert."] {
            if let Some(rest) = name.strip_prefix(p) {
                cands.push(rest.to_string());
            } else {
                cands.push(format!("{p}{name}"));
            }
        }
        let legacy: Vec<String> = cands
            .iter()
            .filter(|c| c.contains("LayerNorm."))
            .map(|c| {
                c.replace("LayerNorm.weight", "LayerNorm.gamma")
                    .replace("LayerNorm.bias", "LayerNorm.beta")
            })
            .collect();
        cands.extend(legacy);
        cands
            .into_iter()
            .find_map(|c| self.entries.get_key_value(c.as_str()))
            .map(|(k, v)| (k.as_str(), v))
    }

    /// The values of `e`, as f64 in logical order.
    pub fn read(&self, e: &Entry) -> HfResult<Vec<f64>> {
        let path = &self.files[e.file];
        let mut f = File::open(path).map_err(|err| io(path, err))?;
        f.seek(SeekFrom::Start(e.begin))
            .map_err(|err| io(path, err))?;
        let mut b = vec![0u8; (e.end - e.begin) as usize];
        f.read_exact(&mut b).map_err(|err| io(path, err))?;
        Ok(crate::safetensors::decode(e.dtype, &b))
    }
}
