//! Real PyTorch 2.11 snapshots: parse, count, round-trip, and compare with Python.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use vramroom_trace::pickle::{
    read_snapshot, read_snapshot_file, write_snapshot, write_snapshot_file,
};
use vramroom_trace::{BlockState, Snapshot, TraceAction, TraceError};

fn action_counts(s: &Snapshot) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for t in s.device_traces.iter().flatten() {
        *m.entry(t.action.as_str().to_string()).or_insert(0) += 1;
    }
    m
}

#[test]
fn resnet50_infer_default_counts() {
    let Some(_) = common::shared_pickles() else {
        return;
    };
    let path = common::shared_dir().join("traces/resnet50_infer_nograd__default.pickle");
    let s = read_snapshot_file(&path).unwrap();
    assert_eq!(s.segments.len(), 31);
    assert_eq!(s.device_traces.len(), 1);
    assert_eq!(s.device_traces[0].len(), 5514);
    let c = action_counts(&s);
    assert_eq!(c["alloc"], 1829);
    assert_eq!(c["free_requested"], 1827);
    assert_eq!(c["free_completed"], 1827);
    assert_eq!(c["segment_alloc"], 31);
    assert_eq!(c.len(), 4);
    // segments come sorted by address, each tiled by its blocks
    for seg in &s.segments {
        assert_eq!(
            seg.blocks.iter().map(|b| b.size).sum::<u64>(),
            seg.total_size
        );
        assert_eq!(seg.blocks[0].address, seg.address);
    }
    assert!(s.segments.windows(2).all(|w| w[0].address < w[1].address));
    assert_eq!(s.allocator_settings.max_split_size, -1);
    assert_eq!(s.allocator_settings.roundup_power2_divisions.len(), 16);
}

#[test]
fn golden_dump_details() {
    let Some(_) = common::shared_pickles() else {
        return;
    };
    let s = read_snapshot_file(&common::shared_dir().join("spec/golden/dump.pickle")).unwrap();
    assert_eq!(s.segments.len(), 2);
    assert_eq!(s.device_traces[0].len(), 8);
    let first = &s.segments[0].blocks[0];
    assert_eq!(first.size, 512);
    assert_eq!(first.requested_size, 400);
    assert_eq!(first.state, BlockState::ActiveAllocated);
    assert_eq!(first.frames.len(), 3);
    assert_eq!(first.frames[0].name, "_");
    assert_eq!(first.frames[0].line, 313);
    let t0 = &s.device_traces[0][0];
    assert_eq!(t0.action, TraceAction::SegmentAlloc);
    assert_eq!(&*t0.compile_context, "N/A");
    assert_eq!(t0.frames.as_ref().map(|f| f.len()), Some(3));
    assert!(s.device_traces[0].iter().any(|t| t.frames.is_none()));
    assert_eq!(s.external_annotations.len(), 2);
    assert_eq!(s.external_annotations[0].stage, "START");
    assert_eq!(s.external_annotations[0].name, "my_region");
    assert_eq!(
        s.allocator_settings.pytorch_cuda_alloc_conf,
        "expandable_segments:False"
    );
}

/// What Python sees in each file, to compare our counts against.
const PY_COUNTS: &str = r#"
import json, pickle, sys, collections
out = {}
for f in sys.argv[1:]:
    d = pickle.load(open(f, 'rb'))
    segs = d['segments']
    ents = [e for t in d['device_traces'] for e in t]
    out[f] = {
        'segments': len(segs),
        'blocks': sum(len(s['blocks']) for s in segs),
        'block_frames': sum(len(b['frames']) for s in segs for b in s['blocks']),
        'devices': len(d['device_traces']),
        'entries': len(ents),
        'entries_with_frames': sum('frames' in e for e in ents),
        'actions': dict(collections.Counter(e['action'] for e in ents)),
        'annotations': len(d['external_annotations']),
        'conf': d['allocator_settings']['PYTORCH_CUDA_ALLOC_CONF'],
        'total_size': sum(s['total_size'] for s in segs),
    }
print(json.dumps(out))
"#;

#[test]
fn every_shared_pickle_parses_with_pythons_counts() {
    let Some(files) = common::shared_pickles() else {
        return;
    };
    let paths: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let Some(json) = common::python(PY_COUNTS, &paths) else {
        return;
    };
    let expected: serde_json::Value = serde_json::from_str(&json).unwrap();
    for f in &files {
        let s = read_snapshot_file(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let e = &expected[f.to_str().unwrap()];
        let ents: Vec<_> = s.device_traces.iter().flatten().collect();
        let got = serde_json::json!({
            "segments": s.segments.len(),
            "blocks": s.segments.iter().map(|x| x.blocks.len()).sum::<usize>(),
            "block_frames": s.segments.iter().flat_map(|x| &x.blocks).map(|b| b.frames.len()).sum::<usize>(),
            "devices": s.device_traces.len(),
            "entries": ents.len(),
            "entries_with_frames": ents.iter().filter(|t| t.frames.is_some()).count(),
            "actions": action_counts(&s),
            "annotations": s.external_annotations.len(),
            "conf": s.allocator_settings.pytorch_cuda_alloc_conf,
            "total_size": s.segments.iter().map(|x| x.total_size).sum::<u64>(),
        });
        assert_eq!(&got, e, "{}", f.display());
    }
}

#[test]
fn round_trip_read_write_read() {
    let Some(files) = common::shared_pickles() else {
        return;
    };
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let s = read_snapshot(&bytes).unwrap();
        let written = write_snapshot(&s);
        let again = read_snapshot(&written).unwrap();
        assert_eq!(s, again, "{}", f.display());
        // string memoization keeps files about PyTorch's size
        assert!(
            written.len() < bytes.len() * 3 / 2,
            "{}: {} bytes written for {} read",
            f.display(),
            written.len(),
            bytes.len()
        );
    }
}

/// Compares two pickles as Python objects, strictly: same types (tuple is not list, bool
/// is not int), same dict key order, equal values. Then checks that `ours` uses only
/// opcodes that MemoryViz.js's unpickler implements.
const PY_COMPARE: &str = r#"
import pickle, pickletools, sys
def same(a, b, path):
    if type(a) is not type(b):
        sys.exit(f'{path}: {type(a).__name__} vs {type(b).__name__}')
    if isinstance(a, dict):
        if list(a) != list(b):
            sys.exit(f'{path}: key order {list(a)} vs {list(b)}')
        for k in a:
            same(a[k], b[k], f'{path}.{k}')
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            sys.exit(f'{path}: length {len(a)} vs {len(b)}')
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f'{path}[{i}]')
    elif a != b:
        sys.exit(f'{path}: {a!r} vs {b!r}')
theirs, ours = sys.argv[1], sys.argv[2]
a = pickle.load(open(theirs, 'rb'))
data = open(ours, 'rb').read()
b = pickle.loads(data)
same(a, b, 'root')
assert a == b
viz = {'PROTO', 'FRAME', 'STOP', 'MARK', 'APPEND', 'APPENDS', 'LIST', 'TUPLE', 'DICT',
       'SETITEM', 'SETITEMS', 'EMPTY_DICT', 'EMPTY_LIST', 'EMPTY_TUPLE', 'TUPLE1', 'TUPLE2',
       'TUPLE3', 'NEWTRUE', 'NEWFALSE', 'NONE', 'BININT', 'BININT1', 'BININT2', 'LONG1',
       'BINFLOAT', 'SHORT_BINUNICODE', 'BINUNICODE', 'MEMOIZE', 'BINPUT', 'LONG_BINPUT',
       'BINGET', 'LONG_BINGET'}
ops = {op.name for op, _, _ in pickletools.genops(data)}
assert ops <= viz, ops - viz
assert data[:2] == b'\x80\x04', data[:2]
print(sorted(ops))
"#;

#[test]
fn python_sees_the_same_objects() {
    let Some(files) = common::shared_pickles() else {
        return;
    };
    let dir = common::scratch("python-compare");
    for f in &files {
        let s = read_snapshot_file(f).unwrap();
        let ours = dir.join(f.file_name().unwrap());
        write_snapshot_file(&s, &ours).unwrap();
        let Some(ops) = common::python(PY_COMPARE, &[f, &ours]) else {
            return;
        };
        assert!(ops.contains("MEMOIZE"), "{ops}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn trailing_bytes_after_stop_are_ignored() {
    let Some(_) = common::shared_pickles() else {
        return;
    };
    let mut bytes = std::fs::read(common::shared_dir().join("spec/golden/dump.pickle")).unwrap();
    let s = read_snapshot(&bytes).unwrap();
    // what _memory_viz.trace_plot appends before base64-encoding
    bytes.extend([0, 0, 0]);
    assert_eq!(read_snapshot(&bytes).unwrap(), s);
}

#[test]
fn file_writes_are_atomic_and_clean() {
    let dir = common::scratch("atomic");
    let target = dir.join("snap.pickle");
    let s = Snapshot::default();
    write_snapshot_file(&s, &target).unwrap();
    write_snapshot_file(&s, &target).unwrap();
    assert_eq!(read_snapshot_file(&target).unwrap(), s);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["snap.pickle".to_string()], "no temp files left");

    let missing = dir.join("no/such/dir/snap.pickle");
    match write_snapshot_file(&s, &missing) {
        Err(TraceError::Io { path, .. }) => assert!(path.starts_with(dir.join("no"))),
        other => panic!("expected Io error, got {other:?}"),
    }
    match read_snapshot_file(&missing) {
        Err(e @ TraceError::Io { .. }) => assert!(e.to_string().contains("no/such/dir")),
        other => panic!("expected Io error, got {other:?}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}
