//! Hard limits: capacities and config values near 2^64 end in a typed answer (an OOM, or
//! memory that works), never in a wrapped-around number, a panic or an abort.

use vramroom_alloc::{AllocatorConfig, CachingAllocator, HostDevice, SimDevice};

const MIB: u64 = 1 << 20;

fn sim(capacity: u64, conf: &str) -> CachingAllocator<SimDevice> {
    CachingAllocator::new(
        SimDevice::new(capacity),
        AllocatorConfig::parse(conf).expect("conf"),
    )
}

/// `--capacity 18446744073709551615` with expandable segments: the reservation is sized from
/// the capacity, and its page bookkeeping used to be allocated eagerly (a terabyte of
/// flags, an abort). Now it follows the pages really mapped.
#[test]
fn expandable_segments_on_a_16_eib_device_work_and_stay_small() {
    for cap in [u64::MAX, 16383 << 50, 1 << 62] {
        let a = sim(cap, "expandable_segments:True");
        let x = a.malloc(3 * MIB, 0).expect("3 MiB");
        let y = a.malloc(30 * MIB, 0).expect("30 MiB");
        let z = a.malloc(100 << 10, 0).expect("100 KiB");
        // PyTorch's growth in place: the second block right after the first
        assert_eq!(y.ptr, x.ptr + 3 * MIB, "cap {cap}");
        assert_eq!(a.memory_reserved(), 40 * MIB + 2 * MIB);
        // a request far above any reservation bound still fits the device it asked for
        let big = a.malloc(8 << 40, 0).expect("8 TiB on a 16 EiB device");
        assert!(a.memory_reserved() >= 8 << 40);
        for p in [x.ptr, y.ptr, z.ptr, big.ptr] {
            a.free(p).unwrap();
        }
        a.empty_cache();
        assert_eq!(a.memory_reserved(), 0);
        a.check_invariants().unwrap();
    }
}

/// A real capacity keeps PyTorch's reservation of total + total/8; a simulated capacity
/// past ~3.5 TiB reserves the 4 TiB bound. Each stream gets its own reservation, and the
/// simulated device places them back to back, so the distance between two streams' first
/// blocks is the reservation's size.
#[test]
fn reservations_are_pytorchs_for_real_capacities_and_bounded_above() {
    let page = 20 * MIB;
    for (cap, want) in [
        (80u64 << 30, 90u64 << 30),
        (
            150_109_880_320,
            (150_109_880_320u64 + 150_109_880_320 / 8).div_ceil(page) * page,
        ),
        (u64::MAX, (1u64 << 42).div_ceil(page) * page),
    ] {
        let a = sim(cap, "expandable_segments:True");
        let x = a.malloc(3 * MIB, 0).unwrap();
        let y = a.malloc(3 * MIB, 1).unwrap();
        assert_eq!(y.ptr - x.ptr, want, "capacity {cap}");
        a.free(x.ptr).unwrap();
        a.free(y.ptr).unwrap();
        a.check_invariants().unwrap();
    }
}

/// `large_segment_size_mb:17592186044415` is clamped (as PyTorch clamps it) to 16 EiB - 1 MiB.
/// A 1-10 MiB request then asks the device for a segment of that size: an OOM, counted,
/// never a wrapped-around small segment (peak reserved used to come out below allocated).
#[test]
fn a_huge_large_segment_size_is_an_oom_not_a_wrap() {
    for conf in [
        "large_segment_size_mb:17592186044415",
        "large_segment_size_mb:17592186044415,expandable_segments:True",
        "large_segment_size_mb:99999999999",
    ] {
        for cap in [80 << 30, u64::MAX] {
            let a = sim(cap, conf);
            let small = a.malloc(100 << 10, 0).expect("small pool is unaffected");
            let segment = a.config().large_segment_size;
            if segment < cap / 2 {
                // 93 PiB segments on a 16 EiB device: they fit, and are counted as such
                let x = a.malloc(3 * MIB, 0).expect("fits");
                assert_eq!(a.memory_reserved(), 2 * MIB + segment);
                a.free(x.ptr).unwrap();
                a.free(small.ptr).unwrap();
                a.check_invariants().unwrap();
                continue;
            }
            let err = a.malloc(3 * MIB, 0).unwrap_err();
            assert!(err.is_oom(), "{conf} on {cap}: {err}");
            assert_eq!(a.memory_stats()["num_ooms"], 1, "{conf}");
            if conf.contains("expandable") {
                // every large-pool page is that size: 12 MiB fails the same way
                let err = a.malloc(12 * MIB, 0).unwrap_err();
                assert!(err.is_oom(), "{conf} on {cap}: {err}");
                assert_eq!(a.memory_stats()["num_ooms"], 2, "{conf}");
            } else {
                // 10 MiB and up are segments of their own size, and still work
                let big = a.malloc(12 * MIB, 0).expect("12 MiB");
                a.free(big.ptr).unwrap();
            }
            assert!(
                a.memory_reserved() >= a.memory_allocated(),
                "{conf} on {cap}"
            );
            assert!(a.max_memory_reserved() < 1 << 30, "{conf} on {cap}");
            a.free(small.ptr).unwrap();
            a.check_invariants().unwrap();
        }
    }
}

/// Host memory: a segment size no layout can describe is an OOM, not an error or abort.
#[test]
fn host_device_refuses_impossible_sizes_as_oom() {
    let a = CachingAllocator::new(
        HostDevice::new(u64::MAX),
        AllocatorConfig::parse("large_segment_size_mb:17592186044415").unwrap(),
    );
    let err = a.malloc(3 * MIB, 0).unwrap_err();
    assert!(err.is_oom(), "{err}");
    let ok = a.malloc(MIB / 2, 0).unwrap();
    a.free(ok.ptr).unwrap();
    a.check_invariants().unwrap();
}

/// Requests of 1 EB and more fail without touching any stat, as in PyTorch.
#[test]
fn requests_of_an_exabyte_fail_without_stats() {
    let a = sim(u64::MAX, "");
    let err = a.malloc(1 << 63, 0).unwrap_err();
    assert!(err.is_oom());
    assert_eq!(a.memory_stats()["num_ooms"], 0);
    assert_eq!(a.memory_reserved(), 0);
}
