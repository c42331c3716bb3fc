//! Hostile input that is well-formed as a pickle: sharing bombs, huge length fields,
//! endless files. Each must be refused with a message that names the problem, quickly
//! and without a large allocation; or, where nothing is expanded, read as the small
//! snapshot it is.

use std::time::{Duration, Instant};

use vramroom_trace::pickle::{read_snapshot, read_snapshot_file, BUDGET_PER_INPUT_BYTE};
use vramroom_trace::{Snapshot, TraceError};

const PROTO4: [u8; 2] = [0x80, 4];
const MARK: u8 = b'(';
const DUP: u8 = b'2';
const LIST: u8 = b'l';
const TUPLE2: u8 = 0x86;
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const SETITEMS: u8 = b'u';
const STOP: u8 = b'.';

/// Generous: each case takes milliseconds; this only catches a runaway.
const QUICK: Duration = Duration::from_secs(5);

fn s(out: &mut Vec<u8>, text: &str) {
    out.extend([0x8c, text.len() as u8]);
    out.extend(text.as_bytes());
}

/// `{"action": "alloc", "addr": 1, "size": 512}`: a valid trace entry.
fn entry(out: &mut Vec<u8>) {
    out.extend([EMPTY_DICT, MARK]);
    s(out, "action");
    s(out, "alloc");
    s(out, "addr");
    out.extend([b'K', 1]);
    s(out, "size");
    out.extend([b'M', 0, 2]);
    out.push(SETITEMS);
}

/// `{"segments": [], key: <value>}` where `value` is pickle code that leaves one object.
fn snapshot_with(key: &str, value: &[u8]) -> Vec<u8> {
    let mut b = PROTO4.to_vec();
    b.extend([EMPTY_DICT, MARK]);
    s(&mut b, "segments");
    b.push(EMPTY_LIST);
    s(&mut b, key);
    b.extend(value);
    b.extend([SETITEMS, STOP]);
    b
}

/// A list of `n` references to the object that `item` makes (DUP: one byte each).
fn repeated(item: &[u8], n: usize) -> Vec<u8> {
    let mut b = vec![MARK];
    b.extend(item);
    b.extend(std::iter::repeat_n(DUP, n - 1));
    b.push(LIST);
    b
}

/// Pickle code for one dict referenced 2^levels times through tuples of two.
fn doubling(levels: usize) -> Vec<u8> {
    let mut b = vec![EMPTY_DICT];
    for _ in 0..levels {
        b.extend([DUP, TUPLE2]);
    }
    b
}

fn timed(bytes: &[u8]) -> Result<Snapshot, TraceError> {
    let start = Instant::now();
    let r = read_snapshot(bytes);
    assert!(start.elapsed() < QUICK, "took {:?}", start.elapsed());
    r
}

fn message(r: Result<Snapshot, TraceError>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn a_200_byte_pickle_referencing_one_dict_2_pow_30_times_is_refused() {
    let bomb = snapshot_with("device_traces", &doubling(30));
    assert!(bomb.len() <= 200, "{} bytes", bomb.len());
    // the schema wants entry dicts two levels down; it finds the bomb's tuples and stops
    let m = message(timed(&bomb));
    assert!(
        m.contains("`device_traces[0][0]`: expected a dict, found tuple of 2"),
        "{m}"
    );
    // where the schema wants nothing, nothing is expanded: a small, empty snapshot
    let ignored = snapshot_with("future_key", &doubling(60));
    let s = timed(&ignored).unwrap();
    assert!(s.device_traces.is_empty() && s.segments.is_empty());
}

#[test]
fn one_entry_referenced_2_pow_30_times_through_the_schema_is_refused() {
    // device_traces: 2^15 references to a trace of 2^15 references to one entry dict:
    // 2^30 trace entries (about 100 GB) from 64 KiB
    let mut e = Vec::new();
    entry(&mut e);
    let value = repeated(&repeated(&e, 1 << 15), 1 << 15);
    let bomb = snapshot_with("device_traces", &value);
    assert!(bomb.len() < 70_000);
    let m = message(timed(&bomb));
    eprintln!("{m}");
    assert!(m.contains("out of proportion to the"), "{m}");
    assert!(m.contains("per input byte"), "{m}");
}

#[test]
fn a_trace_of_ten_million_references_to_one_entry_is_refused() {
    let mut e = Vec::new();
    entry(&mut e);
    let value = repeated(&repeated(&e, 10_000_000), 1);
    let bomb = snapshot_with("device_traces", &value);
    let m = message(timed(&bomb));
    assert!(m.contains("expands to over"), "{m}");
    // the same shape, smaller, is within the base budget that any input has
    let value = repeated(&repeated(&e, 100_000), 1);
    let ok = snapshot_with("device_traces", &value);
    assert_eq!(timed(&ok).unwrap().device_traces[0].len(), 100_000);
    // real recordings charge at most 3.1 bytes per input byte: keep a margin over that
    const { assert!(BUDGET_PER_INPUT_BYTE >= 8) };
}

#[test]
fn huge_length_fields_fail_at_end_of_input() {
    let huge = 1u64 << 62;
    for (op, len) in [
        (0x8du8, huge.to_le_bytes().to_vec()),   // BINUNICODE8
        (0x8e, huge.to_le_bytes().to_vec()),     // BINBYTES8
        (0x96, u64::MAX.to_le_bytes().to_vec()), // BYTEARRAY8
        (b'X', u32::MAX.to_le_bytes().to_vec()), // BINUNICODE
        (0x8b, i32::MAX.to_le_bytes().to_vec()), // LONG4
    ] {
        let mut b = PROTO4.to_vec();
        b.push(op);
        b.extend(len);
        b.extend(b"abc");
        let m = message(timed(&b));
        assert!(
            m.contains("truncated") || m.contains("too large"),
            "{op:#x}: {m}"
        );
    }
    // from a file, streamed: the same
    let dir = std::env::temp_dir().join(format!("vramroom-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("huge-string.pickle");
    let mut b = PROTO4.to_vec();
    b.push(0x8d);
    b.extend(huge.to_le_bytes());
    b.extend(vec![b'a'; 200_000]);
    std::fs::write(&path, &b).unwrap();
    let m = message(read_snapshot_file(&path));
    assert!(
        m.contains("needs 4611686018427387904 bytes, 200000 left"),
        "{m}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn endless_and_odd_files_are_refused_at_once() {
    let zero = std::path::Path::new("/dev/zero");
    if zero.exists() {
        let start = Instant::now();
        let m = message(read_snapshot_file(zero));
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        assert!(m.contains("opcode 0x00 is not plain data"), "{m}");
    }
    // a directory is an I/O error naming it
    let dir = std::env::temp_dir();
    match read_snapshot_file(&dir) {
        Err(TraceError::Io { path, .. }) => assert_eq!(path, dir),
        other => panic!("{other:?}"),
    }
    // an empty file
    let empty = dir.join(format!("vramroom-empty-{}.pickle", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    assert!(message(read_snapshot_file(&empty)).contains("no STOP opcode in 0 bytes"));
    std::fs::remove_file(&empty).ok();
}

#[test]
fn far_memo_ids_cost_one_entry() {
    // LONG_BINPUT 0xffffffff then LONG_BINGET of it: legal, and no 16 GiB memo
    let mut value = vec![EMPTY_LIST, b'r'];
    value.extend(u32::MAX.to_le_bytes());
    value.extend([b'0', b'j']);
    value.extend(u32::MAX.to_le_bytes());
    value.extend([EMPTY_LIST, b'a']);
    let s = timed(&snapshot_with("device_traces", &value)).unwrap();
    assert_eq!(s.device_traces.len(), 1);
    assert!(s.device_traces[0].is_empty());
}
