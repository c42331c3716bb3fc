//! Host-side cost of the runtime per forward, with no kernels: ResNet-50 and GPT-2 on the
//! meta device (allocations, views, autograd bookkeeping, op dispatch). On a GPU this is the
//! floor under a launch-bound small batch.
//!
//!     cargo run --release -p vramroom-tensor --example host_overhead

use std::time::Instant;

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::models::{Gpt2, Gpt2Config, ResNet};
use vramroom_tensor::nn::Init;
use vramroom_tensor::{no_grad, DType, Device, Module, Tensor};

fn main() {
    let d = Device::meta_caching(1 << 40, AllocatorConfig::default());
    let mut m = ResNet::resnet50(&Init::new(&d, DType::F32), 1000).unwrap();
    m.train(false);
    let x = Tensor::empty(&[1, 3, 224, 224], DType::F32, &d).unwrap();
    let _g = no_grad();
    for _ in 0..20 {
        m.forward(&x).unwrap();
    }
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        m.forward(&x).unwrap();
    }
    println!(
        "resnet50 bs1 forward on meta: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    let g = Gpt2::new(&Init::new(&d, DType::F32), Gpt2Config::gpt2()).unwrap();
    let ids = Tensor::zeros(&[1, 128], DType::I64, &d).unwrap();
    for _ in 0..20 {
        g.forward(&ids).unwrap();
    }
    let t = Instant::now();
    for _ in 0..n {
        g.forward(&ids).unwrap();
    }
    println!(
        "gpt2 1x128 forward on meta: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
