//! Hostile and malformed input: every case must come back as an error, never a panic,
//! a stack overflow or a runaway allocation.

mod common;

use std::collections::BTreeMap;

use serde_pickle::{HashableValue, SerOptions, Value};
use vramroom_trace::pickle::{read_snapshot, write_snapshot};
use vramroom_trace::{
    AllocatorSettings, Annotation, BlockInfo, BlockState, Frame, SegmentInfo, Snapshot, Stack,
    TraceAction, TraceEntry, TraceError,
};

fn frame(n: u64) -> Frame {
    Frame {
        name: format!("fn{n}"),
        filename: "/tmp/model.py".into(),
        line: n,
    }
}

fn entry(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
    TraceEntry {
        action,
        addr,
        size,
        stream: 0,
        time_us: 1_796_215_770_379_106,
        compile_context: "N/A".into(),
        user_metadata: "".into(),
        frames: None,
    }
}

/// A small snapshot touching every field.
fn sample() -> Snapshot {
    let seg = |address: u64| SegmentInfo {
        device: 0,
        address,
        total_size: 2 << 20,
        allocated_size: 512,
        active_size: 512,
        requested_size: 400,
        stream: 0,
        segment_type: "small".into(),
        segment_pool_id: (0, 0),
        is_expandable: false,
        frames: Stack::empty(),
        blocks: vec![
            BlockInfo {
                address,
                size: 512,
                requested_size: 400,
                state: BlockState::ActiveAllocated,
                frames: vec![frame(1), frame(2)].into(),
            },
            BlockInfo {
                address: address + 512,
                size: (2 << 20) - 512,
                requested_size: 16384,
                state: BlockState::Inactive,
                frames: Stack::empty(),
            },
        ],
    };
    let mut with_frames = entry(TraceAction::Alloc, 140308325072896, 400);
    with_frames.frames = Some(vec![frame(3)].into());
    Snapshot {
        segments: vec![seg(140308325072896), seg(140308327169024)],
        device_traces: vec![vec![
            entry(TraceAction::SegmentAlloc, 140308325072896, 2 << 20),
            with_frames,
            entry(TraceAction::FreeRequested, 140308325072896, 400),
            entry(TraceAction::FreeCompleted, 140308325072896, 400),
            entry(TraceAction::Oom, 81_000_000_000, 1 << 40),
        ]],
        allocator_settings: AllocatorSettings::default(),
        external_annotations: vec![Annotation {
            stage: "START".into(),
            name: "region".into(),
            device: 0,
            time_us: 5,
        }],
    }
}

fn to_value(s: &Snapshot) -> Value {
    // our writer memoizes strings only, which serde-pickle decodes correctly
    serde_pickle::value_from_slice(&write_snapshot(s), Default::default()).unwrap()
}

fn from_value(v: &Value) -> Result<Snapshot, TraceError> {
    read_snapshot(&serde_pickle::value_to_vec(v, SerOptions::new()).unwrap())
}

fn key(k: &str) -> HashableValue {
    HashableValue::String(k.into())
}

fn dict_mut<'a>(v: &'a mut Value, k: &str) -> &'a mut Value {
    match v {
        Value::Dict(m) => m.get_mut(&key(k)).unwrap_or_else(|| panic!("no key {k}")),
        _ => panic!("not a dict"),
    }
}

fn idx_mut(v: &mut Value, i: usize) -> &mut Value {
    match v {
        Value::List(l) => &mut l[i],
        _ => panic!("not a list"),
    }
}

fn expect_not_snapshot(r: Result<Snapshot, TraceError>, needle: &str) {
    match r {
        Err(TraceError::NotASnapshot(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected NotASnapshot containing {needle:?}, got {other:?}"),
    }
}

fn expect_pickle_err(r: Result<Snapshot, TraceError>, needle: &str) {
    match r {
        Err(TraceError::Pickle(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected Pickle error containing {needle:?}, got {other:?}"),
    }
}

/// xorshift64*: deterministic noise without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn sample_round_trips() {
    let s = sample();
    assert_eq!(read_snapshot(&write_snapshot(&s)).unwrap(), s);
    assert_eq!(from_value(&to_value(&s)).unwrap(), s);
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let mut inputs = vec![write_snapshot(&sample())];
    if common::shared_pickles().is_some() {
        let dir = common::shared_dir();
        inputs.push(std::fs::read(dir.join("spec/golden/dump.pickle")).unwrap());
        inputs.push(std::fs::read(dir.join("traces/resnet50_train_sgd__default.pickle")).unwrap());
    }
    for bytes in &inputs {
        // every offset of the small ones, a spread of the large one
        let step = if bytes.len() < 5000 {
            1
        } else {
            bytes.len() / 400
        };
        for cut in (0..bytes.len()).step_by(step) {
            let prefix = bytes.get(..cut).unwrap();
            expect_pickle_err(read_snapshot(prefix), "truncated");
        }
    }
}

#[test]
fn random_bytes_and_bit_flips_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..3000 {
        let len = (rng.next() % 600) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if round % 2 == 0 {
            bytes.splice(0..0, [0x80, 0x04]);
        }
        assert!(read_snapshot(&bytes).is_err());
    }
    // single-byte corruption of a valid file: any outcome but a panic
    let base = write_snapshot(&sample());
    for i in 0..base.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = base.clone();
            b[i] ^= flip;
            let _ = read_snapshot(&b);
        }
    }
}

#[test]
fn pickles_of_other_things_are_not_snapshots() {
    let cases: Vec<(Value, &str)> = vec![
        (Value::I64(5), "top level: expected a dict"),
        (Value::String("segments".into()), "found str \"segments\""),
        (Value::None, "found None"),
        (Value::F64(1.5), "found float 1.5"),
        (Value::Bytes(vec![1, 2]), "found bytes"),
        (Value::Dict(BTreeMap::new()), "missing key `segments`"),
        (
            Value::List(vec![Value::I64(1)]),
            "`[0]`: expected a dict, found int 1",
        ),
        (
            Value::Dict([(key("segments"), Value::I64(3))].into()),
            "`segments`: expected a list, found int 3",
        ),
    ];
    for (v, needle) in cases {
        expect_not_snapshot(from_value(&v), needle);
    }
    // hand-assembled: a protocol-2 pickle of the int 7
    expect_not_snapshot(read_snapshot(b"\x80\x02K\x07."), "found int 7");
}

#[test]
fn errors_name_the_path_of_the_bad_key() {
    let base = to_value(&sample());

    let mut v = base.clone();
    *dict_mut(
        idx_mut(
            dict_mut(idx_mut(dict_mut(&mut v, "segments"), 1), "blocks"),
            0,
        ),
        "size",
    ) = Value::String("big".into());
    expect_not_snapshot(
        from_value(&v),
        "`segments[1].blocks[0].size`: expected a non-negative integer, found str \"big\"",
    );

    let mut v = base.clone();
    if let Value::Dict(m) = idx_mut(idx_mut(dict_mut(&mut v, "device_traces"), 0), 3) {
        m.remove(&key("size"));
    }
    expect_not_snapshot(from_value(&v), "missing key `device_traces[0][3].size`");

    let mut v = base.clone();
    *dict_mut(idx_mut(dict_mut(&mut v, "segments"), 0), "address") = Value::I64(-4096);
    expect_not_snapshot(
        from_value(&v),
        "`segments[0].address`: expected a non-negative integer, found int -4096",
    );

    let mut v = base.clone();
    *dict_mut(idx_mut(dict_mut(&mut v, "segments"), 0), "stream") = two_pow_64();
    expect_not_snapshot(
        from_value(&v),
        "`segments[0].stream`: expected an integer below 2^64",
    );

    let mut v = base.clone();
    *dict_mut(
        idx_mut(idx_mut(dict_mut(&mut v, "device_traces"), 0), 0),
        "action",
    ) = Value::String("teleport".into());
    expect_not_snapshot(
        from_value(&v),
        "`device_traces[0][0].action`: expected a trace action",
    );

    let mut v = base.clone();
    *dict_mut(
        idx_mut(
            dict_mut(idx_mut(dict_mut(&mut v, "segments"), 0), "blocks"),
            1,
        ),
        "state",
    ) = Value::String("haunted".into());
    expect_not_snapshot(
        from_value(&v),
        "`segments[0].blocks[1].state`: expected a block state",
    );

    let mut v = base.clone();
    *dict_mut(
        idx_mut(
            dict_mut(
                idx_mut(
                    dict_mut(idx_mut(dict_mut(&mut v, "segments"), 0), "blocks"),
                    0,
                ),
                "frames",
            ),
            1,
        ),
        "line",
    ) = Value::F64(2.0);
    expect_not_snapshot(
        from_value(&v),
        "`segments[0].blocks[0].frames[1].line`: expected a non-negative integer, found float 2",
    );

    let mut v = base.clone();
    *dict_mut(
        dict_mut(&mut v, "allocator_settings"),
        "expandable_segments",
    ) = Value::I64(1);
    expect_not_snapshot(
        from_value(&v),
        "`allocator_settings.expandable_segments`: expected a bool",
    );

    let mut v = base;
    *dict_mut(idx_mut(dict_mut(&mut v, "segments"), 0), "segment_pool_id") =
        Value::Tuple(vec![Value::I64(1)]);
    expect_not_snapshot(
        from_value(&v),
        "`segments[0].segment_pool_id`: expected a pair of integers",
    );
}

/// 2^64 as a serde-pickle BigInt, made by its own decoder (LONG1 of 9 bytes).
fn two_pow_64() -> Value {
    serde_pickle::value_from_slice(b"\x80\x04\x8a\x09\0\0\0\0\0\0\0\0\x01.", Default::default())
        .unwrap()
}

#[test]
fn unknown_keys_and_none_values_are_tolerated() {
    let s = sample();
    let mut v = to_value(&s);
    let extra = || Value::List(vec![Value::I64(1), Value::Dict(BTreeMap::new())]);
    if let Value::Dict(m) = &mut v {
        m.insert(key("future_top_level"), extra());
    }
    if let Value::Dict(m) = idx_mut(dict_mut(&mut v, "segments"), 0) {
        m.insert(key("future_segment_key"), extra());
    }
    if let Value::Dict(m) = idx_mut(idx_mut(dict_mut(&mut v, "device_traces"), 0), 1) {
        m.insert(key("category"), Value::String("activation".into()));
        m.insert(HashableValue::I64(7), Value::None);
    }
    assert_eq!(from_value(&v).unwrap(), s);

    // None where an optional key may be: same as absent
    if let Value::Dict(m) = idx_mut(idx_mut(dict_mut(&mut v, "device_traces"), 0), 1) {
        m.insert(key("frames"), Value::None);
    }
    assert_eq!(from_value(&v).unwrap().device_traces[0][1].frames, None);
}

#[test]
fn older_schemas_get_defaults() {
    let mut v = to_value(&sample());
    let seg = idx_mut(dict_mut(&mut v, "segments"), 0);
    if let Value::Dict(m) = seg {
        for k in [
            "is_expandable",
            "segment_pool_id",
            "frames",
            "requested_size",
        ] {
            m.remove(&key(k));
        }
    }
    for b in 0..2 {
        if let Value::Dict(m) = idx_mut(
            dict_mut(idx_mut(dict_mut(&mut v, "segments"), 0), "blocks"),
            b,
        ) {
            m.remove(&key("address"));
        }
    }
    if let Value::Dict(m) = &mut v {
        m.remove(&key("allocator_settings"));
        m.remove(&key("external_annotations"));
    }
    let s = from_value(&v).unwrap();
    let want = sample();
    assert_eq!(
        s.segments, want.segments,
        "addresses and requested_size recomputed"
    );
    assert_eq!(s.allocator_settings, AllocatorSettings::default());
    assert!(s.external_annotations.is_empty());
}

#[test]
fn memory_snapshot_list_form() {
    let s = sample();
    let v = to_value(&s);
    let segments = match &v {
        Value::Dict(m) => m[&key("segments")].clone(),
        _ => unreachable!(),
    };
    let got = from_value(&segments).unwrap();
    assert_eq!(got.segments, s.segments);
    assert!(got.device_traces.is_empty());
    assert_eq!(got.allocator_settings, AllocatorSettings::default());
}

#[test]
fn oom_entries_use_device_free() {
    let s = sample();
    let v = to_value(&s);
    let oom = match &v {
        Value::Dict(m) => match &m[&key("device_traces")] {
            Value::List(devs) => match &devs[0] {
                Value::List(entries) => entries[4].clone(),
                _ => unreachable!(),
            },
            _ => unreachable!(),
        },
        _ => unreachable!(),
    };
    let Value::Dict(m) = &oom else { unreachable!() };
    assert_eq!(
        m.get(&key("device_free")),
        Some(&Value::I64(81_000_000_000))
    );
    assert!(!m.contains_key(&key("addr")));
    let back = read_snapshot(&write_snapshot(&s)).unwrap();
    assert_eq!(back.device_traces[0][4].addr, 81_000_000_000);

    // a missing device_free is reported under PyTorch's name for it
    let mut v = v;
    if let Value::Dict(m) = idx_mut(idx_mut(dict_mut(&mut v, "device_traces"), 0), 4) {
        m.remove(&key("device_free"));
    }
    expect_not_snapshot(
        from_value(&v),
        "missing key `device_traces[0][4].device_free`",
    );
}

#[test]
fn extreme_integers_round_trip_and_python_agrees() {
    let mut s = sample();
    s.segments[0].address = u64::MAX;
    s.segments[0].stream = 1 << 63;
    s.segments[1].device = i64::MIN;
    s.segments[1].segment_pool_id = (i64::MAX, -1);
    s.device_traces[0][0].time_us = i64::MIN;
    s.device_traces[0][1].addr = (1 << 32) - 1;
    s.allocator_settings.garbage_collection_threshold = 0.8;
    let bytes = write_snapshot(&s);
    assert_eq!(read_snapshot(&bytes).unwrap(), s);

    let dir = common::scratch("extreme");
    let path = dir.join("extreme.pickle");
    std::fs::write(&path, &bytes).unwrap();
    let script = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
s0, s1 = d['segments']
assert s0['address'] == 2**64 - 1, s0['address']
assert s0['stream'] == 2**63
assert s1['device'] == -2**63
assert s1['segment_pool_id'] == (2**63 - 1, -1)
assert d['device_traces'][0][0]['time_us'] == -2**63
assert d['device_traces'][0][1]['addr'] == 2**32 - 1
assert d['device_traces'][0][4]['device_free'] == 81_000_000_000
assert 'addr' not in d['device_traces'][0][4]
assert d['allocator_settings']['garbage_collection_threshold'] == 0.8
assert list(d['allocator_settings']['roundup_power2_divisions']) == [str(1 << i) for i in range(16)]
print('ok')
"#;
    if let Some(out) = common::python(script, &[&path]) {
        assert_eq!(out.trim(), "ok");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn other_protocols_read_the_same() {
    let Some(_) = common::shared_pickles() else {
        return;
    };
    let golden = common::shared_dir().join("spec/golden/dump.pickle");
    let want = vramroom_trace::read_snapshot_file(&golden).unwrap();
    let dir = common::scratch("protocols");
    for proto in [0, 1, 2, 3, 5] {
        let out = dir.join(format!("p{proto}.pickle"));
        let script = format!(
            "import pickle, sys\nd = pickle.load(open(sys.argv[1], 'rb'))\n\
             pickle.dump(d, open(sys.argv[2], 'wb'), protocol={proto})"
        );
        if common::python(&script, &[&golden, &out]).is_none() {
            return;
        }
        let got = vramroom_trace::read_snapshot_file(&out)
            .unwrap_or_else(|e| panic!("protocol {proto}: {e}"));
        assert_eq!(got, want, "protocol {proto}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn hostile_structures_are_refused() {
    // a million nested lists: `]]]…aaa.`
    let n = 1_000_000;
    let mut deep = vec![0x80, 0x04];
    deep.extend(std::iter::repeat_n(b']', n));
    deep.extend(std::iter::repeat_n(b'a', n - 1));
    deep.push(b'.');
    expect_pickle_err(read_snapshot(&deep), "nested deeper");

    // sharing bomb: each list holds the previous one twice
    let bomb = |levels: u32| {
        let mut b = vec![0x80, 0x04, b']', 0x94];
        for i in 0..levels {
            b.extend([b']', b'(', b'j']);
            b.extend(i.to_le_bytes());
            b.push(b'j');
            b.extend(i.to_le_bytes());
            b.extend([b'e', 0x94]);
        }
        b.push(b'.');
        b
    };
    expect_pickle_err(read_snapshot(&bomb(100)), "nested deeper");
    // 2^40 leaves from 500 bytes, within the depth limit: the converter follows the
    // schema and never expands it
    expect_not_snapshot(
        read_snapshot(&bomb(40)),
        "`[0]`: expected a dict, found list of 2",
    );
    // the same, shallow but wide: 40 lists of 1000 references to the previous one
    let mut wide = vec![0x80, 0x04, b'K', 1, 0x94];
    for i in 0u32..40 {
        wide.extend([b']', b'(']);
        for _ in 0..1000 {
            wide.push(b'j');
            wide.extend(i.to_le_bytes());
        }
        wide.extend([b'e', 0x94]);
    }
    wide.push(b'.');
    expect_not_snapshot(read_snapshot(&wide), "found list of 1000");
    // DUP doubling
    let mut dup = vec![0x80, 0x04, b']'];
    for _ in 0..60 {
        dup.extend([b'2', b'a']);
    }
    dup.push(b'.');
    assert!(read_snapshot(&dup).is_err());

    let cases: Vec<(&[u8], &str)> = vec![
        (b"\x80\x04]\x94h\x00a.", "recursive"),
        (b"\x80\x04cos\nsystem\n(S'echo hi'\ntR.", "not plain data"),
        (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", "not plain data"),
        (b"\x80\x06}.", "unsupported protocol 6"),
        (b"\x80\x04h\x05.", "never stored"),
        (b"\x80\x04a.", "stack underflow"),
        (b"\x80\x04K\x01K\x02a.", "not a List"),
        (b"\x80\x04]K\x01e.", "no MARK"),
        (b"\x80\x04}(]K\x01u.", "unhashable"),
        (b"\x80\x04\x8b\xff\xff\xff\xff.", "negative length"),
        (
            b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff.",
            "truncated",
        ),
        (b"\x80\x04X\x05\x00\x00\x00ab.", "truncated"),
        (b"\x80\x04\x8c\x02\xff\xfe.", "UTF-8"),
        (b"\x80\x04}(K\x01u.", "odd number"),
        (b"\x80\x04.", "stack underflow"),
        (b"", "no STOP"),
    ];
    for (bytes, needle) in cases {
        expect_pickle_err(read_snapshot(bytes), needle);
    }
    let mut marks = vec![0x80, 0x04];
    marks.extend(std::iter::repeat_n(b'(', 100_000));
    expect_pickle_err(read_snapshot(&marks), "too many open MARKs");
    let mut long_int = b"\x80\x02L".to_vec();
    long_int.extend(std::iter::repeat_n(b'9', 100_000));
    long_int.extend(b"L\n.");
    expect_pickle_err(read_snapshot(&long_int), "too long");
}
