//! RAPIDS RMM memory-event logs (`logging_resource_adaptor` CSV files).
//!
//! The format, as RMM writes it:
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 140573312345856,14:03:22.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020
//! 140573312345856,14:03:22.234567,free,0x7f8a40000000,1024,0x7f8a38001020
//! 140573312345856,14:03:22.345678,allocate failure,0x0,1099511627776,0x0
//! ```
//!
//! `Thread` is the OS thread id, `Time` spdlog's `%H:%M:%S.%f` (local time of day, in
//! microseconds: the date is not stored), `Action` one of `allocate`, `free`,
//! `allocate failure`. Pointers and streams are hex: with a `0x` prefix from the fmt-based
//! logger (RMM ≤ 24.x), without one from the printf-based one (`%llx`), `(nil)` from
//! glibc's `%p`; all three are read, `0x…` is written. A `Time` written as seconds since
//! the epoch (`1634567890.123456`, as in RMM's documentation example) is read too.

use vramroom_alloc::snapshot::{Snapshot, TraceAction, TraceEntry};

use crate::error::TraceError;

/// The header line RMM writes first.
pub const RMM_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

const DAY_US: i64 = 86_400_000_000;

/// An RMM log's `Action` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RmmAction {
    Allocate,
    Free,
    AllocateFailure,
}

impl RmmAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RmmAction::Allocate => "allocate",
            RmmAction::Free => "free",
            RmmAction::AllocateFailure => "allocate failure",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "allocate" => RmmAction::Allocate,
            "free" => RmmAction::Free,
            "allocate failure" => RmmAction::AllocateFailure,
            _ => return None,
        })
    }
}

/// One row of an RMM log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RmmEvent {
    pub thread: u64,
    /// Microseconds: since midnight when read from RMM's `HH:MM:SS.ffffff`, since the epoch
    /// when read from a seconds-since-epoch stamp or taken from a PyTorch trace. Written
    /// as the time of day (UTC) either way.
    pub time_us: i64,
    pub action: RmmAction,
    /// 0 for `allocate failure`.
    pub pointer: u64,
    pub size: u64,
    pub stream: u64,
}

/// Parses an RMM CSV log. The header line is optional (and skipped wherever it appears,
/// so concatenated logs read), blank lines are skipped, `\r\n` endings are fine. Errors
/// name the 1-based line.
pub fn read_rmm_csv(text: &str) -> Result<Vec<RmmEvent>, TraceError> {
    let mut events = Vec::new();
    for (idx, raw) in text.split('\n').enumerate() {
        let line_no = idx + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.trim().is_empty() || is_header(line) {
            continue;
        }
        events.push(parse_line(line).map_err(|message| TraceError::Rmm {
            line: line_no,
            message,
        })?);
    }
    Ok(events)
}

/// Writes events in RMM's format, header first.
pub fn write_rmm_csv(events: &[RmmEvent]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(40 + events.len() * 64);
    out.push_str(RMM_HEADER);
    out.push('\n');
    for e in events {
        // writing to a String cannot fail
        let _ = writeln!(
            out,
            "{},{},{},0x{:x},{},0x{:x}",
            e.thread,
            format_time(e.time_us),
            e.action.as_str(),
            e.pointer,
            e.size,
            e.stream
        );
    }
    out
}

/// The client-level events of a PyTorch trace as an RMM log: `alloc` → `allocate`,
/// `free_requested` → `free`, `oom` → `allocate failure`. Segment and `free_completed`
/// entries have no RMM counterpart and are dropped. All devices are merged by time (RMM
/// logs carry no device; CUDA's unified addressing keeps pointers distinct); the thread is
/// unknown and written as 0.
pub fn rmm_from_snapshot(s: &Snapshot) -> Vec<RmmEvent> {
    let mut events: Vec<RmmEvent> = s
        .device_traces
        .iter()
        .flatten()
        .filter_map(|t| {
            let (action, pointer) = match t.action {
                TraceAction::Alloc => (RmmAction::Allocate, t.addr),
                TraceAction::FreeRequested => (RmmAction::Free, t.addr),
                // an oom entry's addr holds device_free, not a pointer
                TraceAction::Oom => (RmmAction::AllocateFailure, 0),
                _ => return None,
            };
            Some(RmmEvent {
                thread: 0,
                time_us: t.time_us,
                action,
                pointer,
                size: t.size,
                stream: t.stream,
            })
        })
        .collect();
    // stable: entries of one device keep their order when time stamps tie
    events.sort_by_key(|e| e.time_us);
    events
}

/// A snapshot holding the log as device 0's trace, ready for replay: `allocate` →
/// `alloc`, `free` → `free_requested` followed by `free_completed` (RMM frees at once),
/// `allocate failure` → `oom` with `device_free` 0 (unknown). No segments: the log says
/// nothing about the allocator underneath. Times of day that go backwards by more than
/// twelve hours are taken to have passed midnight.
pub fn snapshot_from_rmm(events: &[RmmEvent]) -> Snapshot {
    let mut trace = Vec::with_capacity(events.len() * 2);
    let mut day_offset = 0i64;
    let mut prev: Option<i64> = None;
    for e in events {
        let mut t = e.time_us.saturating_add(day_offset);
        if let Some(p) = prev {
            if (0..DAY_US).contains(&e.time_us) && t.saturating_add(DAY_US / 2) < p {
                day_offset = day_offset.saturating_add(DAY_US);
                t = t.saturating_add(DAY_US);
            }
        }
        prev = Some(t);
        let entry = |action, addr| TraceEntry {
            action,
            addr,
            size: e.size,
            stream: e.stream,
            time_us: t,
            compile_context: "N/A".into(),
            user_metadata: "".into(),
            frames: None,
        };
        match e.action {
            RmmAction::Allocate => trace.push(entry(TraceAction::Alloc, e.pointer)),
            RmmAction::Free => {
                trace.push(entry(TraceAction::FreeRequested, e.pointer));
                trace.push(entry(TraceAction::FreeCompleted, e.pointer));
            }
            RmmAction::AllocateFailure => trace.push(entry(TraceAction::Oom, 0)),
        }
    }
    Snapshot {
        device_traces: vec![trace],
        ..Snapshot::default()
    }
}

fn is_header(line: &str) -> bool {
    let mut fields = line.split(',').map(str::trim);
    RMM_HEADER
        .split(',')
        .all(|h| fields.next().is_some_and(|f| f.eq_ignore_ascii_case(h)))
        && fields.next().is_none()
}

fn parse_line(line: &str) -> Result<RmmEvent, String> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    let [thread, time, action, pointer, size, stream] = fields.as_slice() else {
        return Err(format!(
            "expected 6 comma-separated fields ({RMM_HEADER}), found {}",
            fields.len()
        ));
    };
    Ok(RmmEvent {
        thread: thread
            .parse()
            .map_err(|_| format!("Thread {thread:?} is not a decimal thread id"))?,
        time_us: parse_time(time)?,
        action: RmmAction::parse(action).ok_or_else(|| {
            format!("Action {action:?} is not `allocate`, `free` or `allocate failure`")
        })?,
        pointer: parse_hex(pointer).map_err(|m| format!("Pointer {m}"))?,
        size: size
            .parse()
            .map_err(|_| format!("Size {size:?} is not a decimal byte count"))?,
        stream: parse_hex(stream).map_err(|m| format!("Stream {m}"))?,
    })
}

fn parse_hex(s: &str) -> Result<u64, String> {
    if s == "(nil)" {
        return Ok(0);
    }
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    // from_str_radix would also take a leading '+'
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{s:?} is not a hex address"));
    }
    u64::from_str_radix(digits, 16).map_err(|_| format!("{s:?} does not fit in 64 bits"))
}

/// `HH:MM:SS.ffffff` → µs since midnight; `seconds.fraction` → µs since the epoch.
fn parse_time(s: &str) -> Result<i64, String> {
    let bad = || format!("Time {s:?} is neither HH:MM:SS.ffffff nor seconds since the epoch");
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // first six digits are microseconds; more digits (nanoseconds) are truncated
    let micros = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(6)
        .fold(0i64, |acc, b| acc * 10 + i64::from(b - b'0'));
    let num = |p: &str| -> Result<i64, String> {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        p.parse::<i64>().map_err(|_| bad())
    };
    let seconds = if whole.contains(':') {
        let parts: Vec<&str> = whole.split(':').collect();
        let [h, m, sec] = parts.as_slice() else {
            return Err(bad());
        };
        let (h, m, sec) = (num(h)?, num(m)?, num(sec)?);
        if h > 23 || m > 59 || sec > 60 {
            return Err(bad());
        }
        h * 3600 + m * 60 + sec
    } else {
        num(whole)?
    };
    seconds
        .checked_mul(1_000_000)
        .and_then(|us| us.checked_add(micros))
        .ok_or_else(bad)
}

fn format_time(time_us: i64) -> String {
    let t = time_us.rem_euclid(DAY_US);
    let (secs, us) = (t / 1_000_000, t % 1_000_000);
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        us
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Thread,Time,Action,Pointer,Size,Stream\n\
        140573312345856,14:03:22.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020\n\
        140573312345856,14:03:22.234567,allocate,7f8a40000400,2048,0\n\
        140573312345857,14:03:22.345678,free,0x7f8a40000000,1024,0x7f8a38001020\n\
        140573312345857,14:03:22.400000,allocate failure,(nil),1099511627776,0x0\n";

    fn ev(action: RmmAction, pointer: u64, size: u64, time_us: i64) -> RmmEvent {
        RmmEvent {
            thread: 0,
            time_us,
            action,
            pointer,
            size,
            stream: 0,
        }
    }

    #[test]
    fn reads_both_pointer_styles_and_failures() {
        let events = read_rmm_csv(SAMPLE).unwrap();
        assert_eq!(events.len(), 4);
        assert_eq!(
            events[0],
            RmmEvent {
                thread: 140573312345856,
                time_us: (14 * 3600 + 3 * 60 + 22) * 1_000_000 + 123456,
                action: RmmAction::Allocate,
                pointer: 0x7f8a40000000,
                size: 1024,
                stream: 0x7f8a38001020,
            }
        );
        assert_eq!(events[1].pointer, 0x7f8a40000400);
        assert_eq!(events[1].stream, 0);
        assert_eq!(events[2].action, RmmAction::Free);
        assert_eq!(events[3].action, RmmAction::AllocateFailure);
        assert_eq!(events[3].pointer, 0);
        assert_eq!(events[3].size, 1 << 40);
    }

    #[test]
    fn write_then_read_is_identity() {
        let events = read_rmm_csv(SAMPLE).unwrap();
        let text = write_rmm_csv(&events);
        assert!(text.starts_with("Thread,Time,Action,Pointer,Size,Stream\n"));
        assert!(text.contains(
            "\n140573312345856,14:03:22.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020\n"
        ));
        assert!(text.contains(",allocate failure,0x0,1099511627776,0x0\n"));
        assert_eq!(read_rmm_csv(&text).unwrap(), events);
    }

    #[test]
    fn header_optional_blank_lines_and_crlf() {
        let text =
            "\r\n1,00:00:01.5,allocate,0x10,16,0x0\r\n\r\n1,00:00:02.000001,free,0x10,16,0x0\r\n";
        let events = read_rmm_csv(text).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].time_us, 1_500_000);
        assert_eq!(events[1].time_us, 2_000_001);
        // epoch-seconds form from RMM's documentation
        let e = read_rmm_csv("1,1634567890.123456,allocate,0x10,16,0x0").unwrap();
        assert_eq!(e[0].time_us, 1_634_567_890_123_456);
    }

    #[test]
    fn bad_lines_are_reported_with_their_number() {
        let cases = [
            ("1,00:00:01.0,allocate,0x10,16", 2, "6 comma-separated"),
            ("1,00:00:01.0,alloc,0x10,16,0x0", 2, "Action"),
            ("1,00:00:01.0,allocate,0xzz,16,0x0", 2, "Pointer"),
            ("1,00:00:01.0,allocate,0x,16,0x0", 2, "Pointer"),
            (
                "1,00:00:01.0,allocate,0x10000000000000000,16,0x0",
                2,
                "64 bits",
            ),
            ("1,00:00:01.0,allocate,0x10,-16,0x0", 2, "Size"),
            ("1,00:00:01.0,allocate,0x10,16,stream", 2, "Stream"),
            ("x,00:00:01.0,allocate,0x10,16,0x0", 2, "Thread"),
            ("1,25:00:01.0,allocate,0x10,16,0x0", 2, "Time"),
            ("1,00:00,allocate,0x10,16,0x0", 2, "Time"),
            ("1,00:00:01.x,allocate,0x10,16,0x0", 2, "Time"),
            ("1,,allocate,0x10,16,0x0", 2, "Time"),
        ];
        for (line, want_line, want_msg) in cases {
            let text = format!("{RMM_HEADER}\n{line}\n");
            match read_rmm_csv(&text) {
                Err(TraceError::Rmm { line, message }) => {
                    assert_eq!(line, want_line, "{text}");
                    assert!(message.contains(want_msg), "{message:?} lacks {want_msg:?}");
                }
                other => panic!("{line:?}: expected an Rmm error, got {other:?}"),
            }
        }
        let err = read_rmm_csv("1,00:00:01.0,allocate,0x10,16,0x0\n\n\nnonsense").unwrap_err();
        assert_eq!(err.to_string().split(':').next(), Some("RMM log line 4"));
    }

    #[test]
    fn snapshot_to_rmm() {
        let t = |action, addr, size, time_us| TraceEntry {
            action,
            addr,
            size,
            stream: 7,
            time_us,
            compile_context: "N/A".into(),
            user_metadata: "".into(),
            frames: None,
        };
        let s = Snapshot {
            device_traces: vec![
                vec![
                    t(TraceAction::SegmentAlloc, 0x1000, 2 << 20, 1),
                    t(TraceAction::Alloc, 0x1000, 400, 2),
                    t(TraceAction::FreeRequested, 0x1000, 400, 5),
                    t(TraceAction::FreeCompleted, 0x1000, 400, 6),
                    t(TraceAction::Oom, 123456, 1 << 40, 7),
                ],
                vec![t(TraceAction::Alloc, 0x9000, 512, 3)],
            ],
            ..Snapshot::default()
        };
        let events = rmm_from_snapshot(&s);
        let kinds: Vec<_> = events
            .iter()
            .map(|e| (e.action, e.pointer, e.time_us))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (RmmAction::Allocate, 0x1000, 2),
                (RmmAction::Allocate, 0x9000, 3),
                (RmmAction::Free, 0x1000, 5),
                (RmmAction::AllocateFailure, 0, 7),
            ]
        );
        assert!(events.iter().all(|e| e.stream == 7));
    }

    #[test]
    fn rmm_to_snapshot_and_back() {
        let events = vec![
            ev(RmmAction::Allocate, 0x10, 100, 1),
            ev(RmmAction::Allocate, 0x20, 200, 2),
            ev(RmmAction::Free, 0x10, 100, 3),
            ev(RmmAction::AllocateFailure, 0, 1 << 40, 4),
        ];
        let s = snapshot_from_rmm(&events);
        assert!(s.segments.is_empty());
        assert_eq!(s.device_traces.len(), 1);
        let actions: Vec<_> = s.device_traces[0].iter().map(|t| t.action).collect();
        assert_eq!(
            actions,
            vec![
                TraceAction::Alloc,
                TraceAction::Alloc,
                TraceAction::FreeRequested,
                TraceAction::FreeCompleted,
                TraceAction::Oom,
            ]
        );
        assert_eq!(s.device_traces[0][3].addr, 0x10);
        assert_eq!(s.device_traces[0][3].size, 100);
        assert_eq!(rmm_from_snapshot(&s), events);
    }

    #[test]
    fn midnight_wraps_forward() {
        let late = (23 * 3600 + 59 * 60 + 59) * 1_000_000;
        let events = vec![
            ev(RmmAction::Allocate, 0x10, 1, late),
            ev(RmmAction::Free, 0x10, 1, 500_000),
        ];
        let s = snapshot_from_rmm(&events);
        let times: Vec<_> = s.device_traces[0].iter().map(|t| t.time_us).collect();
        assert_eq!(times, vec![late, DAY_US + 500_000, DAY_US + 500_000]);
        // and the CSV still shows the time of day
        let text = write_rmm_csv(&rmm_from_snapshot(&s));
        assert!(text.contains(",00:00:00.500000,free,"));
    }
}
