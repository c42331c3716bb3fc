//! ResNet-50 forward with grad on against no_grad: memory above the input.
use vramroom_tensor::models::ZooModel;
use vramroom_tensor::predict::{predict, Mode, PredictOptions};

fn main() -> vramroom_tensor::Result<()> {
    for bs in [1, 8, 32, 64] {
        let mut row = Vec::new();
        for grad in [true, false] {
            let p = predict(&PredictOptions {
                model: ZooModel::resnet50(),
                batch: bs,
                mode: Mode::Inference,
                grad,
                ..Default::default()
            })?;
            row.push(p.peak_over_input_bytes as f64 / 1048576.0);
        }
        println!(
            "bs{bs:<3} grad {:>8.1} MiB   no_grad {:>7.1} MiB",
            row[0], row[1]
        );
    }
    Ok(())
}
