//! A small driver for instruction-level profiling of the cache-hit path (malloc+free pairs),
//! e.g. under callgrind, counting only the measured loop:
//!
//! ```sh
//! valgrind --tool=callgrind --toggle-collect='pair_driver::measured*' \
//!     target/release/examples/pair_driver single 4096 100000
//! ```
//!
//! Cases mirror `vramroom bench alloc`: `single SIZE PAIRS` or `mixed LIVE PAIRS`, on a fresh
//! allocator over an H200-sized `SimDevice`, after the same warm-up as the bench.
//! `bench [quick|full]` runs the same cases and options as `vramroom bench alloc [--quick]`
//! (without the system-allocator peer) and prints one `case ns` line each.

use vramroom_alloc::bench::{self, BenchOptions, MixedSet, PairAlloc, SEED};
use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};

const CAPACITY: u64 = 150_109_880_320;

#[inline(always)]
fn pairs_single(a: &mut &CachingAllocator<SimDevice>, size: u64, pairs: u64) {
    for _ in 0..pairs {
        let p = a.alloc(std::hint::black_box(size)).unwrap();
        a.free(std::hint::black_box(p), size).unwrap();
    }
}

#[inline(always)]
fn steps(set: &mut MixedSet, a: &mut &CachingAllocator<SimDevice>, pairs: u64) {
    for _ in 0..pairs {
        set.step(a).unwrap();
    }
}

/// Warm-up, outside the measured functions so `--toggle-collect` skips it.
#[inline(never)]
fn warm_single(a: &mut &CachingAllocator<SimDevice>, size: u64, pairs: u64) {
    // Distinct bodies, so that identical-code folding cannot merge warm-up and measurement.
    std::hint::black_box(0u8);
    pairs_single(a, size, pairs)
}

#[inline(never)]
fn warm_mixed(set: &mut MixedSet, a: &mut &CachingAllocator<SimDevice>, pairs: u64) {
    std::hint::black_box(0u8);
    steps(set, a, pairs)
}

#[inline(never)]
fn measured_single(a: &mut &CachingAllocator<SimDevice>, size: u64, pairs: u64) {
    pairs_single(a, size, pairs)
}

#[inline(never)]
fn measured_mixed(set: &mut MixedSet, a: &mut &CachingAllocator<SimDevice>, pairs: u64) {
    steps(set, a, pairs)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("bench") {
        let opts = BenchOptions::new(args.get(1).map(String::as_str) != Some("full"));
        let fresh = || CachingAllocator::new(SimDevice::new(CAPACITY), AllocatorConfig::default());
        for c in bench::run_alloc_bench(fresh, &opts).expect("bench") {
            println!("{} {:.1}", c.name, c.ns_per_pair_median);
        }
        return;
    }
    let usage = "usage: pair_driver single SIZE PAIRS | mixed LIVE PAIRS | bench [quick|full]";
    let (kind, n, pairs) = match args.as_slice() {
        [k, n, p] => (
            k.as_str(),
            n.parse::<u64>().expect(usage),
            p.parse::<u64>().expect(usage),
        ),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let alloc = CachingAllocator::new(SimDevice::new(CAPACITY), AllocatorConfig::default());
    let mut a = &alloc;
    match kind {
        "single" => {
            warm_single(&mut a, n, 5_000);
            let t = std::time::Instant::now();
            measured_single(&mut a, n, pairs);
            println!(
                "{:.1} ns/pair",
                t.elapsed().as_nanos() as f64 / pairs as f64
            );
        }
        "mixed" => {
            let mut set = MixedSet::new(&mut a, n as usize, 20_000, SEED).unwrap();
            warm_mixed(&mut set, &mut a, 5_000.max(4 * n));
            let t = std::time::Instant::now();
            measured_mixed(&mut set, &mut a, pairs);
            println!(
                "{:.1} ns/pair",
                t.elapsed().as_nanos() as f64 / pairs as f64
            );
            set.release(&mut a).unwrap();
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
