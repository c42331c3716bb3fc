//! Hostile `config.json`s (issue 28): sizes that wrap, layer counts past any real model,
//! weights past the device or the address space. Each ends in an error that names the
//! problem (or an out-of-memory answer), never a wrap, a crash or unbounded work.

use std::time::{Duration, Instant};

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::models::hf::{self, LoadOptions};
use vramroom_tensor::Device;

fn write_cfg(dir: &std::path::Path, name: &str, extra: &str) -> std::path::PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let text = format!(
        r#"{{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
            "num_hidden_layers": 2, "max_position_embeddings": 128, {extra}}}"#
    );
    std::fs::write(d.join("config.json"), text).unwrap();
    d
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vramroom-hf-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn meta() -> Device {
    Device::meta_caching(1 << 44, AllocatorConfig::default())
}

#[test]
fn wrapped_shapes_are_refused_on_every_device() {
    let dir = tmp("wrap");
    for (name, extra) in [
        (
            "intermediate_size",
            r#""intermediate_size": 4611686018427387904"#,
        ),
        ("vocab_size", r#""vocab_size": 288230376151712704"#),
    ] {
        let p = write_cfg(&dir, name, extra);
        for dev in [
            meta(),
            Device::cpu_caching(1 << 30, AllocatorConfig::default()),
        ] {
            let e = hf::load(&p, &dev, &LoadOptions::default())
                .err()
                .expect(name);
            let m = e.to_string();
            assert!(m.contains(name) && !e.is_oom(), "{name}: {m}");
        }
    }
}

#[test]
fn layers_past_the_device_are_an_answer_before_any_is_built() {
    let dir = tmp("layers");
    let p = write_cfg(&dir, "l", r#""num_hidden_layers": 1000000000000"#);
    let t = Instant::now();
    let e = hf::load(&p, &meta(), &LoadOptions::default())
        .err()
        .unwrap();
    assert!(e.is_oom(), "{e}");
    assert!(
        e.to_string().contains("TiB") || e.to_string().contains("PiB"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    // Past the address space: still a number.
    let p = write_cfg(
        &dir,
        "big",
        r#""num_hidden_layers": 1000000000000, "intermediate_size": 1000000000"#,
    );
    let e = hf::load(&p, &meta(), &LoadOptions::default())
        .err()
        .unwrap();
    assert!(e.is_oom() && e.to_string().contains("EiB"), "{e}");
}

#[test]
fn too_many_small_layers_are_refused_naming_the_field() {
    let dir = tmp("many");
    let p = write_cfg(
        &dir,
        "m",
        r#""num_hidden_layers": 100000, "hidden_size": 8, "num_attention_heads": 1,
           "num_key_value_heads": 1, "intermediate_size": 8"#,
    );
    let e = hf::load(&p, &meta(), &LoadOptions::default())
        .err()
        .unwrap();
    assert!(
        !e.is_oom() && e.to_string().contains("num_hidden_layers"),
        "{e}"
    );
}

#[test]
fn building_is_linear_in_layers() {
    let dir = tmp("linear");
    let p = write_cfg(
        &dir,
        "l",
        r#""num_hidden_layers": 10000, "hidden_size": 8, "num_attention_heads": 1,
           "num_key_value_heads": 1, "intermediate_size": 8"#,
    );
    let t = Instant::now();
    hf::load(&p, &meta(), &LoadOptions::default()).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn a_zero_width_mlp_predicts_without_recursing() {
    // Found by tests/hf_config_fuzz.rs: `n_inner` = 0 made reshape recurse until the stack
    // overflowed (an abort, not an error).
    let d = tmp("zero-inner");
    let p = d.join("config.json");
    std::fs::write(
        &p,
        r#"{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_inner": 0, "n_layer": 2,
            "n_positions": 256, "vocab_size": 1000}"#,
    )
    .unwrap();
    let w = hf::Workload::Forward {
        batch: 1,
        seq: 8,
        use_cache: None,
    };
    let _ = hf::predict(&p, &w, &hf::PredictOptions::default());
}
