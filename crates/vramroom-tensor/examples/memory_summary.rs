//! Printing PyTorch's `memory_summary()` table after a ResNet-18 training step.
use vramroom_tensor::predict::{predict, Mode, ModelKind, PredictOptions};

fn main() -> vramroom_tensor::Result<()> {
    let p = predict(&PredictOptions {
        model: ModelKind::ResNet18,
        batch: 16,
        mode: Mode::Train,
        ..Default::default()
    })?;
    println!("{}", p.summary);
    println!("categories at the peak: {:?}", p.categories);
    Ok(())
}
