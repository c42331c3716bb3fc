//! Any bytes as a Hugging Face `config.json`: read (`HfConfig::from_json`), sized
//! (`footprint::weight_bytes`, checked against a simulated 80 GiB GPU before anything is
//! built) and built on the meta device. Errors are fine; panics, aborts, hangs and memory
//! past `-rss_limit_mb` are findings. The same inputs, mutated from `fixtures/hf/`, run on
//! stable in `crates/vramroom-tensor/tests/hf_config_fuzz.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramroom_tensor::models::hf::{self, HfConfig, LoadOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = HfConfig::from_json(text, "fuzz") else {
        return;
    };
    let dtype = cfg.dtype.unwrap_or(vramroom_tensor::DType::F32);
    let _ = hf::footprint::weight_bytes(&cfg, dtype, hf::BertHead::Base);
    // Build through the file path, as the CLI does (one file per fuzzing process).
    let dir = std::env::temp_dir().join(format!("vramroom-fuzz-hf-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() || std::fs::write(dir.join("config.json"), data).is_err()
    {
        return;
    }
    let dev = vramroom_tensor::Device::meta_caching(80 << 30, Default::default());
    let _ = hf::load(&dir, &dev, &LoadOptions::default());
});
