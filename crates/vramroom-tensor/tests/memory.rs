//! Storage lifetime, graph lifetime (leaks), meta == cpu allocation sequences, categories.

use std::sync::Arc;

use vramroom_tensor::ops::{self, Conv2dParams, Pool2dParams};
use vramroom_tensor::{
    category_scope, no_grad, CountingAllocator, DType, Device, HostAllocator, MemoryCategory,
    RecordingAllocator, Result, Tensor,
};

fn cpu() -> Device {
    Device::cpu(Arc::new(HostAllocator::new(1 << 32)))
}
fn meta() -> Device {
    Device::meta(Arc::new(CountingAllocator::new(1 << 40)))
}

struct Net {
    w1: Tensor,
    g1: Tensor,
    b1: Tensor,
    rm: Tensor,
    rv: Tensor,
    w2: Tensor,
    fc: Tensor,
    fcb: Tensor,
}

impl Net {
    fn new(d: &Device) -> Net {
        let _c = category_scope(MemoryCategory::Parameter);
        let p = |shape: &[usize]| {
            let t = Tensor::randn(shape, 0.0, 0.1, DType::F32, d).unwrap();
            t.requires_grad_(true).unwrap();
            t
        };
        Net {
            w1: p(&[8, 3, 3, 3]),
            g1: p(&[8]),
            b1: p(&[8]),
            rm: Tensor::zeros(&[8], DType::F32, d).unwrap(),
            rv: Tensor::ones(&[8], DType::F32, d).unwrap(),
            w2: p(&[8, 8, 3, 3]),
            fc: p(&[10, 8]),
            fcb: p(&[10]),
        }
    }
    /// conv-bn-relu_-maxpool-conv(+residual)-relu_-avgpool-linear-cross_entropy.
    fn loss(&self, x: &Tensor, t: &Tensor, train: bool) -> Result<Tensor> {
        let y = ops::conv2d(x, &self.w1, None, &Conv2dParams::new(2, 1))?;
        let y = ops::batch_norm(
            &y,
            Some(&self.rm),
            Some(&self.rv),
            Some(&self.g1),
            Some(&self.b1),
            train,
            0.1,
            1e-5,
        )?;
        y.relu_()?;
        let y = ops::max_pool2d(&y, &Pool2dParams::new(3, 2, 1))?;
        let z = ops::conv2d(&y, &self.w2, None, &Conv2dParams::new(1, 1))?;
        z.add_(&y)?;
        z.relu_()?;
        let z = ops::adaptive_avg_pool2d(&z, [1, 1])?.flatten(1, -1)?;
        let logits = ops::linear(&z, &self.fc, Some(&self.fcb))?;
        ops::cross_entropy(&logits, t)
    }
    fn params(&self) -> Vec<&Tensor> {
        vec![&self.w1, &self.g1, &self.b1, &self.w2, &self.fc, &self.fcb]
    }
}

fn batch(d: &Device, n: usize) -> (Tensor, Tensor) {
    let _c = category_scope(MemoryCategory::Input);
    let x = Tensor::randn(&[n, 3, 16, 16], 0.0, 1.0, DType::F32, d).unwrap();
    let t = Tensor::from_i64(&(0..n as i64).map(|i| i % 10).collect::<Vec<_>>(), &[n], d).unwrap();
    (x, t)
}

#[test]
fn storage_is_freed_when_the_last_view_drops() {
    let d = cpu();
    let base = d.memory_allocated();
    let t = Tensor::zeros(&[256, 4], DType::F32, &d).unwrap();
    assert_eq!(d.memory_allocated() - base, 4096);
    let v = t.transpose(0, 1).unwrap().narrow(0, 1, 2).unwrap();
    let e = t.narrow(1, 0, 1).unwrap().expand(&[256, 7]).unwrap();
    drop(t);
    assert_eq!(d.memory_allocated() - base, 4096, "views keep the storage");
    drop(v);
    drop(e);
    assert_eq!(d.memory_allocated(), base);
}

#[test]
fn zero_byte_tensors_do_not_allocate() {
    let rec = Arc::new(RecordingAllocator::new(Arc::new(CountingAllocator::new(
        1 << 30,
    ))));
    let d = Device::meta(rec.clone());
    let t = Tensor::empty(&[0, 5], DType::F32, &d).unwrap();
    drop(t);
    assert!(rec.take().is_empty());
}

#[test]
fn temporaries_die_immediately_under_no_grad() {
    let d = meta();
    let net = Net::new(&d);
    let (x, t) = batch(&d, 4);
    let base = d.memory_allocated();
    d.reset_peak_memory_stats();
    {
        let _g = no_grad();
        let l = net.loss(&x, &t, false).unwrap();
        // Only the scalar loss (one 512-byte block) survives.
        assert_eq!(d.memory_allocated() - base, 512);
        drop(l);
    }
    let nograd_peak = d.max_memory_allocated() - base;
    d.reset_peak_memory_stats();
    let l = net.loss(&x, &t, true).unwrap();
    let held = d.memory_allocated() - base;
    assert!(held > 10 * 512, "grad on keeps activations: {held}");
    assert!(d.max_memory_allocated() - base > nograd_peak);
    drop(l);
    assert_eq!(d.memory_allocated(), base);
}

#[test]
fn dropping_outputs_frees_graphs_without_backward() {
    for d in [meta(), cpu()] {
        let net = Net::new(&d);
        let (x, t) = batch(&d, 2);
        let base = d.memory_allocated();
        let n = if d.is_meta() { 10_000 } else { 200 };
        for _ in 0..n {
            let l = net.loss(&x, &t, true).unwrap();
            assert!(l.requires_grad());
        }
        assert_eq!(d.memory_allocated(), base, "leak on {d}");
    }
}

#[test]
fn leak_test_thousand_training_steps_meta() {
    let d = meta();
    let net = Net::new(&d);
    let (x, t) = batch(&d, 2);
    net.loss(&x, &t, true).unwrap().backward().unwrap();
    // Grads now exist: the steady state.
    let base = d.memory_allocated();
    for _ in 0..1000 {
        net.loss(&x, &t, true).unwrap().backward().unwrap();
        assert_eq!(d.memory_allocated(), base);
    }
}

#[test]
fn backward_frees_saved_tensors_and_leaves_params_plus_grads() {
    let d = meta();
    let net = Net::new(&d);
    let param_bytes = d.memory_by_category().get(MemoryCategory::Parameter);
    let (x, t) = batch(&d, 4);
    let base = d.memory_allocated();
    let l = net.loss(&x, &t, true).unwrap();
    assert!(d.memory_by_category().get(MemoryCategory::Activation) > 0);
    l.backward().unwrap();
    drop(l);
    let cats = d.memory_by_category();
    assert_eq!(cats.get(MemoryCategory::Activation), 0);
    assert_eq!(cats.get(MemoryCategory::Temporary), 0);
    let grad_bytes: u64 = net
        .params()
        .iter()
        .map(|p| p.grad().unwrap().storage().block_size())
        .sum();
    assert_eq!(cats.get(MemoryCategory::Gradient), grad_bytes);
    assert_eq!(d.memory_allocated() - base, grad_bytes);
    assert!(param_bytes > 0 && cats.get(MemoryCategory::Parameter) >= param_bytes);
    assert_eq!(cats.total(), d.memory_allocated());
}

#[test]
fn category_breakdown_at_peak_adds_up() {
    let d = meta();
    let net = Net::new(&d);
    let (x, t) = batch(&d, 8);
    d.reset_peak_memory_stats();
    net.loss(&x, &t, true).unwrap().backward().unwrap();
    let peak = d.peak_memory_by_category();
    assert_eq!(peak.total(), d.max_memory_allocated());
    assert!(peak.get(MemoryCategory::Input) > 0);
    assert!(peak.get(MemoryCategory::Parameter) > 0);
    let names: Vec<&str> = peak.to_map().keys().copied().collect();
    assert!(names.contains(&"optimizer_state"));
}

fn run_sequence(d: &Device) -> Result<()> {
    d.manual_seed(1);
    let net = Net::new(d);
    let (x, t) = batch(d, 3);
    net.loss(&x, &t, true)?.backward()?;
    let h = ops::dropout(&Tensor::ones(&[4, 16], DType::F32, d)?, 0.5, true)?;
    let e = Tensor::randn(&[11, 16], 0.0, 1.0, DType::F32, d)?;
    e.requires_grad_(true)?;
    let idx = Tensor::from_i64(&[1, 2, 3, 4], &[4], d)?;
    let ln = ops::layer_norm(&ops::embedding(&e, &idx)?.add(&h)?, &[16], None, None, 1e-5)?;
    let att = ln.matmul(&ln.t()?)?.softmax(-1)?;
    att.gelu(true)?.sum()?.backward()?;
    Ok(())
}

#[test]
fn meta_makes_the_same_allocations_as_cpu() {
    let rc = Arc::new(RecordingAllocator::new(Arc::new(HostAllocator::new(
        1 << 30,
    ))));
    let rm = Arc::new(RecordingAllocator::new(Arc::new(CountingAllocator::new(
        1 << 30,
    ))));
    run_sequence(&Device::cpu(rc.clone())).unwrap();
    run_sequence(&Device::meta(rm.clone())).unwrap();
    let (a, b) = (rc.take_sizes(), rm.take_sizes());
    assert!(a.len() > 100);
    assert_eq!(a, b);
}

#[test]
fn maxpool_indices_are_freed_at_once_without_grad() {
    let rec = Arc::new(RecordingAllocator::new(Arc::new(CountingAllocator::new(
        1 << 30,
    ))));
    let d = Device::meta(rec.clone());
    let x = Tensor::empty(&[1, 64, 112, 112], DType::F32, &d).unwrap();
    rec.take();
    let _g = no_grad();
    let y = ops::max_pool2d(&x, &Pool2dParams::new(3, 2, 1)).unwrap();
    // As in the ResNet-50 no_grad trace: output, int64 indices, indices freed.
    assert_eq!(rec.take_sizes(), vec![802816, 1605632, -1605632]);
    drop(y);
}

#[test]
fn batchnorm_train_allocation_order() {
    let rec = Arc::new(RecordingAllocator::new(Arc::new(CountingAllocator::new(
        1 << 40,
    ))));
    let d = Device::meta(rec.clone());
    let x = Tensor::empty(&[32, 64, 112, 112], DType::F32, &d).unwrap();
    let w = Tensor::empty(&[64], DType::F32, &d).unwrap();
    w.requires_grad_(true).unwrap();
    let b = Tensor::empty(&[64], DType::F32, &d).unwrap();
    b.requires_grad_(true).unwrap();
    rec.take();
    let y = ops::batch_norm(&x, None, None, Some(&w), Some(&b), true, 0.1, 1e-5).unwrap();
    // As in the ResNet-50 training trace: output, save_mean, save_invstd.
    assert_eq!(rec.take_sizes(), vec![102760448, 256, 256]);
    drop(y);
}

#[test]
fn runs_on_the_caching_allocator() {
    use vramroom_alloc::AllocatorConfig;
    for d in [
        Device::meta_caching(8 << 30, AllocatorConfig::default()),
        Device::cpu_caching(1 << 30, AllocatorConfig::default()),
    ] {
        let net = Net::new(&d);
        let (x, t) = batch(&d, 4);
        let base = d.memory_allocated();
        net.loss(&x, &t, true).unwrap().backward().unwrap();
        for _ in 0..20 {
            let _ = net.loss(&x, &t, true).unwrap();
        }
        let grads: u64 = net
            .params()
            .iter()
            .map(|p| p.grad().unwrap().storage().block_size())
            .sum();
        // On the meta device (a simulated GPU) the first matmuls also took the cuBLAS
        // handle workspaces, held for the device's life; the cpu device takes none.
        assert_eq!(
            d.memory_allocated() - base,
            grads + d.library_workspace_bytes()
        );
        assert_eq!(d.library_workspace_bytes() > 0, d.is_meta());
        assert!(d.memory_reserved() >= d.memory_allocated());
        assert_eq!(d.memory_by_category().total(), d.memory_allocated());
        let stats = d.allocator().memory_stats();
        assert_eq!(
            stats["allocated_bytes.all.current"] as u64,
            d.memory_allocated()
        );
        assert!(d
            .allocator()
            .memory_summary(true)
            .contains("PyTorch CUDA memory summary"));
        if !d.is_meta() {
            let l = net.loss(&x, &t, false).unwrap().item().unwrap();
            assert!(l.is_finite() && l > 0.0);
        }
    }
}

#[test]
fn caching_allocator_oom_is_an_error_with_pytorch_detail() {
    use vramroom_alloc::AllocatorConfig;
    let d = Device::meta_caching(64 << 20, AllocatorConfig::default());
    let a = Tensor::empty(&[8 << 20], DType::F32, &d).unwrap(); // 32 MiB
    let err = Tensor::empty(&[16 << 20], DType::F32, &d).unwrap_err();
    match &err {
        vramroom_tensor::TensorError::OutOfMemory { message, detail } => {
            assert!(message.contains("CUDA out of memory"), "{message}");
            assert!(detail.is_some());
        }
        e => panic!("{e}"),
    }
    drop(a);
    Tensor::empty(&[8 << 20], DType::F32, &d).unwrap();
}

/// A cuDNN conv whose workspace does not fit runs a plan without one (PyTorch catches the
/// OOM of the workspace, not of the output): the conv returns, the allocator counts the OOM.
#[test]
fn a_conv_workspace_that_does_not_fit_is_no_oom() {
    use vramroom_alloc::AllocatorConfig;
    use vramroom_tensor::device::{ConvWorkspaceQuery, WorkspacePolicy};
    struct Huge;
    impl WorkspacePolicy for Huge {
        fn conv2d(&self, _q: &ConvWorkspaceQuery) -> u64 {
            1 << 30
        }
    }
    let d = Device::meta_caching(64 << 20, AllocatorConfig::default());
    d.set_workspace_policy(Arc::new(Huge));
    let x = Tensor::empty(&[4, 3, 32, 32], DType::F32, &d).unwrap();
    let w = Tensor::empty(&[8, 3, 3, 3], DType::F32, &d).unwrap();
    let y = ops::conv2d(&x, &w, None, &Conv2dParams::new(1, 1)).unwrap();
    assert_eq!(y.shape(), [4, 8, 32, 32]);
    assert_eq!(d.allocator().memory_stats()["num_ooms"], 1);
    // an output that does not fit is still the caller's OOM
    let big = Tensor::empty(&[64, 3, 256, 256], DType::F32, &d).unwrap();
    let w2 = Tensor::empty(&[64, 3, 3, 3], DType::F32, &d).unwrap();
    assert!(matches!(
        ops::conv2d(&big, &w2, None, &Conv2dParams::new(1, 1)),
        Err(vramroom_tensor::TensorError::OutOfMemory { .. })
    ));
}
