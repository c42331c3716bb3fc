//! `h = l1(x); out = l2(h)` against `out = l2(l1(x))`: two Linear(4096), batch 2048,
//! no_grad (ground-truth.md: 96 MiB peak both ways, 32 MiB held after return).
use headroom_alloc::AllocatorConfig;
use headroom_tensor::{nn::Init, nn::Linear, no_grad, DType, Device, Tensor};

fn main() -> headroom_tensor::Result<()> {
    let d = Device::meta_caching(80 << 30, AllocatorConfig::default());
    let init = Init::new(&d, DType::F32);
    let (l1, l2) = (
        Linear::new(&init, 4096, 4096, true)?,
        Linear::new(&init, 4096, 4096, true)?,
    );
    let x = Tensor::empty(&[2048, 4096], DType::F32, &d)?;
    let _g = no_grad();
    let mib = |b: u64| b as f64 / 1048576.0;
    for chained in [false, true] {
        let base = d.memory_allocated();
        d.reset_peak_memory_stats();
        let out = if chained {
            l2.forward(&l1.forward(&x)?)?
        } else {
            let h = l1.forward(&x)?;
            l2.forward(&h)?
        };
        println!(
            "{}: peak {:.0} MiB, held after return {:.0} MiB",
            if chained { "chained  " } else { "temporary" },
            mib(d.max_memory_allocated() - base),
            mib(d.memory_allocated() - base)
        );
        drop(out);
    }
    Ok(())
}
