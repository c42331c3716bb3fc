//! Any bytes into the snapshot reader: errors are fine; panics, aborts, stack overflows,
//! timeouts and runaway allocations are findings.
#![no_main]

use vramroom_trace::pickle::{read_snapshot, write_snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = read_snapshot(data) {
        // whatever was accepted survives our writer and reader unchanged (compared as
        // bytes, so a NaN threshold compares equal to itself)
        let bytes = write_snapshot(&s);
        let again = read_snapshot(&bytes).expect("our own output reads back");
        assert_eq!(write_snapshot(&again), bytes);
    }
});
