//! Real PyTorch 2.11 recordings with stacks (`fixtures/snapshots/`, recorded on an H200
//! with PyTorch's default recording arguments and some others): every one reads, holds
//! what Python's `pickle.load` sees, and survives our writer.
//!
//! `VRAMROOM_CORPUS=DIR` runs the same checks on every `*.pickle` under `DIR` as well
//! (the full corpus is not in the repository).

mod common;

use std::path::{Path, PathBuf};

use vramroom_trace::pickle::{read_snapshot, read_snapshot_file, write_snapshot};
use vramroom_trace::Snapshot;

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/snapshots");
    let mut files = pickles_in(&dir);
    assert_eq!(files.len(), 16, "sixteen fixtures in {}", dir.display());
    if let Some(extra) = std::env::var_os("VRAMROOM_CORPUS") {
        let extra = PathBuf::from(extra);
        files.extend(pickles_in(&extra));
        files.extend(pickles_in(&extra.join("hf")));
    }
    files
}

fn pickles_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    files.sort();
    files
}

/// What Python sees in each file: counts, and sums over every frame reference and every
/// trace entry, so a frame or number read wrong anywhere shows.
const PY_SUMMARY: &str = r#"
import json, pickle, sys, collections
M = 2**64
out = {}
for f in sys.argv[1:]:
    d = pickle.load(open(f, 'rb'))
    segs = d['segments']
    blocks = [b for s in segs for b in s['blocks']]
    ents = [e for t in d['device_traces'] for e in t]
    stacks = [s['frames'] for s in segs] + [b['frames'] for b in blocks] + \
             [e['frames'] for e in ents if 'frames' in e]
    frames = [fr for st in stacks for fr in st]
    out[f] = {
        'segments': len(segs),
        'blocks': len(blocks),
        'devices': len(d['device_traces']),
        'entries': len(ents),
        'entries_with_frames': sum('frames' in e for e in ents),
        'frame_refs': len(frames),
        'frame_lines': sum(fr['line'] for fr in frames) % M,
        'frame_text': sum(len(fr['name']) + 3 * len(fr['filename']) for fr in frames) % M,
        'entry_sums': [sum(e.get('addr', e.get('device_free', 0)) for e in ents) % M,
                       sum(e['size'] for e in ents) % M,
                       sum(e['stream'] for e in ents) % M,
                       sum(e['time_us'] for e in ents) % M],
        'block_sums': [sum(b['address'] for b in blocks) % M,
                       sum(b['size'] for b in blocks) % M,
                       sum(b['requested_size'] for b in blocks) % M],
        'actions': dict(collections.Counter(e['action'] for e in ents)),
        'contexts': sorted(set(e['compile_context'] for e in ents)),
        'annotations': len(d['external_annotations']),
        'settings': d['allocator_settings'],
        'total_size': sum(s['total_size'] for s in segs),
    }
print(json.dumps(out))
"#;

fn summary(s: &Snapshot) -> serde_json::Value {
    let w = |x: u64, acc: u64| acc.wrapping_add(x);
    let blocks: Vec<_> = s.segments.iter().flat_map(|g| &g.blocks).collect();
    let ents: Vec<_> = s.device_traces.iter().flatten().collect();
    let stacks = s
        .segments
        .iter()
        .map(|g| &g.frames)
        .chain(blocks.iter().map(|b| &b.frames))
        .chain(ents.iter().filter_map(|e| e.frames.as_ref()));
    let frames: Vec<_> = stacks.flat_map(|st| st.iter()).collect();
    let mut actions = std::collections::BTreeMap::new();
    for e in &ents {
        *actions.entry(e.action.as_str()).or_insert(0usize) += 1;
    }
    let mut contexts: Vec<&str> = ents.iter().map(|e| &*e.compile_context).collect();
    contexts.sort();
    contexts.dedup();
    let a = &s.allocator_settings;
    serde_json::json!({
        "segments": s.segments.len(),
        "blocks": blocks.len(),
        "devices": s.device_traces.len(),
        "entries": ents.len(),
        "entries_with_frames": ents.iter().filter(|e| e.frames.is_some()).count(),
        "frame_refs": frames.len(),
        "frame_lines": frames.iter().fold(0, |acc, f| w(f.line, acc)),
        "frame_text": frames.iter().fold(0, |acc, f| w((f.name.len() + 3 * f.filename.len()) as u64, acc)),
        "entry_sums": [
            ents.iter().fold(0, |acc, e| w(e.addr, acc)),
            ents.iter().fold(0, |acc, e| w(e.size, acc)),
            ents.iter().fold(0, |acc, e| w(e.stream, acc)),
            ents.iter().fold(0, |acc, e| w(e.time_us as u64, acc)),
        ],
        "block_sums": [
            blocks.iter().fold(0, |acc, b| w(b.address, acc)),
            blocks.iter().fold(0, |acc, b| w(b.size, acc)),
            blocks.iter().fold(0, |acc, b| w(b.requested_size, acc)),
        ],
        "actions": actions,
        "contexts": contexts,
        "annotations": s.external_annotations.len(),
        "settings": {
            "PYTORCH_CUDA_ALLOC_CONF": a.pytorch_cuda_alloc_conf,
            "max_split_size": a.max_split_size,
            "garbage_collection_threshold": a.garbage_collection_threshold,
            "expandable_segments": a.expandable_segments,
            "pinned_num_register_threads": a.pinned_num_register_threads,
            "release_lock_on_cudamalloc": a.release_lock_on_cudamalloc,
            "pinned_use_cuda_host_register": a.pinned_use_cuda_host_register,
            "graph_capture_record_stream_reuse": a.graph_capture_record_stream_reuse,
            "roundup_power2_divisions": a.roundup_power2_divisions,
        },
        "total_size": s.segments.iter().map(|g| g.total_size).sum::<u64>(),
    })
}

#[test]
fn every_fixture_reads_what_python_reads() {
    let files = fixtures();
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let Some(json) = common::python(PY_SUMMARY, &paths) else {
        // without Python, at least every file must read
        for f in &files {
            read_snapshot_file(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        }
        return;
    };
    let expected: serde_json::Value = serde_json::from_str(&json).unwrap();
    for f in &files {
        let s = read_snapshot_file(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(
            summary(&s),
            expected[f.to_str().unwrap()],
            "{}",
            f.display()
        );
    }
}

#[test]
fn fixtures_have_stacks_and_share_them() {
    for f in fixtures() {
        let s = read_snapshot_file(&f).unwrap();
        let ents: Vec<_> = s.device_traces.iter().flatten().collect();
        let with: Vec<_> = ents.iter().filter_map(|e| e.frames.as_ref()).collect();
        if with.is_empty() {
            continue;
        }
        let refs: usize = with.iter().map(|st| st.len()).sum();
        let mut distinct: Vec<usize> = with.iter().map(|st| st.addr()).collect();
        distinct.sort_unstable();
        distinct.dedup();
        // equal stacks are one allocation: far fewer stacks than entries
        assert!(
            distinct.len() * 4 <= with.len().max(4),
            "{}: {} distinct stacks for {} entries",
            f.display(),
            distinct.len(),
            with.len()
        );
        assert!(refs > 0);
    }
}

#[test]
fn fixtures_round_trip_and_stay_small() {
    for f in fixtures() {
        let bytes = std::fs::read(&f).unwrap();
        let s = read_snapshot(&bytes).unwrap();
        assert_eq!(
            read_snapshot_file(&f).unwrap(),
            s,
            "{}: file vs bytes",
            f.display()
        );
        let written = write_snapshot(&s);
        let again = read_snapshot(&written).unwrap();
        assert_eq!(s, again, "{}", f.display());
        // shared stacks are written once, so a snapshot with stacks does not grow
        assert!(
            written.len() <= 2 * bytes.len(),
            "{}: {} bytes written for {} read",
            f.display(),
            written.len(),
            bytes.len()
        );
        // and what we wrote, we write again byte for byte
        assert_eq!(write_snapshot(&again), written, "{}", f.display());
    }
}

/// Our output, read by Python, is the same objects as PyTorch's file read by Python, and
/// uses only what MemoryViz.js's unpickler implements.
const PY_SAME: &str = r#"
import pickle, pickletools, sys
def same(a, b, path, seen):
    if type(a) is not type(b):
        sys.exit(f'{path}: {type(a).__name__} vs {type(b).__name__}')
    if isinstance(a, (dict, list, tuple)):
        key = (id(a), id(b))
        if key in seen:
            return
        seen.add(key)
    if isinstance(a, dict):
        if list(a) != list(b):
            sys.exit(f'{path}: key order {list(a)} vs {list(b)}')
        for k in a:
            same(a[k], b[k], f'{path}.{k}', seen)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            sys.exit(f'{path}: length {len(a)} vs {len(b)}')
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f'{path}[{i}]', seen)
    elif a != b:
        sys.exit(f'{path}: {a!r} vs {b!r}')
viz = {'PROTO', 'FRAME', 'STOP', 'MARK', 'APPEND', 'APPENDS', 'LIST', 'TUPLE', 'DICT',
       'SETITEM', 'SETITEMS', 'EMPTY_DICT', 'EMPTY_LIST', 'EMPTY_TUPLE', 'TUPLE1', 'TUPLE2',
       'TUPLE3', 'NEWTRUE', 'NEWFALSE', 'NONE', 'BININT', 'BININT1', 'BININT2', 'LONG1',
       'BINFLOAT', 'SHORT_BINUNICODE', 'BINUNICODE', 'MEMOIZE', 'BINPUT', 'LONG_BINPUT',
       'BINGET', 'LONG_BINGET'}
for theirs, ours in zip(sys.argv[1::2], sys.argv[2::2]):
    a = pickle.load(open(theirs, 'rb'))
    data = open(ours, 'rb').read()
    b = pickle.loads(data)
    same(a, b, theirs, set())
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert ops <= viz, ops - viz
print('ok')
"#;

#[test]
fn python_reads_our_copies_as_the_originals() {
    let dir = common::scratch("fixtures-python");
    let files = fixtures();
    let mut args = Vec::new();
    for f in &files {
        let s = read_snapshot_file(f).unwrap();
        let ours = dir.join(f.file_name().unwrap());
        vramroom_trace::write_snapshot_file(&s, &ours).unwrap();
        args.push(f.clone());
        args.push(ours);
    }
    let paths: Vec<&Path> = args.iter().map(PathBuf::as_path).collect();
    if let Some(out) = common::python(PY_SAME, &paths) {
        assert_eq!(out.trim(), "ok");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn truncated_recordings_fail_cleanly() {
    for f in fixtures().iter().take(8) {
        let bytes = std::fs::read(f).unwrap();
        for cut in (0..bytes.len()).step_by(bytes.len() / 97 + 1) {
            match read_snapshot(&bytes[..cut]) {
                Err(vramroom_trace::TraceError::Pickle(m)) => {
                    assert!(m.contains("truncated"), "{}: cut {cut}: {m}", f.display())
                }
                other => panic!("{}: cut {cut}: {other:?}", f.display()),
            }
        }
    }
}
