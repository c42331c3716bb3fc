//! A cache hit touches no host allocator: once a size has been served once, malloc + free of
//! that size allocates nothing on the host (PyTorch's allocator does `new Block` on every
//! split; ours reuses arena slots and intrusive pool links).
//!
//! A counting `#[global_allocator]` counts allocations made by the thread that enabled it,
//! so the test harness's other threads do not disturb the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the thread-locals may already be gone while a thread shuts down.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: every call forwards to `System` unchanged; counting only touches const-initialised
// thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Host allocations made by `f` on this thread.
fn host_allocs(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    COUNT.with(|c| c.get())
}

fn hot_loop(conf: &str) {
    let a = CachingAllocator::new(
        SimDevice::new(80 << 30),
        AllocatorConfig::parse(conf).unwrap(),
    );
    const SIZES: [u64; 3] = [512, 1 << 20, 8 << 20];
    // Warm up: the first request of each size makes its segment; a few more pairs settle
    // the pointer map and the arena.
    for _ in 0..4 {
        for n in SIZES {
            let x = a.malloc(n, 0).unwrap();
            a.free(x.ptr).unwrap();
        }
    }
    // The counter itself works.
    assert!(host_allocs(|| drop(std::hint::black_box(vec![1u8; 16]))) >= 1);
    for n in SIZES {
        let reserved = a.memory_reserved();
        let count = host_allocs(|| {
            for _ in 0..10_000 {
                let x = a.malloc(n, 0).unwrap();
                a.free(std::hint::black_box(x.ptr)).unwrap();
            }
        });
        assert_eq!(
            count, 0,
            "{conf:?}: {n}-byte cache hits allocated on the host"
        );
        assert_eq!(a.memory_reserved(), reserved, "every pair was a cache hit");
    }
    // Holding several blocks of a size at once is also allocation-free once warmed.
    let mut ptrs = Vec::with_capacity(16);
    for _ in 0..2 {
        for _ in 0..16 {
            ptrs.push(a.malloc(4096, 0).unwrap().ptr);
        }
        for p in ptrs.drain(..) {
            a.free(p).unwrap();
        }
    }
    let count = host_allocs(|| {
        for _ in 0..1000 {
            for _ in 0..16 {
                ptrs.push(a.malloc(4096, 0).unwrap().ptr);
            }
            for p in ptrs.drain(..) {
                a.free(p).unwrap();
            }
        }
    });
    assert_eq!(
        count, 0,
        "{conf:?}: 16 live 4 KiB blocks allocated on the host"
    );
    a.check_invariants().unwrap();
}

#[test]
fn cache_hits_do_not_allocate_on_the_host() {
    hot_loop("");
}

#[test]
fn cache_hits_do_not_allocate_on_the_host_with_expandable_segments() {
    hot_loop("expandable_segments:True");
}

#[test]
fn cache_hits_do_not_allocate_on_the_host_with_max_split_size() {
    hot_loop("max_split_size_mb:64,roundup_power2_divisions:4");
}
