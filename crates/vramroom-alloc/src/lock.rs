//! The allocator's lock: test-and-set with a plain-store unlock, spinning briefly, then
//! yielding, then sleeping.
//!
//! Design note: a malloc+free pair takes the lock twice, and its critical sections are tens
//! of nanoseconds. A parking mutex (parking_lot, std's futex mutex) must unlock with an
//! atomic read-modify-write, to learn whether someone is parked: on x86 that is about 3 ns a
//! time, 6 ns of a 50 ns pair. Nobody parks here, so unlock is a release store. The cost
//! moves to the waiters, who are rare and wait briefly: they spin on a plain load (no cache
//! line ping-pong), then yield the CPU so that a preempted holder can run, and after a long
//! wait (the device calls of a cache miss or `empty_cache` can take milliseconds) sleep in
//! short naps rather than burn a core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_api::RawMutex as _;

pub struct RawSpinLock {
    locked: AtomicBool,
}

// SAFETY: `lock` returns only after this thread swapped `locked` from false to true with
// acquire ordering, and `unlock` stores false with release ordering, so at most one guard
// exists at a time and the data's writes are published to the next holder.
unsafe impl lock_api::RawMutex for RawSpinLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = RawSpinLock {
        locked: AtomicBool::new(false),
    };
    type GuardMarker = lock_api::GuardSend;

    #[inline(always)]
    fn lock(&self) {
        if !self.try_lock() {
            self.lock_slow();
        }
    }

    #[inline(always)]
    fn try_lock(&self) -> bool {
        self.locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[inline(always)]
    unsafe fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

impl RawSpinLock {
    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        let mut waits = 0u32;
        loop {
            // Test before test-and-set: wait on a shared read of the line.
            while self.locked.load(Ordering::Relaxed) {
                match waits {
                    0..100 => std::hint::spin_loop(),
                    100..1100 => std::thread::yield_now(),
                    _ => std::thread::sleep(Duration::from_micros(20)),
                }
                waits = waits.saturating_add(1);
            }
            if self.try_lock() {
                return;
            }
        }
    }
}

/// A mutex over [`RawSpinLock`].
pub type Mutex<T> = lock_api::Mutex<RawSpinLock, T>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Many threads, more than cores, each adding to a counter under the lock many times: no
    /// increment is lost, and nobody waits forever.
    #[test]
    fn excludes_and_makes_progress_under_oversubscription() {
        let m = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = m.lock();
                        // A read-modify-write that races if two guards overlap.
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 16 * 20_000);
    }
}
