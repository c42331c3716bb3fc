//! `h = l1(x); out = l2(h)` against `out = l2(l1(x))`: two Linear(4096), batch 2048,
//! no_grad (ground-truth.md: 96 MiB peak both ways, 32 MiB held after return).
use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::{nn::Init, nn::Linear, no_grad, DType, Device, Tensor};

fn main() -> vramroom_tensor::Result<()> {
    let d = Device::meta_caching(80 << 30, AllocatorConfig::default());
    let init = Init::new(&d, DType::F32);
    let (l1, l2) = (
        Linear::new(&init, 4096, 4096, true)?,
        Linear::new(&init, 4096, 4096, true)?,
    );
    let x = Tensor::empty(&[2048, 4096], DType::F32, &d)?;
    let _g = no_grad();
    let mib = |b: u64| b as f64 / 1048576.0;
    // The first matmul of a process also allocates the cuBLAS workspaces (32 MiB + 1 MiB,
    // held for good): pay it up front so it does not count against whichever form runs first.
    let before = d.memory_allocated();
    drop(l1.forward(&x)?);
    println!(
        "first matmul of the process: +{:.0} MiB of cuBLAS workspace, held",
        mib(d.memory_allocated() - before)
    );
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
