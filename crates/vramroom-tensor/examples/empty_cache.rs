//! What `empty_cache()` gives back: every fully free segment; segments holding a live
//! block stay reserved.
use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::{DType, Device, Tensor};

fn main() -> vramroom_tensor::Result<()> {
    let d = Device::meta_caching(80 << 30, AllocatorConfig::default());
    let mib = |b: u64| b as f64 / 1048576.0;
    let keep = Tensor::empty(&[85 << 18], DType::F32, &d)?; // 85 MiB stays live
    let junk: Vec<Tensor> = (0..30)
        .map(|i| Tensor::empty(&[(64 + i) << 18], DType::F32, &d))
        .collect::<vramroom_tensor::Result<_>>()?;
    drop(junk);
    println!(
        "before: allocated {:.0} MiB, reserved {:.0} MiB",
        mib(d.memory_allocated()),
        mib(d.memory_reserved())
    );
    d.empty_cache();
    println!(
        "after : allocated {:.0} MiB, reserved {:.0} MiB",
        mib(d.memory_allocated()),
        mib(d.memory_reserved())
    );
    drop(keep);
    Ok(())
}
