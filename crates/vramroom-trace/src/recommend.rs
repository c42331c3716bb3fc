//! Which allocator config to recommend for a trace: the candidates tried and the pick.
//!
//! Design note: shared by `vramroom replay --recommend` and the Python API's
//! `vramroom.recommend`, so both try the same configs and pick by the same rule.

use crate::replay::ReplayResult;

/// Configs a recommendation tries besides the snapshot's own: the knobs of
/// pytorch-allocator.md that change how much a workload reserves.
pub const CANDIDATE_CONFS: &[&str] = &[
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "expandable_segments:True,roundup_power2_divisions:4",
];

/// The row to recommend: no OOM, then the lowest peak reserved, then the earliest
/// (simplest) config. `None` when every config OOMs.
///
/// "No OOM" means no allocation failed at all (`oom_event` unset), not only `num_ooms == 0`:
/// a request of 1 EB or more fails, as in PyTorch, without touching any stat, so a replay
/// that stopped there has `num_ooms == 0` and a peak of whatever came before it (0 B when it
/// was the first event). Such a config does not fit.
pub fn recommended(results: &[(String, ReplayResult)]) -> Option<usize> {
    results
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| r.num_ooms == 0 && r.oom_event.is_none() && r.oom.is_none())
        .min_by_key(|(i, (_, r))| (r.peak_reserved_bytes, *i))
        .map(|(i, _)| i)
}
