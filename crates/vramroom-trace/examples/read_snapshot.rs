//! Reads snapshot pickles and prints what they hold: the reader alone, for measuring its
//! time and peak memory beside Python's `pickle.load` (`scripts/reader_bench.py`).
//!
//! ```sh
//! cargo run --release -p vramroom-trace --example read_snapshot -- FILE...
//! ```
//!
//! Exit status 2 when a file cannot be read, with the reader's message.

use std::collections::HashSet;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    for path in std::env::args_os().skip(1) {
        let path = std::path::PathBuf::from(path);
        let start = std::time::Instant::now();
        match vramroom_trace::read_snapshot_file(&path) {
            Ok(s) => {
                let secs = start.elapsed().as_secs_f64();
                let entries: Vec<_> = s.device_traces.iter().flatten().collect();
                let stacks = entries
                    .iter()
                    .filter_map(|e| e.frames.as_ref())
                    .chain(s.segments.iter().map(|g| &g.frames))
                    .chain(s.segments.iter().flat_map(|g| &g.blocks).map(|b| &b.frames));
                let mut distinct = HashSet::new();
                let mut frame_refs = 0usize;
                for st in stacks {
                    frame_refs += st.len();
                    distinct.insert(st.addr());
                }
                println!(
                    "{}: {} segments, {} blocks, {} entries ({} with frames), {} frame \
                     references in {} distinct stacks, {} annotations; {:.3} s",
                    path.display(),
                    s.segments.len(),
                    s.segments.iter().map(|g| g.blocks.len()).sum::<usize>(),
                    entries.len(),
                    entries.iter().filter(|e| e.frames.is_some()).count(),
                    frame_refs,
                    distinct.len(),
                    s.external_annotations.len(),
                    secs,
                );
            }
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                status = ExitCode::from(2);
            }
        }
    }
    status
}
