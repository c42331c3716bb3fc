//! Gradient accumulation: backward every micro-step against summing the losses and one
//! backward (ResNet-50, micro-batch 32, SGD momentum).
use vramroom_tensor::models::ZooModel;
use vramroom_tensor::predict::{predict, AccumPattern, Mode, OptimKind, PredictOptions};

fn main() -> vramroom_tensor::Result<()> {
    for n in [1, 4, 8] {
        let mut row = Vec::new();
        for pattern in [AccumPattern::Each, AccumPattern::Sum] {
            let p = predict(&PredictOptions {
                model: ZooModel::resnet50(),
                batch: 32,
                mode: Mode::Training {
                    optimizer: OptimKind::Sgd,
                    accum_steps: n,
                    pattern: pattern,
                },
                ..Default::default()
            })?;
            row.push(p.peak_over_input_bytes as f64 / 1048576.0);
        }
        println!(
            "{n} steps: each-step {:>8.1} MiB   sum-then-backward {:>8.1} MiB",
            row[0], row[1]
        );
    }
    Ok(())
}
