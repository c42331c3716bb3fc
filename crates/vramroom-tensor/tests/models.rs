//! Layers, models, optimizers, safetensors and `predict` against PyTorch's names and the
//! measured figures in shared/spec/ground-truth.md.

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::models::ZooModel;
use vramroom_tensor::models::{Gpt2, Gpt2Config, Mlp, ResNet};
use vramroom_tensor::nn::Init;
use vramroom_tensor::optim::{Adam, Optimizer, Sgd};
use vramroom_tensor::predict::{max_batch, predict, AccumPattern, Mode, OptimKind, PredictOptions};
use vramroom_tensor::{ops, safetensors, DType, Device, MemoryCategory, Module, Tensor};

const MIB: f64 = 1048576.0;

fn meta() -> Device {
    Device::meta_caching(1 << 44, AllocatorConfig::default())
}

fn cpu() -> Device {
    Device::cpu_caching(4 << 30, AllocatorConfig::default())
}

fn within(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want
}

#[test]
fn resnet_names_match_torchvision() {
    let d = meta();
    let m = ResNet::resnet50(&Init::new(&d, DType::F32), 1000).unwrap();
    let p = m.named_parameters();
    assert_eq!(p.len(), 161);
    assert_eq!(m.state_dict().len(), 320);
    let names: Vec<&str> = p.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "conv1.weight");
    assert_eq!(names[1], "bn1.weight");
    assert!(names.contains(&"layer1.0.conv1.weight"));
    assert!(names.contains(&"layer2.0.downsample.0.weight"));
    assert!(names.contains(&"layer4.2.bn3.bias"));
    assert_eq!(names[names.len() - 1], "fc.bias");
    assert!(m
        .named_buffers()
        .iter()
        .any(|(n, _)| n == "layer3.5.bn2.num_batches_tracked"));
    let numel: usize = p.iter().map(|(_, t)| t.numel()).sum();
    assert_eq!(numel, 25_557_032);
    let params = d.memory_by_category().get(MemoryCategory::Parameter) as f64 / MIB;
    assert!(within(params, 97.49, 0.005), "{params}");

    let r18 = ResNet::resnet18(&Init::new(&d, DType::F32), 1000).unwrap();
    assert_eq!(r18.named_parameters().len(), 62);
    assert_eq!(r18.state_dict().len(), 122);
    let n18: usize = r18.parameters().iter().map(|t| t.numel()).sum();
    assert_eq!(n18, 11_689_512);
}

#[test]
fn gpt2_names_match_hugging_face() {
    let d = meta();
    let m = Gpt2::new(&Init::new(&d, DType::F32), Gpt2Config::gpt2()).unwrap();
    let p = m.named_parameters();
    // GPT2LMHeadModel.named_parameters(): lm_head is tied to wte and not listed again.
    assert_eq!(p.len(), 148);
    let numel: usize = p.iter().map(|(_, t)| t.numel()).sum();
    assert_eq!(numel, 124_439_808);
    let names: Vec<&str> = p.iter().map(|(n, _)| n.as_str()).collect();
    for n in [
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.h.0.ln_1.weight",
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.0.attn.c_proj.bias",
        "transformer.h.11.ln_2.bias",
        "transformer.h.11.mlp.c_fc.weight",
        "transformer.h.11.mlp.c_proj.weight",
        "transformer.ln_f.weight",
    ] {
        assert!(names.contains(&n), "{n}");
    }
    // HF Conv1D layout: [in, out].
    let w = &p
        .iter()
        .find(|(n, _)| n == "transformer.h.0.attn.c_attn.weight")
        .unwrap()
        .1;
    assert_eq!(w.shape(), &[768, 2304]);
}

#[test]
fn tiny_gpt2_trains_on_cpu() {
    let d = cpu();
    d.manual_seed(0);
    let c = Gpt2Config::tiny();
    let m = Gpt2::new(&Init::new(&d, DType::F32), c).unwrap();
    let ids: Vec<i64> = (0..16).map(|i| (i * 7 % 50) as i64).collect();
    let x = Tensor::from_i64(&ids, &[2, 8], &d).unwrap();
    let y = Tensor::from_i64(&ids, &[16], &d).unwrap();
    let mut opt = Adam::adamw(m.parameters(), 1e-2, 0.0).unwrap();
    let mut first = None;
    let mut last = 0.0;
    for _ in 0..20 {
        let logits = m.forward(&x).unwrap();
        assert_eq!(logits.shape(), &[2, 8, 50]);
        let loss = m.loss(&logits, &y).unwrap();
        last = loss.item().unwrap();
        first.get_or_insert(last);
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad(true).unwrap();
    }
    let first = first.unwrap();
    assert!(last < first * 0.8, "loss {first} -> {last}");
}

#[test]
fn causal_attention_ignores_the_future() {
    let d = cpu();
    d.manual_seed(1);
    let m = Gpt2::new(&Init::new(&d, DType::F32), Gpt2Config::tiny()).unwrap();
    let a = Tensor::from_i64(&[1, 2, 3, 4], &[1, 4], &d).unwrap();
    let b = Tensor::from_i64(&[1, 2, 3, 9], &[1, 4], &d).unwrap();
    let _g = vramroom_tensor::no_grad();
    let la = m.forward(&a).unwrap().to_vec_f64().unwrap();
    let lb = m.forward(&b).unwrap().to_vec_f64().unwrap();
    // Positions 0..3 do not see token 3: identical logits; position 3 differs.
    assert_eq!(la[..150], lb[..150]);
    assert_ne!(la[150..], lb[150..]);
}

#[test]
fn optimizer_state_is_lazy_and_tagged() {
    let d = meta();
    let m = Mlp::new(&Init::new(&d, DType::F32), &[64, 128, 10]).unwrap();
    let params_b = d.memory_by_category().get(MemoryCategory::Parameter);
    for adam in [false, true] {
        let mut opt: Box<dyn Optimizer> = if adam {
            Box::new(Adam::adamw(m.parameters(), 1e-3, 0.01).unwrap())
        } else {
            Box::new(Sgd::new(m.parameters(), 0.1, 0.9, 0.0).unwrap())
        };
        assert_eq!(
            d.memory_by_category().get(MemoryCategory::OptimizerState),
            0
        );
        let x = Tensor::empty(&[4, 64], DType::F32, &d).unwrap();
        let t = Tensor::zeros(&[4], DType::I64, &d).unwrap();
        ops::cross_entropy(&m.forward(&x).unwrap(), &t)
            .unwrap()
            .backward()
            .unwrap();
        opt.step().unwrap();
        let st = d.memory_by_category().get(MemoryCategory::OptimizerState);
        assert_eq!(st, if adam { 2 * params_b } else { params_b });
        // No temporaries survive the step; what stays `temporary` is the cuBLAS handle
        // workspaces of the simulated GPU (first matmul forward and backward), held for good.
        assert_eq!(
            d.memory_by_category().get(MemoryCategory::Temporary),
            d.library_workspace_bytes()
        );
        assert_eq!(d.library_workspace_bytes(), (32 << 20) * 2 + (1 << 20));
        // set_to_none=False keeps the gradient memory; True frees it.
        opt.zero_grad(false).unwrap();
        assert_eq!(
            d.memory_by_category().get(MemoryCategory::Gradient),
            params_b
        );
        opt.zero_grad(true).unwrap();
        assert_eq!(d.memory_by_category().get(MemoryCategory::Gradient), 0);
        assert!(m.parameters().iter().all(|p| p.grad().is_none()));
        drop(opt);
    }
}

#[test]
fn sgd_momentum_matches_pytorch_update() {
    // torch: p=1, g=0.5 twice, lr 0.1, momentum 0.9: buf 0.5 -> p 0.95; buf 0.95 -> p 0.855.
    let d = cpu();
    let p = Tensor::from_f32(&[1.0], &[1], &d).unwrap();
    p.requires_grad_(true).unwrap();
    let mut opt = Sgd::new(vec![p.clone()], 0.1, 0.9, 0.0).unwrap();
    for want in [0.95, 0.855] {
        p.set_grad(Some(Tensor::from_f32(&[0.5], &[1], &d).unwrap()))
            .unwrap();
        opt.step().unwrap();
        assert!((p.item().unwrap() - want).abs() < 1e-6);
    }
}

#[test]
fn adamw_matches_pytorch_update() {
    // torch.optim.AdamW([p], lr=0.1, weight_decay=0.01), p=1, g=0.5: step 1 gives
    // p = 1*(1-0.001) - 0.1 * 1 = 0.899 (m_hat/sqrt(v_hat) = 1).
    let d = cpu();
    let p = Tensor::from_f32(&[1.0], &[1], &d).unwrap();
    p.requires_grad_(true).unwrap();
    let mut opt = Adam::adamw(vec![p.clone()], 0.1, 0.01).unwrap();
    p.set_grad(Some(Tensor::from_f32(&[0.5], &[1], &d).unwrap()))
        .unwrap();
    opt.step().unwrap();
    assert!(
        (p.item().unwrap() - 0.899).abs() < 1e-5,
        "{}",
        p.item().unwrap()
    );
}

#[test]
fn safetensors_round_trip() {
    let d = cpu();
    d.manual_seed(3);
    let a = ResNet::resnet18(&Init::new(&d, DType::F32), 10).unwrap();
    let path =
        std::env::temp_dir().join(format!("vramroom-r18-{}.safetensors", std::process::id()));
    safetensors::save(&path, &a.state_dict()).unwrap();
    d.manual_seed(4);
    let b = ResNet::resnet18(&Init::new(&d, DType::F32), 10).unwrap();
    let w = |m: &ResNet| m.conv1.weight.to_vec_f32().unwrap();
    assert_ne!(w(&a), w(&b));
    safetensors::load_into(&b, &path, true).unwrap();
    assert_eq!(w(&a), w(&b));
    assert_eq!(
        a.fc.bias.as_ref().unwrap().to_vec_f32().unwrap(),
        b.fc.bias.as_ref().unwrap().to_vec_f32().unwrap()
    );
    // Mixed dtypes survive too.
    let t = vec![
        (
            "x".to_string(),
            Tensor::from_f64(&[1.5, -2.0], &[2], DType::BF16, &d).unwrap(),
        ),
        (
            "i".to_string(),
            Tensor::from_i64(&[7, -9, 1 << 40], &[3], &d).unwrap(),
        ),
    ];
    let back = safetensors::deserialize(&safetensors::serialize(&t).unwrap(), &d).unwrap();
    let get = |n: &str| back.iter().find(|(k, _)| k == n).unwrap().1.clone();
    assert_eq!(get("x").dtype(), DType::BF16);
    assert_eq!(get("x").to_vec_f64().unwrap(), vec![1.5, -2.0]);
    assert_eq!(get("i").to_vec_i64().unwrap(), vec![7, -9, 1 << 40]);
    // Wrong shapes and truncated files are errors, not panics.
    let c = ResNet::resnet18(&Init::new(&d, DType::F32), 11).unwrap();
    assert!(safetensors::load_into(&c, &path, true).is_err());
    assert!(safetensors::deserialize(&[1, 2, 3], &d).is_err());
    let _ = std::fs::remove_file(&path);
}

fn r50(batch: usize, mode: Mode, grad: bool) -> PredictOptions {
    PredictOptions {
        model: ZooModel::resnet50(),
        batch,
        mode,
        grad,
        ..Default::default()
    }
}

#[test]
fn predict_resnet50_infer_matches_pytorch() {
    // ground-truth.md: peak above the input while the forward runs. The meta device of
    // `predict` allocates cuDNN's conv workspaces as PyTorch did (CudaLikeWorkspace), which
    // set the peak at small batch.
    for (bs, grad, want) in [
        (1, true, 89.71),
        (8, true, 656.58),
        (32, true, 2621.19),
        (64, true, 5229.88),
        (1, false, 11.75),
        (8, false, 85.75),
        (32, false, 318.5),
        (64, false, 637.0),
    ] {
        let p = predict(&r50(bs, Mode::Inference, grad)).unwrap();
        let got = p.peak_over_input_bytes as f64 / MIB;
        eprintln!("resnet50 bs{bs} grad={grad}: {got:.2} MiB (PyTorch {want})");
        assert!(
            within(got, want, 0.03),
            "bs{bs} grad={grad}: {got} vs {want}"
        );
        assert!(p.peak_reserved_bytes >= p.peak_allocated_bytes);
        assert!(p.categories.values().sum::<u64>() == p.peak_allocated_bytes);
    }
}

fn accum(n: usize, pattern: AccumPattern) -> PredictOptions {
    PredictOptions {
        model: ZooModel::resnet50(),
        batch: 32,
        mode: Mode::Training {
            optimizer: OptimKind::Sgd,
            accum_steps: n,
            pattern,
        },
        ..Default::default()
    }
}

#[test]
fn predict_accumulation_table() {
    // ground-truth.md: ResNet-50, micro-batch 32, SGD momentum.
    let mut each = Vec::new();
    let mut sum = Vec::new();
    for (n, want_each, want_sum) in [
        (1, 2706.90, 2672.65),
        (4, 2762.89, 10585.07),
        (8, 2762.89, 21133.39),
    ] {
        let e = predict(&accum(n, AccumPattern::Each))
            .unwrap()
            .peak_over_input_bytes as f64
            / MIB;
        let s = predict(&accum(n, AccumPattern::Sum))
            .unwrap()
            .peak_over_input_bytes as f64
            / MIB;
        eprintln!("accum {n}: each {e:.1} (PyTorch {want_each}), sum {s:.1} (PyTorch {want_sum})");
        each.push((e, want_each));
        sum.push((s, want_sum));
    }
    // Shape of the table: each-step flat (within 5% of 1 step), sum ~N x.
    assert!(each[2].0 < 1.05 * each[0].0);
    assert!(sum[1].0 > 3.5 * sum[0].0 && sum[2].0 > 7.0 * sum[0].0);
    for (got, want) in each.iter().chain(&sum) {
        assert!(within(*got, *want, 0.03), "{got} vs {want}");
    }
}

#[test]
fn predict_rejects_bad_input() {
    assert!(predict(&r50(0, Mode::Inference, false)).is_err());
    let mut o = r50(1, Mode::Inference, false);
    o.capacity = 0;
    assert!(predict(&o).is_err());
}

#[test]
fn max_batch_finds_the_largest_fit() {
    let mut o = r50(1, Mode::Inference, false);
    o.capacity = 2 << 30;
    let (b, p) = max_batch(&o, 4096).unwrap().unwrap();
    assert!(p.peak_reserved_bytes <= o.capacity);
    o.batch = b + 1;
    assert!(predict(&o).unwrap_err().is_oom());
    eprintln!("resnet50 no_grad max batch in 2 GiB: {b}");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "timing: run with --release")]
fn predict_gpt2_train_under_one_second() {
    let o = PredictOptions {
        model: ZooModel::gpt2(),
        batch: 32,
        seq: 1024,
        mode: Mode::Training {
            optimizer: OptimKind::AdamW,
            accum_steps: 1,
            pattern: AccumPattern::Each,
        },
        ..Default::default()
    };
    let t = std::time::Instant::now();
    let p = predict(&o).unwrap();
    let s = t.elapsed().as_secs_f64();
    eprintln!(
        "gpt2 bs32x1024 train: {:.1} GiB peak, {s:.3} s",
        p.peak_allocated_bytes as f64 / (1u64 << 30) as f64
    );
    assert!(s < 1.0, "{s} s");
}
