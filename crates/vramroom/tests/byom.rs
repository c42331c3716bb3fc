//! Bring your own model, as a user runs it: `predict`, `loadtest` and `serve` with
//! `--model PATH` (a Hugging Face config.json), loadtest's vocabulary in `predict`, the KV
//! cache, `generate`, an unsupported family, and the prediction against PyTorch's recorded
//! peaks (`fixtures/hf-memory/recorded.jsonl`).

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{bin, run_in, scratch};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> String {
    root().join("fixtures/hf").join(name).display().to_string()
}

/// `vramroom predict ARGS --json`: the parsed answer (the test fails on a non-zero exit).
fn predict(args: &[&str]) -> Value {
    let (code, out, err) = run_in(&root(), &[&["predict"], args, &["--json"]].concat());
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

fn peak(v: &Value) -> f64 {
    v["peak_allocated_bytes"].as_f64().unwrap()
}

fn config(name: &str) -> Value {
    let p = root().join("fixtures/hf").join(name).join("config.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn use_cache_is_on_by_default_and_costs_the_kv_cache() {
    let m = fixture("gpt2");
    let on = predict(&["--model", &m, "--batch", "8", "--seq", "512"]);
    let off = predict(&["--model", &m, "--batch", "8", "--seq", "512", "--no-cache"]);
    let off2 = predict(&[
        "--model",
        &m,
        "--batch",
        "8",
        "--seq",
        "512",
        "--use-cache",
        "false",
    ]);
    assert_eq!(peak(&off), peak(&off2));
    // transformers' past_key_values: 2 x layers x batch x seq x hidden, float32.
    let c = config("gpt2");
    let kv =
        2.0 * c["n_layer"].as_f64().unwrap() * 8.0 * 512.0 * c["n_embd"].as_f64().unwrap() * 4.0;
    assert!(
        peak(&on) - peak(&off) >= kv,
        "cache on {} off {} kv {kv}",
        peak(&on),
        peak(&off)
    );
    assert!(on["scenario"]["description"]
        .as_str()
        .unwrap()
        .contains("use_cache"));
}

#[test]
fn every_family_predicts_from_the_config_alone() {
    for name in [
        "gpt2-tiny",
        "llama-tiny",
        "mistral-tiny",
        "qwen2-tiny",
        "bert-tiny",
    ] {
        let m = fixture(name);
        let infer = predict(&["--model", &m, "--batch", "2", "--seq", "32"]);
        let train = predict(&[
            "--model", &m, "--batch", "2", "--seq", "32", "--mode", "train",
        ]);
        assert!(peak(&infer) > 0.0, "{name}");
        // AdamW (the default for a config) holds two states per parameter from the first
        // step: training needs more than the weights' bytes twice over above inference.
        assert_eq!(train["scenario"]["optimizer"], "adamw", "{name}");
        let weights = train["categories"]["parameter"].as_f64().unwrap_or(0.0);
        assert!(
            peak(&train) > peak(&infer) + weights,
            "{name}: train {} infer {} weights {weights}",
            peak(&train),
            peak(&infer)
        );
    }
}

#[test]
fn generate_grows_with_new_tokens_and_has_a_static_option() {
    let m = fixture("llama-tiny");
    let g = |new: &str, cache: &str| {
        predict(&[
            "--model", &m, "--mode", "generate", "--batch", "4", "--prompt", "64", "--new", new,
            "--cache", cache,
        ])
    };
    let short = g("4", "dynamic");
    let long = g("256", "dynamic");
    assert!(
        peak(&long) > peak(&short),
        "{} vs {}",
        peak(&long),
        peak(&short)
    );
    let st = g("256", "static");
    assert!(peak(&st) > 0.0);
    let d = short["scenario"]["description"].as_str().unwrap();
    assert!(
        d.contains("generate") && d.contains("4 new tokens (dynamic cache)"),
        "{d}"
    );
    // generate is for decoders: BERT and the zoo say so.
    for model in [fixture("bert-tiny"), "zoo-gpt-small".to_string()] {
        let (code, _, err) = run_in(
            &root(),
            &["predict", "--model", &model, "--mode", "generate"],
        );
        assert_eq!(code, 2, "{model}: {err}");
        assert!(err.contains("decoder"), "{err}");
    }
}

#[test]
fn predict_speaks_loadtests_vocabulary() {
    // No flags: loadtest's default scenario (zoo-gpt-small, batch 4, uniform:16..128).
    let d = predict(&[]);
    assert_eq!(d["scenario"]["model"], "zoo-gpt-small");
    assert_eq!(d["size"], 128);
    // A distribution is predicted at its largest draw.
    let u = predict(&["--model", "zoo-gpt-small", "--seq", "uniform:16..128"]);
    let f = predict(&["--model", "zoo-gpt-small", "--seq", "128"]);
    assert_eq!(peak(&u), peak(&f));
    // --grad-on, and the old --grad as a hidden alias.
    let a = predict(&["--model", "zoo-gpt-tiny", "--grad-on"]);
    let b = predict(&["--model", "zoo-gpt-tiny", "--grad"]);
    let c = predict(&["--model", "zoo-gpt-tiny"]);
    assert_eq!(peak(&a), peak(&b));
    assert!(peak(&a) > peak(&c));
    // Human output: the scenario's description, never Rust debug names.
    let (code, out, err) = run_in(
        &root(),
        &[
            "predict",
            "--model",
            "mlp-tiny",
            "--mode",
            "train",
            "--accum",
            "2",
            "--optimizer",
            "adamw",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let first = out.lines().next().unwrap_or("");
    assert!(
        first.contains("mlp-tiny training batch 4") && first.contains("adamw"),
        "{first}"
    );
    for debug in ["Sgd", "AdamW", "Each", "Train (", "Infer"] {
        assert!(!out.contains(debug), "{debug:?} in {out}");
    }
}

#[test]
fn unsupported_family_is_a_clear_error_naming_the_supported_ones() {
    let d = scratch("byom", "t5");
    std::fs::write(
        d.join("config.json"),
        r#"{"model_type": "t5", "d_model": 512, "num_layers": 6, "vocab_size": 32128}"#,
    )
    .unwrap();
    for cmd in [
        &["predict"][..],
        &["loadtest", "--device", "meta", "-n", "1"],
    ] {
        let (code, out, err) = run_in(&d, &[cmd, &["--model", "config.json"]].concat());
        assert_eq!(code, 2, "{cmd:?}: {err}");
        assert!(out.is_empty(), "{out}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("\"t5\""), "{err}");
        assert!(err.contains("gpt2, llama, mistral, qwen2, bert"), "{err}");
    }
    let (code, _, err) = run_in(&d, &["predict", "--model", "no-such-model"]);
    assert_eq!(code, 2);
    assert!(err.contains("config.json"), "{err}");
}

/// The recorded transformers runs on an H200 (fixtures/hf-memory, extracted from
/// /work/run-b/hf_memory.jsonl): the prediction from the config alone is within 3% of
/// PyTorch's peak allocated.
#[test]
fn predictions_match_recorded_transformers_peaks_within_3_percent() {
    let text = std::fs::read_to_string(root().join("fixtures/hf-memory/recorded.jsonl")).unwrap();
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let r: Value = serde_json::from_str(line).unwrap();
        let s = |k: &str| r[k].to_string().trim_matches('"').to_string();
        let model = fixture(&s("model"));
        let mut args: Vec<String> = [
            "--model",
            &model,
            "--batch",
            &s("batch"),
            "--dtype",
            &s("dtype"),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        match s("kind").as_str() {
            "forward" => {
                args.extend(["--seq".into(), s("seq")]);
                if r["use_cache"] == false {
                    args.push("--no-cache".into());
                }
            }
            "generate" => args.extend([
                "--mode".into(),
                "generate".into(),
                "--prompt".into(),
                s("prompt"),
                "--new".into(),
                s("new"),
                "--cache".into(),
                s("cache"),
            ]),
            _ => args.extend([
                "--mode".into(),
                "train".into(),
                "--seq".into(),
                s("seq"),
                "--steps".into(),
                s("steps"),
            ]),
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = predict(&refs);
        let torch = r["peak_allocated"].as_f64().unwrap();
        let ratio = peak(&p) / torch;
        assert!(
            (ratio - 1.0).abs() <= 0.03,
            "{}: vramroom {} torch {torch} ratio {ratio:.4}",
            s("snapshot"),
            peak(&p)
        );
        n += 1;
    }
    assert!(n >= 10, "only {n} recorded entries");
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn loadtest_runs_a_config_including_generate() {
    let d = scratch("byom", "loadtest");
    let m = fixture("gpt2-tiny");
    for (dev, extra) in [
        (
            "meta",
            &[
                "--mode",
                "generate",
                "--prompt",
                "uniform:4..16",
                "--new",
                "8",
            ][..],
        ),
        ("meta", &["--mode", "train", "--seq", "16"]),
        ("cpu", &["--seq", "16"]),
    ] {
        let (code, _out, err) = run_in(
            &d,
            &[
                &[
                    "loadtest", "--device", dev, "--model", &m, "-n", "4", "--batch", "2",
                ][..],
                extra,
                &["--no-search", "--quiet", "--out", "o"],
            ]
            .concat(),
        );
        assert_eq!(code, 0, "{dev} {extra:?}: {err}");
        let v = read_json(&d.join("o/results.json"));
        assert_eq!(v["requests"]["ok"], 4, "{dev} {extra:?}");
        // No weights in the fixture: on cpu the random init is said.
        assert_eq!(
            err.contains("weights initialised randomly"),
            dev == "cpu",
            "{dev}: {err}"
        );
        let kind = v["scenario"]["kind"].as_str().unwrap_or("").to_string();
        if extra.contains(&"generate") {
            assert_eq!(kind, "generate");
        }
    }
}

#[test]
fn serve_generates_from_a_config() {
    let m = fixture("gpt2-tiny");
    let (mut child, url) = common::spawn_serve(&[
        "--model",
        &m,
        "--new",
        "4",
        "--port",
        "0",
        "--max-wait",
        "1ms",
    ]);
    let post = |body: &str| common::post_infer(&url, body, Duration::from_secs(30));
    let answer = post(r#"{"inputs": [[1, 2, 3], [4, 5, 6]]}"#);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    let outs = v["outputs"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(outs.len(), 2);
    for o in outs {
        assert_eq!(o["tokens"].as_array().map(|t| t.len()), Some(4), "{o}");
    }
    // Generation takes one length per request (no padding).
    let uneven = post(r#"{"inputs": [[1, 2, 3], [4, 5]]}"#);
    assert!(uneven.starts_with("HTTP/1.1 422"), "{uneven}");
    let _ = child.0.kill();
    let mut err = String::new();
    let _ = child.0.stderr.take().unwrap().read_to_string(&mut err);
    assert!(err.contains("weights initialised randomly"), "{err}");
}

#[test]
fn serve_refuses_an_encoder_and_cache_flags_on_the_zoo() {
    for args in [
        vec!["--model".to_string(), fixture("bert-tiny")],
        vec![
            "--model".into(),
            "zoo-gpt-tiny".into(),
            "--new".into(),
            "4".into(),
        ],
        vec![
            "--model".into(),
            fixture("gpt2-tiny"),
            "--new".into(),
            "0".into(),
        ],
    ] {
        let out = bin()
            .arg("serve")
            .args(&args)
            .args(["--port", "0"])
            .output()
            .expect("run vramroom");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}
