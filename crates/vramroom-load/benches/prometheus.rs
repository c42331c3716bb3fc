//! The Prometheus text parser and the memory mapping on a scrape the size of what the probe
//! exports for one device (every `memory_stats()` key, ~160 series, plus the gauges) and
//! of a DCGM exporter on 8 GPUs. A scrape every 250 ms must cost the client nothing that
//! matters: `cargo bench -p vramroom-load --bench prometheus`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vramroom_load::http::prometheus::{parse, MetricMap};

fn probe_text() -> String {
    let mut s = String::from(
        "# HELP vramroom_probe_info The probe.\n# TYPE vramroom_probe_info gauge\n\
         vramroom_probe_info{version=\"0.1.0\",torch=\"2.11.0\",pid=\"4242\",record_history=\"true\"} 1\n\
         # TYPE torch_cuda_memory_stats gauge\n",
    );
    let kinds = [
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "requested_bytes",
        "allocation",
        "segment",
        "active",
        "inactive_split",
    ];
    let mut n = 1u64;
    for k in kinds {
        for pool in ["all", "large_pool", "small_pool"] {
            for stat in ["current", "peak", "allocated", "freed"] {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                s.push_str(&format!(
                    "torch_cuda_memory_stats{{device=\"0\",key=\"{k}.{pool}.{stat}\"}} {}\n",
                    n >> 30
                ));
            }
        }
    }
    for g in [
        "torch_cuda_memory_allocated_bytes",
        "torch_cuda_memory_reserved_bytes",
        "torch_cuda_max_memory_allocated_bytes",
        "torch_cuda_device_total_bytes",
        "torch_cuda_device_used_bytes",
    ] {
        s.push_str(&format!(
            "# HELP {g} A gauge.\n# TYPE {g} gauge\n{g}{{device=\"0\"}} 150754820096\n"
        ));
    }
    s.push_str("vramroom_probe_ooms_total 0\n");
    s
}

fn dcgm_text() -> String {
    let mut s = String::new();
    for m in [
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_POWER_USAGE",
    ] {
        s.push_str(&format!("# HELP {m} A DCGM field.\n# TYPE {m} gauge\n"));
        for g in 0..8 {
            s.push_str(&format!(
                "{m}{{gpu=\"{g}\",UUID=\"GPU-2f9a6c1e-0000-4b3c-9d1e-00000000000{g}\",\
                 device=\"nvidia{g}\",modelName=\"NVIDIA H200\",Hostname=\"node-17\"}} 81920\n"
            ));
        }
    }
    s
}

fn bench(c: &mut Criterion) {
    let map = MetricMap::known();
    for (name, text) in [("probe", probe_text()), ("dcgm_8gpu", dcgm_text())] {
        let mut g = c.benchmark_group(format!("prometheus/{name}"));
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function("parse", |b| b.iter(|| parse(&text).unwrap()));
        let e = parse(&text).unwrap();
        g.bench_function("map", |b| b.iter(|| map.apply(&e)));
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
