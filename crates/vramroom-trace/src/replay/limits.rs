//! What a replay refuses before it starts: ids in a trace that would cost memory per id
//! rather than per event.
//!
//! Design note: the allocator keeps, per stream, its free-block index (size bins for
//! every size class: about 33 KiB), and a replay keeps per device a plan, an allocator and
//! a simulated GPU. Both are right for real programs (a few streams, a few devices), but a
//! trace can name an id per event: 100k distinct streams in a 3.7 MB pickle took 2.4 GB,
//! 300k one-event devices took 3.5 GB. Real PyTorch programs use a handful of streams (a
//! few dozen with NCCL and side streams) and one trace per visible GPU, so a trace past
//! these limits is refused with a message naming the limit, in time linear in its events.

use std::collections::HashSet;

use vramroom_alloc::{Snapshot, TraceEntry};

use super::ReplayError;

/// The most distinct stream ids one device's trace may use.
pub const MAX_STREAMS: usize = 1024;
/// The most device traces a snapshot may hold.
pub const MAX_DEVICES: usize = 1024;

/// Refuses a snapshot with more device traces than [`MAX_DEVICES`].
pub fn check_devices(snapshot: &Snapshot) -> Result<(), ReplayError> {
    let n = snapshot.device_traces.len();
    if n > MAX_DEVICES {
        return Err(ReplayError::Invalid(format!(
            "the snapshot has {n} device traces, more than the {MAX_DEVICES} a replay \
             accepts (one per GPU of the recording process)"
        )));
    }
    Ok(())
}

/// Refuses a trace that uses more than [`MAX_STREAMS`] distinct stream ids.
pub fn check_streams(device: usize, trace: &[TraceEntry]) -> Result<(), ReplayError> {
    let mut seen: HashSet<u64> = HashSet::new();
    for e in trace {
        if seen.insert(e.stream) && seen.len() > MAX_STREAMS {
            return Err(ReplayError::Invalid(format!(
                "device {device}'s trace uses more than {MAX_STREAMS} distinct stream ids \
                 (the limit of a replay; each stream costs the allocator its own free-block \
                 index)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramroom_alloc::TraceAction;

    fn alloc(stream: u64) -> TraceEntry {
        TraceEntry {
            action: TraceAction::Alloc,
            addr: 0x1000 + stream * 512,
            size: 512,
            stream,
            time_us: 0,
            compile_context: "".into(),
            user_metadata: "".into(),
            frames: None,
        }
    }

    #[test]
    fn many_streams_are_refused_naming_the_limit() {
        let few: Vec<TraceEntry> = (0..MAX_STREAMS as u64).map(alloc).collect();
        check_streams(0, &few).unwrap();
        let many: Vec<TraceEntry> = (0..MAX_STREAMS as u64 + 1).map(alloc).collect();
        let e = check_streams(0, &many).unwrap_err().to_string();
        assert!(e.contains("stream ids") && e.contains("1024"), "{e}");
    }

    #[test]
    fn many_devices_are_refused_naming_the_limit() {
        let s = Snapshot {
            device_traces: vec![vec![alloc(0)]; MAX_DEVICES + 1],
            ..Snapshot::default()
        };
        let e = check_devices(&s).unwrap_err().to_string();
        assert!(e.contains("device traces"), "{e}");
    }
}
