//! The memory of several ranks (or devices) side by side: one row per traced device of each
//! snapshot, and how unevenly the job loads them.
//!
//! Design note: in a multi-GPU job an OOM on one rank stops all of them, so the number that
//! matters is the worst rank, and how far it is from the others (its *imbalance*). Each rank
//! is replayed on its own simulated device, exactly as a single snapshot is, under either its
//! own recorded config or one config given for all (the what-if per rank). A snapshot with
//! several `device_traces` (one process driving several GPUs) contributes a row per device,
//! so `torchrun`'s one-snapshot-per-rank folders and single multi-device processes read alike.

use serde::Serialize;
use vramroom_alloc::AllocatorConfig;

use crate::replay::{
    min_capacity_plan, own_config, replay_plan, traced_devices, ReplayError, ReplayOptions,
    ReplayPlan,
};
use crate::Snapshot;

/// One rank's (or device's) replay.
#[derive(Clone, Debug, Serialize)]
pub struct RankRow {
    /// The snapshot's name (its file name, or what the caller gave).
    pub rank: String,
    /// The device index within that snapshot (`device_traces[device]`).
    pub device: usize,
    pub alloc_conf: String,
    pub events: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub num_ooms: i64,
    /// Whether an allocation failed in the replay (on the capacity it ran under).
    pub oom: bool,
    pub capacity_bytes: u64,
    /// The smallest capacity on which this rank's trace replays without an OOM.
    pub min_capacity_bytes: Option<u64>,
}

/// The rows of every rank, and how uneven they are.
#[derive(Clone, Debug, Serialize)]
pub struct RankTable {
    pub rows: Vec<RankRow>,
    /// Highest peak reserved over the mean of all rows (1.0 = perfectly even).
    pub imbalance: f64,
    /// Index into `rows` of the rank with the highest peak reserved.
    pub worst: usize,
    /// The capacity every rank needs: the largest of the ranks' minimum capacities.
    pub min_capacity_bytes: Option<u64>,
}

impl RankTable {
    /// The mean of the rows' peak reserved, which `imbalance` and each row's share are over.
    pub fn mean_peak_reserved(&self) -> f64 {
        mean_peak_reserved(&self.rows)
    }
}

fn mean_peak_reserved(rows: &[RankRow]) -> f64 {
    rows.iter()
        .map(|r| r.peak_reserved_bytes as f64)
        .sum::<f64>()
        / rows.len().max(1) as f64
}

/// Options for [`rank_table`].
#[derive(Clone, Debug, Default)]
pub struct RankOptions {
    /// One config for every rank; `None`: each snapshot's own recorded config.
    pub config: Option<AllocatorConfig>,
    pub capacity: Option<u64>,
    /// Also bisect each rank's minimum capacity.
    pub min_capacity: bool,
}

/// Replays every traced device of every snapshot. Errors name the rank that failed.
pub fn rank_table(
    snapshots: &[(String, &Snapshot)],
    opts: &RankOptions,
) -> Result<RankTable, ReplayError> {
    let mut rows = Vec::new();
    for (name, snap) in snapshots {
        let devices = traced_devices(snap);
        if devices.is_empty() {
            return Err(ReplayError::NoTrace(format!(
                "{name}: no device has a trace to replay (record it with torch.cuda.memory._record_memory_history() enabled)"
            )));
        }
        let own = own_config(snap);
        for device in devices {
            let named =
                |e: ReplayError| ReplayError::Invalid(format!("{name} device {device}: {e}"));
            let plan = ReplayPlan::new(snap, device, &own).map_err(named)?;
            let ro = ReplayOptions {
                config: opts.config.clone().unwrap_or_else(|| own.clone()),
                capacity: opts.capacity,
                device,
                stop_at_oom: true,
                record_history: false,
                ..ReplayOptions::default()
            };
            let r = replay_plan(snap, &plan, &ro).map_err(named)?;
            let min_capacity_bytes = if opts.min_capacity {
                Some(min_capacity_plan(snap, &plan, &ro).map_err(named)?)
            } else {
                None
            };
            rows.push(RankRow {
                rank: name.clone(),
                device,
                alloc_conf: r.alloc_conf.clone(),
                events: r.events,
                peak_allocated_bytes: r.peak_allocated_bytes,
                peak_reserved_bytes: r.peak_reserved_bytes,
                num_ooms: r.num_ooms,
                oom: r.oom_event.is_some(),
                capacity_bytes: r.capacity_bytes,
                min_capacity_bytes,
            });
        }
    }
    let worst = (0..rows.len())
        .max_by_key(|&i| (rows[i].peak_reserved_bytes, std::cmp::Reverse(i)))
        .unwrap_or(0);
    let mean = mean_peak_reserved(&rows);
    let imbalance = if mean > 0.0 {
        rows[worst].peak_reserved_bytes as f64 / mean
    } else {
        1.0
    };
    let min_capacity_bytes = if opts.min_capacity {
        rows.iter().filter_map(|r| r.min_capacity_bytes).max()
    } else {
        None
    };
    Ok(RankTable {
        rows,
        imbalance,
        worst,
        min_capacity_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::replay;

    fn fixture(name: &str) -> Snapshot {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/snapshots")
            .join(name);
        crate::read_snapshot_file(&p).expect("fixture reads")
    }

    #[test]
    fn two_ranks_of_a_real_ddp_job_each_replay_as_alone() {
        let r0 = fixture("ddp_gloo_2rank__default.rank0.pickle");
        let r1 = fixture("ddp_gloo_2rank__default.rank1.pickle");
        let t = rank_table(
            &[("rank0".into(), &r0), ("rank1".into(), &r1)],
            &RankOptions {
                min_capacity: true,
                ..RankOptions::default()
            },
        )
        .unwrap();
        assert_eq!(t.rows.len(), 2);
        for (row, snap) in t.rows.iter().zip([&r0, &r1]) {
            let alone = replay(snap, &ReplayOptions::default()).unwrap();
            assert_eq!(row.peak_reserved_bytes, alone.peak_reserved_bytes);
            assert_eq!(row.peak_allocated_bytes, alone.peak_allocated_bytes);
            assert!(row.min_capacity_bytes.unwrap() <= row.peak_reserved_bytes);
        }
        let worst = &t.rows[t.worst];
        assert!(t
            .rows
            .iter()
            .all(|r| r.peak_reserved_bytes <= worst.peak_reserved_bytes));
        assert!(t.imbalance >= 1.0);
        assert_eq!(
            t.min_capacity_bytes,
            t.rows.iter().filter_map(|r| r.min_capacity_bytes).max()
        );
    }

    #[test]
    fn a_rank_without_a_trace_is_named() {
        let empty = Snapshot::default();
        let e = rank_table(&[("r7.pickle".into(), &empty)], &RankOptions::default()).unwrap_err();
        assert!(e.to_string().contains("r7.pickle"), "{e}");
    }
}
