//! The meta device's prediction of every recorded transformers scenario is within 3% of
//! PyTorch's peak allocated (see `hf_corpus/mod.rs` for what is compared and how). Reads the
//! snapshots from `VRAMROOM_HF_SNAPS` (default `/work/hf-snaps`) and skips, saying so, when
//! they are not there. The table of every figure is `scripts/corpus-results/hf-meta-vs-torch.txt`
//! (`cargo run --release -p vramroom-tensor --example hf_corpus_table`).

mod hf_corpus;

use hf_corpus::{compare_model, snaps_dir, MODELS};

#[test]
fn meta_prediction_is_within_3_percent_of_pytorch_on_every_recorded_scenario() {
    let Some(snaps) = snaps_dir() else {
        eprintln!(
            "SKIP: no recorded snapshots (set VRAMROOM_HF_SNAPS to the folder of hf_memory.jsonl and *.pickle)"
        );
        return;
    };
    let mut bad = Vec::new();
    let mut n = 0;
    for m in MODELS {
        for r in compare_model(m, &snaps) {
            n += 1;
            eprintln!(
                "{:55} torch {:>14} process {:>14} ({:.4}) fresh {:>14} ({:.4})",
                r.file,
                r.torch.peak_allocated,
                r.process_peak,
                r.process_ratio(),
                r.fresh_peak,
                r.fresh_ratio()
            );
            if (r.process_ratio() - 1.0).abs() > 0.03 {
                bad.push(format!("{} {:.4}", r.file, r.process_ratio()));
            }
        }
    }
    assert!(n > 0, "no scenario compared in {}", snaps.display());
    assert!(bad.is_empty(), "outside 3%: {bad:?}");
}
