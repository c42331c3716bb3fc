//! Any UTF-8 text as `PYTORCH_CUDA_ALLOC_CONF`: errors are fine, panics are findings.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = vramroom_alloc::AllocatorConfig::parse(s);
    }
});
