//! Any snapshot survives write → read, and the reader survives mutations of what the
//! writer produced.

use proptest::prelude::*;
use vramroom_trace::pickle::{read_snapshot, write_snapshot};
use vramroom_trace::{
    AllocatorSettings, Annotation, BlockInfo, BlockState, Frame, SegmentInfo, Snapshot, Stack,
    TraceAction, TraceEntry,
};

fn text() -> impl Strategy<Value = String> {
    // short ASCII, any Unicode, and strings past SHORT_BINUNICODE's 255 bytes
    prop_oneof!["[a-z_./]{0,12}", any::<String>(), "[a-zé😀]{250,300}",]
}

fn frames() -> impl Strategy<Value = Stack> {
    prop::collection::vec(
        (text(), text(), any::<u64>()).prop_map(|(name, filename, line)| Frame {
            name,
            filename,
            line,
        }),
        0..3,
    )
    .prop_map(Stack::from)
}

fn block() -> impl Strategy<Value = BlockInfo> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::sample::select(vec![
            BlockState::ActiveAllocated,
            BlockState::ActivePendingFree,
            BlockState::Inactive,
        ]),
        frames(),
    )
        .prop_map(|(address, size, requested_size, state, frames)| BlockInfo {
            address,
            size,
            requested_size,
            state,
            frames,
        })
}

fn segment() -> impl Strategy<Value = SegmentInfo> {
    (
        (
            any::<i64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        ),
        (any::<u64>(), text(), any::<(i64, i64)>(), any::<bool>()),
        frames(),
        prop::collection::vec(block(), 0..4),
    )
        .prop_map(
            |(
                (device, address, total_size, allocated_size, active_size, requested_size),
                (stream, segment_type, segment_pool_id, is_expandable),
                frames,
                blocks,
            )| SegmentInfo {
                device,
                address,
                total_size,
                allocated_size,
                active_size,
                requested_size,
                stream,
                segment_type,
                segment_pool_id,
                is_expandable,
                frames,
                blocks,
            },
        )
}

fn entry() -> impl Strategy<Value = TraceEntry> {
    (
        prop::sample::select(TraceAction::ALL.to_vec()),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<i64>()),
        (text(), text()),
        prop::option::of(frames()),
    )
        .prop_map(
            |(action, (addr, size, stream, time_us), (compile_context, user_metadata), frames)| {
                TraceEntry {
                    action,
                    addr,
                    size,
                    stream,
                    time_us,
                    compile_context: compile_context.into(),
                    user_metadata: user_metadata.into(),
                    frames,
                }
            },
        )
}

fn settings() -> impl Strategy<Value = AllocatorSettings> {
    (
        (text(), any::<i64>(), -1e300f64..1e300, any::<bool>()),
        (any::<i64>(), any::<bool>(), any::<bool>(), any::<bool>()),
        prop::collection::btree_map(prop_oneof!["[0-9]{1,5}", text()], any::<i64>(), 0..20),
    )
        .prop_map(
            |((conf, max_split, gc, exp), (threads, rl, host_reg, reuse), divs)| {
                AllocatorSettings {
                    pytorch_cuda_alloc_conf: conf,
                    max_split_size: max_split,
                    garbage_collection_threshold: gc,
                    expandable_segments: exp,
                    pinned_num_register_threads: threads,
                    release_lock_on_cudamalloc: rl,
                    pinned_use_cuda_host_register: host_reg,
                    graph_capture_record_stream_reuse: reuse,
                    roundup_power2_divisions: divs,
                }
            },
        )
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (
        prop::collection::vec(segment(), 0..4),
        prop::collection::vec(prop::collection::vec(entry(), 0..6), 0..3),
        settings(),
        prop::collection::vec(
            (text(), text(), any::<i64>(), any::<i64>()).prop_map(
                |(stage, name, device, time_us)| Annotation {
                    stage,
                    name,
                    device,
                    time_us,
                },
            ),
            0..3,
        ),
    )
        .prop_map(
            |(segments, device_traces, allocator_settings, external_annotations)| Snapshot {
                segments,
                device_traces,
                allocator_settings,
                external_annotations,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn write_then_read_is_identity(s in snapshot()) {
        let bytes = write_snapshot(&s);
        prop_assert_eq!(read_snapshot(&bytes).unwrap(), s.clone());
        // deterministic output
        prop_assert_eq!(write_snapshot(&s), bytes);
    }

    #[test]
    fn mutated_output_never_panics(
        s in snapshot(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let clean = write_snapshot(&s);
        let n = cut.index(clean.len());
        prop_assert!(read_snapshot(&clean[..n]).is_err());
        let mut bytes = clean;
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        let _ = read_snapshot(&bytes);
    }
}
