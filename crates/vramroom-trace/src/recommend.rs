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

/// The row to recommend: no OOM, then the fewest conv workspaces given up, then the lowest
/// peak reserved, then the earliest (simplest) config. `None` when every config OOMs.
///
/// "No OOM" means the program's own allocations all succeeded (`oom_event` unset), not only
/// `num_ooms == 0`: a request of 1 EB or more fails, as in PyTorch, without touching any
/// stat, so a replay that stopped there has `num_ooms == 0` and a peak of whatever came
/// before it (0 B when it was the first event). Such a config does not fit. The OOMs PyTorch
/// catches itself (a traced cuDNN conv workspace that does not fit: `workspace_fallbacks`,
/// each counted in `num_ooms` as the real run counts it) do not stop the program, so a
/// config that has only those fits; it ranks after one that keeps every plan, since the
/// plan without a workspace is the slower one.
pub fn recommended(results: &[(String, ReplayResult)]) -> Option<usize> {
    results
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| {
            r.oom_event.is_none() && r.oom.is_none() && r.num_ooms <= r.workspace_fallbacks as i64
        })
        .min_by_key(|(i, (_, r))| (r.workspace_fallbacks, r.peak_reserved_bytes, *i))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::recommended;
    use crate::replay::ReplayResult;

    fn row(reserved: u64, num_ooms: i64, fallbacks: usize, oom: bool) -> (String, ReplayResult) {
        let mut r = ReplayResult {
            peak_reserved_bytes: reserved,
            num_ooms,
            workspace_fallbacks: fallbacks,
            ..ReplayResult::default()
        };
        if oom {
            r.oom_event = Some(7);
        }
        (String::new(), r)
    }

    #[test]
    fn a_config_whose_only_ooms_were_caught_conv_workspaces_fits() {
        // the lowest reserved, but the program ran out: never
        // a caught workspace OOM: fits, after every config that keeps its plans
        let rows = [
            row(10, 1, 0, true),
            row(30, 1, 1, false),
            row(40, 0, 0, false),
        ];
        assert_eq!(recommended(&rows), Some(2));
        assert_eq!(recommended(&rows[..2]), Some(1));
        // an OOM counted beyond the caught ones is not a fit
        assert_eq!(recommended(&[row(30, 2, 1, false)]), None);
    }
}
