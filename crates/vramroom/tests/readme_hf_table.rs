//! The README's Hugging Face accuracy table against the recordings it quotes
//! (`fixtures/hf-memory/recorded.jsonl`): each row's scenario, read as `vramroom predict`
//! would read it (the dtype is the config's `torch_dtype` unless the row says `--dtype`), is
//! a recorded run of that very dtype, and the PyTorch column is its peak allocated.
//!
//! Design note: the rows were once made with `--dtype float32` for a bfloat16 config without
//! saying so, and the README's own example then gave half the table's figure. A row whose
//! label and recording disagree on the dtype fails here; the fix is the label.

use std::path::PathBuf;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const HEADER: &str =
    "| scenario (`vramroom predict --model fixtures/hf/...`) | PyTorch | Vramroom | ratio |";

/// `--dtype`'s spellings, as the CLI takes them, to the recordings' names.
fn dtype_name(s: &str) -> String {
    match s {
        "bf16" | "bfloat16" => "bfloat16",
        "fp16" | "half" | "float16" => "float16",
        "fp32" | "float" | "float32" => "float32",
        other => other,
    }
    .to_string()
}

/// The dtype `predict` uses for `model` without `--dtype`: its config's `torch_dtype`,
/// float32 when it has none (as transformers).
fn config_dtype(model: &str) -> String {
    let p = root().join("fixtures/hf").join(model).join("config.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let v: Value = serde_json::from_str(&text).expect("config.json");
    dtype_name(v["torch_dtype"].as_str().unwrap_or("float32"))
}

struct Row {
    line: String,
    model: String,
    flags: Vec<String>,
    pytorch_mib: f64,
    vramroom_mib: f64,
    ratio: f64,
}

fn rows() -> Vec<Row> {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let at = readme
        .find(HEADER)
        .expect("the accuracy table's header in README.md");
    readme[at..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 4, "{l}");
            let model = cells[0]
                .split_whitespace()
                .next()
                .expect("model")
                .to_string();
            let flags = cells[0]
                .split('`')
                .skip(1)
                .step_by(2)
                .flat_map(|c| c.split_whitespace().map(String::from))
                .collect();
            let n = |s: &str| s.parse::<f64>().unwrap_or_else(|_| panic!("{s:?} in {l}"));
            Row {
                line: l.to_string(),
                model,
                flags,
                pytorch_mib: n(cells[1]),
                vramroom_mib: n(cells[2]),
                ratio: n(cells[3]),
            }
        })
        .collect()
}

fn flag<'a>(flags: &'a [String], name: &str) -> Option<&'a str> {
    flags
        .iter()
        .position(|f| f == name)
        .and_then(|i| flags.get(i + 1))
        .map(String::as_str)
}

/// Whether recording `r` is the run of `row`'s scenario, the dtype aside.
fn same_scenario(row: &Row, r: &Value) -> bool {
    let s = |k: &str| r[k].to_string().trim_matches('"').to_string();
    let kind = match flag(&row.flags, "--mode") {
        Some("generate") => "generate",
        Some("train") => "train",
        _ => "forward",
    };
    let mut same = s("model") == row.model
        && s("kind") == kind
        && flag(&row.flags, "--batch") == Some(s("batch").as_str());
    if kind == "generate" {
        same &= flag(&row.flags, "--prompt") == Some(s("prompt").as_str())
            && flag(&row.flags, "--new") == Some(s("new").as_str());
    } else {
        same &= flag(&row.flags, "--seq") == Some(s("seq").as_str());
    }
    if kind == "forward" {
        let no_cache = row.flags.iter().any(|f| f == "--no-cache");
        same &= (r["use_cache"] == false) == no_cache;
    }
    same
}

#[test]
fn every_row_is_a_recording_of_the_dtype_it_names() {
    let text = std::fs::read_to_string(root().join("fixtures/hf-memory/recorded.jsonl"))
        .expect("recorded.jsonl");
    let recorded: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let rows = rows();
    assert!(rows.len() >= 10, "only {} rows", rows.len());
    for row in &rows {
        let dtype = flag(&row.flags, "--dtype")
            .map(dtype_name)
            .unwrap_or_else(|| config_dtype(&row.model));
        let matches: Vec<&Value> = recorded.iter().filter(|r| same_scenario(row, r)).collect();
        assert!(!matches.is_empty(), "no recording of {}", row.line);
        let r = matches
            .iter()
            .find(|r| r["dtype"] == dtype.as_str())
            .unwrap_or_else(|| {
                panic!(
                    "{}\nruns as {dtype} (`predict` takes the config's torch_dtype unless \
                     --dtype says otherwise), but it was recorded as {}: name the dtype in \
                     the row",
                    row.line,
                    matches
                        .iter()
                        .map(|r| r["dtype"].to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            });
        let mib = r["peak_allocated"].as_f64().expect("peak_allocated") / (1u64 << 20) as f64;
        assert!(
            (mib - row.pytorch_mib).abs() < 0.051,
            "{}: PyTorch's peak allocated is {mib:.1} MiB",
            row.line
        );
        assert!(
            (row.vramroom_mib / row.pytorch_mib - row.ratio).abs() < 0.0002,
            "{}: the ratio is {:.4}",
            row.line,
            row.vramroom_mib / row.pytorch_mib
        );
    }
}
