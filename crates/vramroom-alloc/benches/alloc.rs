//! Criterion benchmarks of the caching allocator's hot path, side by side with the system
//! allocator, plus replay of a 50,000-event synthetic trace.
//!
//! `cargo bench -p vramroom-alloc --bench alloc -- --quick` (everything), or
//! `cargo bench -p vramroom-alloc --bench alloc -- table` (only the summary table below).
//!
//! Cases are PyTorch's (results__default.json `microbench`): malloc+free pairs of one size
//! (512 B, 4 KiB, 1 MiB, 8 MiB, 64 MiB) and mixed working sets of 16, 256 and 4096 live
//! blocks. After criterion's own report, a table from `vramroom_alloc::bench` gives medians,
//! PyTorch's figures and the system-allocator ratio.

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use vramroom_alloc::bench::{
    self, BenchOptions, MixedSet, PairAlloc, SystemAlloc, MIXED_LIVE, SEED, SINGLE_SIZES,
};
use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};

/// An H200's memory: the 4096-block mixed set holds about 33 GB.
const CAPACITY: u64 = 150_109_880_320;

fn fresh() -> CachingAllocator<SimDevice> {
    CachingAllocator::new(SimDevice::new(CAPACITY), AllocatorConfig::default())
}

/// PyTorch's `microbench` figures (ns per pair), from results__default.json.
const PYTORCH: [(&str, f64); 8] = [
    ("cpp_pair_ns_512", 626.840555),
    ("cpp_pair_ns_4096", 782.308325),
    ("cpp_pair_ns_1048576", 532.190485),
    ("cpp_pair_ns_8388608", 619.93782),
    ("cpp_pair_ns_67108864", 340.80889),
    ("cpp_mixed_ns_live16", 633.645355),
    ("cpp_mixed_ns_live256", 739.55601),
    ("cpp_mixed_ns_live4096", 808.84714),
];

fn single<A: PairAlloc>(b: &mut criterion::Bencher<'_>, a: &mut A, size: u64) {
    // warm: the first pair creates the segment
    let p = a.alloc(size).unwrap();
    a.free(p, size).unwrap();
    b.iter(|| {
        let p = a.alloc(std::hint::black_box(size)).unwrap();
        a.free(std::hint::black_box(p), size).unwrap();
    });
}

fn mixed<A: PairAlloc>(b: &mut criterion::Bencher<'_>, a: &mut A, live: usize) {
    let mut set = MixedSet::new(a, live, 100_000, SEED).unwrap();
    for _ in 0..(4 * live).max(10_000) {
        set.step(a).unwrap();
    }
    b.iter(|| set.step(a).unwrap());
    set.release(a).unwrap();
}

fn alloc_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    g.throughput(Throughput::Elements(1));
    for size in SINGLE_SIZES {
        let name = bench::single_name(size);
        g.bench_function(BenchmarkId::new("vramroom", &name), |b| {
            let a = fresh();
            single(b, &mut &a, size)
        });
        g.bench_function(BenchmarkId::new("system", &name), |b| {
            single(b, &mut SystemAlloc, size)
        });
    }
    for live in MIXED_LIVE {
        let name = format!("mixed_live{live}");
        g.bench_function(BenchmarkId::new("vramroom", &name), |b| {
            let a = fresh();
            mixed(b, &mut &a, live)
        });
        g.bench_function(BenchmarkId::new("system", &name), |b| {
            mixed(b, &mut SystemAlloc, live)
        });
    }
    g.finish();
}

fn replay_bench(c: &mut Criterion) {
    let snap = bench::synthetic_trace(50_000, SEED);
    let opts = vramroom_trace::ReplayOptions::default();
    let mut g = c.benchmark_group("replay");
    g.sample_size(10);
    g.throughput(Throughput::Elements(50_000));
    g.bench_function("synthetic_50k", |b| {
        b.iter(|| vramroom_trace::replay(&snap, &opts).unwrap())
    });
    g.finish();
}

criterion_group!(benches, alloc_benches, replay_bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // Under `cargo bench` (not `cargo test --benches`), unfiltered or with the filter
    // `table` (which matches no criterion benchmark), also print the side-by-side table.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filtered = args.iter().any(|a| !a.starts_with("--") && a != "table");
    if !args.iter().any(|a| a == "--bench")
        || filtered
        || args
            .iter()
            .any(|a| a == "--list" || a.starts_with("--profile-time"))
    {
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let opts = BenchOptions::new(quick);
    let mut ours = bench::run_alloc_bench(fresh, &opts).expect("allocator bench");
    bench::attach_pytorch_reference(&mut ours, |k| {
        PYTORCH.iter().find(|(n, _)| *n == k).map(|p| p.1)
    });
    let sys = bench::run_system_bench(&opts).expect("system bench");
    println!(
        "\nvramroom-alloc vs PyTorch 2.11 (H200 host) and the system allocator, ns per malloc+free pair ({} pairs x {} repeats):",
        opts.pairs, opts.repeats
    );
    print!("{}", bench::format_table(&ours, Some(&sys)));
}
