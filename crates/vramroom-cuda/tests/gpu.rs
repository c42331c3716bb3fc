//! Vramroom's allocator on a real GPU: real `cuMemAlloc`, VMM pages, stream events and OOM.
//! Every test is `#[ignore]`d with the reason, so `cargo test` on a machine without a GPU (CI)
//! lists them as ignored rather than passing them unrun; on a GPU machine run them with
//! `-- --include-ignored` (scripts/gpu-check.sh does). Asked to run with no GPU, they fail.
//!
//! The tests share the GPU, so they take a process-wide lock: memory figures from
//! `cuMemGetInfo` are device-wide and would be disturbed by a test running beside them.

use std::sync::Mutex;

use vramroom_alloc::{AllocatorConfig, CachingAllocator};
use vramroom_cuda::{unavailable_reason, CudaDevice, CudaStream, DeviceBuffer};

static GPU: Mutex<()> = Mutex::new(());

const MIB: u64 = 1 << 20;

macro_rules! gpu_or_skip {
    () => {{
        if let Some(why) = unavailable_reason() {
            panic!("{}: asked to run without a GPU: {why}", module_path!());
        }
        GPU.lock().unwrap_or_else(|e| e.into_inner())
    }};
}

fn alloc(conf: &str) -> CachingAllocator<CudaDevice> {
    let dev = CudaDevice::new(0).expect("device 0");
    CachingAllocator::new(dev, AllocatorConfig::parse(conf).expect("config"))
}

fn roundtrip(a: &CachingAllocator<CudaDevice>, ptr: u64, len: usize, v: u8) {
    a.with_device(|d| {
        DeviceBuffer::fill(d, ptr, v, len).expect("memset");
        let back = DeviceBuffer::read(d, ptr, len).expect("copy back");
        assert!(back.iter().all(|&b| b == v), "device memory did not hold");
    });
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn device_opens_and_reports_memory() {
    let _g = gpu_or_skip!();
    let d = CudaDevice::new(0).unwrap();
    let (free, total) = d.try_mem_get_info().unwrap();
    assert!(total > 0 && free <= total, "free {free} total {total}");
    assert_eq!(vramroom_alloc::Device::total_memory(&d), total);
    eprintln!(
        "device 0: {} ({}), {total} bytes, vmm {} granularity {}",
        d.name(),
        d.pci_bus_id(),
        vramroom_alloc::Device::supports_vmm(&d),
        d.granularity()
    );
    assert!(CudaDevice::new(i32::MAX).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn malloc_free_through_the_caching_allocator() {
    let _g = gpu_or_skip!();
    let a = alloc("");
    let x = a.malloc(1000, 0).unwrap();
    assert_eq!(x.ptr % 512, 0);
    assert_eq!(a.memory_allocated(), 1024);
    assert_eq!(a.memory_reserved(), 2 * MIB);
    roundtrip(&a, x.ptr, 1000, 0x5a);
    let y = a.malloc(3 * MIB, 0).unwrap();
    assert_eq!(a.memory_reserved(), 22 * MIB);
    roundtrip(&a, y.ptr, (3 * MIB) as usize, 0xa5);
    let z = a.malloc(64 * MIB, 0).unwrap();
    roundtrip(&a, z.ptr, (64 * MIB) as usize, 7);
    for p in [x.ptr, y.ptr, z.ptr] {
        a.free(p).unwrap();
    }
    // Cached: a same-size request gets the same block back without the driver.
    let y2 = a.malloc(3 * MIB, 0).unwrap();
    assert_eq!(y2.ptr, y.ptr);
    a.free(y2.ptr).unwrap();
    let st = a.memory_stats();
    assert_eq!(st["num_device_alloc"], 3);
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(a.memory_stats()["num_device_free"], 3);
    a.check_invariants().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn expandable_segments_grow_in_place() {
    let _g = gpu_or_skip!();
    let a = alloc("expandable_segments:True");
    if !a.with_device(|d| vramroom_alloc::Device::supports_vmm(d)) {
        eprintln!("SKIP: device has no VMM support");
        return;
    }
    let x = a.malloc(MIB + 1, 0).unwrap();
    let y = a.malloc(30 * MIB, 0).unwrap();
    // Spec section 8: the second tensor lands right after the first, one more 20 MiB page.
    assert_eq!(y.ptr, x.ptr + 1_049_088);
    assert_eq!(a.memory_reserved(), 40 * MIB);
    assert_eq!(a.with_device(|d| d.mapped_pages()), 2);
    roundtrip(&a, x.ptr, (MIB + 1) as usize, 1);
    roundtrip(&a, y.ptr, (30 * MIB) as usize, 2);
    // A small request maps one 2 MiB page of the small pool.
    let s = a.malloc(100 << 10, 0).unwrap();
    assert_eq!(a.memory_reserved(), 42 * MIB);
    roundtrip(&a, s.ptr, 100 << 10, 3);
    let st = a.memory_stats();
    assert_eq!(st["segment.all.allocated"], 0);
    assert_eq!(st["num_device_alloc"], 3);
    let snap = a.snapshot();
    assert!(snap.segments.iter().all(|s| s.is_expandable));
    for p in [x.ptr, y.ptr, s.ptr] {
        a.free(p).unwrap();
    }
    let (free_before, _) = a.mem_get_info();
    a.empty_cache();
    let (free_after, _) = a.mem_get_info();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(a.with_device(|d| d.mapped_pages()), 0);
    assert!(
        free_after >= free_before + 40 * MIB,
        "unmapping gave back {} bytes",
        free_after as i64 - free_before as i64
    );
    // The range can be mapped again afterwards.
    let z = a.malloc(50 * MIB, 0).unwrap();
    roundtrip(&a, z.ptr, (50 * MIB) as usize, 4);
    a.free(z.ptr).unwrap();
    a.empty_cache();
    a.check_invariants().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn record_stream_delays_reuse_until_the_side_stream_is_done() {
    let _g = gpu_or_skip!();
    let a = alloc("");
    let side = a.with_device(|d| CudaStream::new(d)).unwrap();
    let x = a.malloc(4 * MIB, 0).unwrap();
    // Hold the side stream, queue work on x there, and record the use.
    let gate = side.gate().unwrap();
    side.memset_d32(x.ptr, 0xdead_beef, (MIB) as usize).unwrap();
    a.record_stream(x.ptr, side.id()).unwrap();
    a.free(x.ptr).unwrap();
    // The side stream's work is not done: the block must not come back.
    let y = a.malloc(4 * MIB, 0).unwrap();
    assert_ne!(y.ptr, x.ptr, "a block in use on the side stream was reused");
    let st = a.memory_stats();
    assert_eq!(st["active_bytes.all.current"], (8 * MIB) as i64);
    assert_eq!(a.with_device(|d| d.event_counts().0), 1);
    // Still held after a while: the event stays incomplete.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let y2 = a.malloc(4 * MIB, 0).unwrap();
    assert_ne!(y2.ptr, x.ptr);
    a.free(y2.ptr).unwrap();
    gate.open();
    side.synchronize().unwrap();
    a.free(y.ptr).unwrap();
    // Now the event completed: the next malloc processes it and x's block is reusable.
    let z = a.malloc(4 * MIB, 0).unwrap();
    assert_eq!(z.ptr, x.ptr);
    assert_eq!(a.with_device(|d| d.event_counts()), (0, 1));
    a.free(z.ptr).unwrap();
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    a.check_invariants().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn empty_cache_returns_memory_to_the_driver() {
    let _g = gpu_or_skip!();
    let a = alloc("");
    let size = 4u64 << 30;
    let x = a.malloc(size, 0).unwrap();
    roundtrip(&a, x.ptr, 1 << 20, 9);
    a.free(x.ptr).unwrap();
    let (free_cached, _) = a.mem_get_info();
    assert_eq!(a.memory_reserved(), size);
    a.empty_cache();
    let (free_after, _) = a.mem_get_info();
    assert_eq!(a.memory_reserved(), 0);
    assert!(
        free_after >= free_cached + size - 64 * MIB,
        "free rose by {} bytes only",
        free_after as i64 - free_cached as i64
    );
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn oom_is_a_typed_error_with_pytorchs_message_and_the_allocator_survives() {
    let _g = gpu_or_skip!();
    let a = alloc("");
    let keep = a.malloc(256 * MIB, 0).unwrap();
    let total = a.with_device(|d| vramroom_alloc::Device::total_memory(d));
    let err = a.malloc(total * 2, 0).unwrap_err();
    let oom = err.as_oom().expect("a typed OOM");
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(
        msg.starts_with("CUDA out of memory. Tried to allocate "),
        "{msg}"
    );
    assert!(msg.contains("GPU 0 has a total capacity of "), "{msg}");
    assert!(
        msg.contains("is reserved by PyTorch but unallocated"),
        "{msg}"
    );
    assert_eq!(oom.total, total);
    assert_eq!(oom.allocated, 256 * MIB);
    assert_eq!(a.memory_stats()["num_ooms"], 1);
    // Still usable: the live block survived the retry's cache flush, and new memory comes.
    roundtrip(&a, keep.ptr, (256 * MIB) as usize, 0x11);
    let y = a.malloc(64 * MIB, 0).unwrap();
    roundtrip(&a, y.ptr, (64 * MIB) as usize, 0x22);
    a.free(y.ptr).unwrap();
    a.free(keep.ptr).unwrap();
    a.empty_cache();
    a.check_invariants().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn expandable_oom_releases_its_pages_and_recovers() {
    let _g = gpu_or_skip!();
    let a = alloc("expandable_segments:True");
    if !a.with_device(|d| vramroom_alloc::Device::supports_vmm(d)) {
        eprintln!("SKIP: device has no VMM support");
        return;
    }
    let (free, _) = a.mem_get_info();
    // More than is free but less than the reservation (total + total/8): mapping fails
    // part-way with a driver OOM.
    let err = a.malloc(free + (1 << 30), 0).unwrap_err();
    assert!(err.is_oom(), "{err}");
    assert_eq!(a.with_device(|d| d.mapped_pages()), 0);
    assert_eq!(a.memory_reserved(), 0);
    let y = a.malloc(100 * MIB, 0).unwrap();
    roundtrip(&a, y.ptr, (100 * MIB) as usize, 5);
    a.free(y.ptr).unwrap();
    a.empty_cache();
    a.check_invariants().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn many_threads_share_one_gpu_allocator() {
    let _g = gpu_or_skip!();
    let a = std::sync::Arc::new(alloc(""));
    let hs: Vec<_> = (0..4)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    let s = 512 + ((i * 7919 + t * 104729) % (8 << 20));
                    let x = a.malloc(s, 0).unwrap();
                    a.free(x.ptr).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(a.memory_allocated(), 0);
    a.empty_cache();
    a.check_invariants().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn nvml_sees_this_process() {
    let _g = gpu_or_skip!();
    if !vramroom_cuda::nvml_present() {
        eprintln!("SKIP: NVML not loadable");
        return;
    }
    let a = alloc("");
    let x = a.malloc(512 * MIB, 0).unwrap();
    let bus = a.with_device(|d| d.pci_bus_id().to_string());
    let m = vramroom_cuda::nvml::memory(&bus).expect("NVML memory");
    eprintln!("NVML: {m:?}");
    assert!(m.device_total > 0 && m.device_used >= 512 * MIB);
    if let Some(p) = m.process_used {
        assert!(p >= 512 * MIB, "process uses {p}");
    }
    a.free(x.ptr).unwrap();
    a.empty_cache();
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn dropping_the_allocator_gives_cached_memory_back() {
    let _g = gpu_or_skip!();
    // A second handle keeps the primary context alive across the drop.
    let probe = CudaDevice::new(0).unwrap();
    let (free0, _) = probe.try_mem_get_info().unwrap();
    let a = alloc("expandable_segments:True");
    let x = a.malloc(2 << 30, 0).unwrap();
    let b = alloc("");
    let y = b.malloc(2 << 30, 0).unwrap();
    a.free(x.ptr).unwrap();
    let _ = y; // still allocated when b drops
    let (free1, _) = probe.try_mem_get_info().unwrap();
    assert!(free1 + (4 << 30) <= free0 + 64 * MIB);
    drop(a);
    drop(b);
    let (free2, _) = probe.try_mem_get_info().unwrap();
    assert!(
        free2 + 64 * MIB >= free0,
        "free before {free0}, after drop {free2}"
    );
}
