//! Hostile *semantics*: every input becomes a well-formed pickle of a snapshot-shaped dict
//! (the generator in `crates/vramroom-trace/tests/snapshot_gen/mod.rs`, shared with the
//! stable proptest `replay_semantic.rs`), with sizes and addresses near the ends of u64,
//! negative numbers, events out of order, frees of unknown addresses, huge
//! `max_split_size` and long `PYTORCH_CUDA_ALLOC_CONF` strings. The reader must decide
//! each without panicking; what it accepts must survive our writer; and replay of what it
//! accepts, on a small simulated GPU, must return Ok or Err. Run with `-timeout=` so a
//! replay that does not finish is a finding too.
#![no_main]

#[path = "../../crates/vramroom-trace/tests/snapshot_gen/mod.rs"]
mod snapshot_gen;

use vramroom_alloc::AllocatorConfig;
use vramroom_trace::pickle::{read_snapshot, write_snapshot};
use vramroom_trace::replay::{replay, ReplayOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = snapshot_gen::pickle(data);
    let Ok(s) = read_snapshot(&bytes) else {
        return;
    };
    let written = write_snapshot(&s);
    let again = read_snapshot(&written).expect("our own output reads back");
    assert_eq!(write_snapshot(&again), written);
    let (capacity, stop_at_oom, record_history) = snapshot_gen::replay_choices(data);
    let config = AllocatorConfig::from_settings(&s.allocator_settings)
        .or_else(|_| AllocatorConfig::parse(&s.allocator_settings.pytorch_cuda_alloc_conf))
        .unwrap_or_default();
    let opts = ReplayOptions {
        config,
        capacity: Some(capacity),
        stop_at_oom,
        record_history,
        ..ReplayOptions::default()
    };
    let _ = replay(&s, &opts);
});
