//! Thread safety: several threads hammering one `Arc<CachingAllocator<SimDevice>>`.
//! The state must stay consistent under any interleaving, and once every thread has freed
//! what it allocated nothing is left allocated.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};

const MIB: u64 = 1 << 20;

/// xorshift64: a deterministic per-thread sequence.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn size(r: &mut Rng) -> u64 {
    match r.below(10) {
        0..=4 => 1 + r.below(64 * 1024),
        5..=7 => 1 + r.below(4 * MIB),
        8 => 10 * MIB + r.below(20 * MIB),
        _ => 1 + r.below(64 * MIB),
    }
}

fn hammer(conf: &str, threads: u64, ops: u64) {
    let a = Arc::new(CachingAllocator::new(
        SimDevice::new(1536 * MIB),
        AllocatorConfig::parse(conf).unwrap(),
    ));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let a = Arc::clone(&a);
            thread::spawn(move || {
                let mut r = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0x1234_5678_9abc));
                // Thread t allocates on stream t (stream 0 is shared by thread 0 and
                // everyone's odd steps) and records uses on the others.
                let my_stream = t;
                let mut live: Vec<u64> = Vec::new();
                let mut ooms = 0u64;
                for i in 0..ops {
                    match r.below(100) {
                        0..=44 => {
                            let s = if i % 2 == 1 { 0 } else { my_stream };
                            match a.malloc(size(&mut r), s) {
                                Ok(al) => live.push(al.ptr),
                                Err(e) => {
                                    assert!(e.is_oom(), "{e}");
                                    ooms += 1;
                                }
                            }
                        }
                        45..=84 => {
                            if !live.is_empty() {
                                let p = live.swap_remove(r.below(live.len() as u64) as usize);
                                a.free(p).unwrap();
                            }
                        }
                        85..=89 => {
                            if !live.is_empty() {
                                let p = live[r.below(live.len() as u64) as usize];
                                a.record_stream(p, 100 + r.below(threads)).unwrap();
                            }
                        }
                        90..=93 => {
                            let s = 100 + r.below(threads);
                            if r.below(2) == 0 {
                                a.with_device(|d| d.hold_stream(s));
                            } else {
                                a.with_device(|d| d.release_stream(s));
                            }
                        }
                        94 => a.empty_cache(),
                        95 => {
                            let _ = a.snapshot();
                            let _ = a.memory_stats();
                        }
                        _ => a.check_invariants().unwrap(),
                    }
                }
                for p in live {
                    a.free(p).unwrap();
                }
                ooms
            })
        })
        .collect();
    let ooms: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    for s in 0..threads {
        a.with_device(|d| d.release_stream(100 + s));
    }
    a.check_invariants().unwrap();
    assert_eq!(a.memory_allocated(), 0);
    let st = a.memory_stats();
    assert_eq!(st["allocation.all.current"], 0);
    assert!(st["allocation.all.allocated"] > (threads * ops / 4) as i64);
    assert_eq!(st["num_ooms"], ooms as i64);
    a.empty_cache();
    a.check_invariants().unwrap();
    assert_eq!(a.memory_stats()["active.all.current"], 0);
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(a.with_device(|d| d.used()), 0);
}

#[test]
fn threads_hammer_one_allocator() {
    hammer("", 4, 4000);
}

#[test]
fn threads_hammer_one_allocator_with_expandable_segments() {
    hammer("expandable_segments:True", 4, 4000);
}

#[test]
fn threads_hammer_one_allocator_with_max_split_size_and_gc() {
    hammer(
        "max_split_size_mb:32,garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
        4,
        4000,
    );
}

#[test]
fn blocks_can_be_freed_by_another_thread() {
    let a = Arc::new(CachingAllocator::new(
        SimDevice::new(8 << 30),
        AllocatorConfig::default(),
    ));
    let (tx, rx) = mpsc::channel::<u64>();
    let producer = {
        let a = Arc::clone(&a);
        thread::spawn(move || {
            for i in 0..2000u64 {
                let p = a.malloc(1 + (i * 7919) % (3 * MIB), 0).unwrap().ptr;
                tx.send(p).unwrap();
            }
        })
    };
    let consumer = {
        let a = Arc::clone(&a);
        thread::spawn(move || {
            let mut n = 0;
            for p in rx {
                a.free(p).unwrap();
                n += 1;
            }
            n
        })
    };
    producer.join().unwrap();
    assert_eq!(consumer.join().unwrap(), 2000);
    a.check_invariants().unwrap();
    assert_eq!(a.memory_allocated(), 0);
}

#[test]
fn allocator_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CachingAllocator<SimDevice>>();
    assert_send_sync::<Arc<CachingAllocator<SimDevice>>>();
}
