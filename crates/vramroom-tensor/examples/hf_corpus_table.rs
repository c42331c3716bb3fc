//! Writes the table of `scripts/corpus-results/hf-meta-vs-torch.txt`: for every recorded
//! transformers scenario (`scripts/hf_memory.py`, snapshots in `VRAMROOM_HF_SNAPS`, default
//! `/work/hf-snaps`), PyTorch's peak allocated beside Vramroom's meta prediction (the
//! recording process replayed, and a fresh device), with the ratios.
//!
//!     cargo run --release -p vramroom-tensor --example hf_corpus_table > scripts/corpus-results/hf-meta-vs-torch.txt

#[path = "../tests/hf_corpus/mod.rs"]
mod hf_corpus;

use hf_corpus::{compare_model, scenarios, snaps_dir, MODELS};

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

fn main() {
    let Some(snaps) = snaps_dir() else {
        eprintln!("no snapshots: set VRAMROOM_HF_SNAPS to the folder of hf_memory.jsonl");
        std::process::exit(2);
    };
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("# Vramroom's meta-device prediction of peak allocated vs PyTorch 2.11 + transformers 5.17 (H200)");
    println!("# commit {commit}; made by: cargo run --release -p vramroom-tensor --example hf_corpus_table");
    println!("# snapshots: {} (scripts/hf_memory.py); PyTorch's figure: the snapshot's replay (= max_memory_allocated)", snaps.display());
    println!("# process: the recording script's process replayed on one simulated GPU (its scenarios in order,");
    println!("#   fresh weights each, cached segments and cuBLAS workspaces carried over) - the acceptance figure;");
    println!("# fresh: hf::predict on a new device with the cuBLAS workspaces the snapshot shows (first scenario of a");
    println!("#   process cold); it differs from PyTorch only where the recording process's allocator history placed");
    println!("#   weights in other blocks. Sizes in MiB; ratio = Vramroom / PyTorch.");
    println!("#");
    println!(
        "{:56} {:>10} {:>10} {:>7} {:>10} {:>7} {:>11} {:>11}",
        "scenario", "torch", "process", "ratio", "fresh", "ratio", "torch rsv", "process rsv"
    );
    let (mut n, mut worst_p, mut worst_f, mut within_f) = (0, 0f64, 0f64, 0);
    for m in MODELS {
        for r in compare_model(m, &snaps) {
            n += 1;
            worst_p = worst_p.max((r.process_ratio() - 1.0).abs());
            worst_f = worst_f.max((r.fresh_ratio() - 1.0).abs());
            within_f += ((r.fresh_ratio() - 1.0).abs() <= 0.03) as usize;
            println!(
                "{:56} {:>10} {:>10} {:>7.4} {:>10} {:>7.4} {:>11} {:>11}",
                r.file.trim_end_matches(".pickle"),
                mib(r.torch.peak_allocated),
                mib(r.process_peak),
                r.process_ratio(),
                mib(r.fresh_peak),
                r.fresh_ratio(),
                mib(r.torch.peak_reserved),
                mib(r.process_reserved)
            );
        }
    }
    let statics: Vec<String> = MODELS
        .iter()
        .flat_map(|m| scenarios(m))
        .filter(|s| s.is_static())
        .map(|s| s.file.trim_end_matches(".pickle").to_string())
        .collect();
    println!("#");
    println!("# {n} scenarios; process: worst |ratio - 1| = {:.2}% (all within 3%: {}); fresh: worst {:.2}%, {within_f}/{n} within 3%",
        worst_p * 100.0, worst_p <= 0.03, worst_f * 100.0);
    println!("# not compared (recorded with transformers' automatic torch.compile for static caches): {}", statics.join(", "));
}
