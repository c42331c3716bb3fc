//! Printing PyTorch's `memory_summary()` table after a ResNet-18 training step.
use vramroom_tensor::models::ZooModel;
use vramroom_tensor::predict::{predict, AccumPattern, Mode, OptimKind, PredictOptions};

fn main() -> vramroom_tensor::Result<()> {
    let p = predict(&PredictOptions {
        model: ZooModel::resnet18(),
        batch: 16,
        mode: Mode::Training {
            optimizer: OptimKind::Sgd,
            accum_steps: 1,
            pattern: AccumPattern::Each,
        },
        ..Default::default()
    })?;
    println!("{}", p.summary);
    println!("categories at the peak: {:?}", p.categories);
    Ok(())
}
