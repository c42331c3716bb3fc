//! Private pools inferred from a trace: which pool each recorded allocation used, and when
//! each pool became freeable.
//!
//! Design note: `model.rs` turns the recorded addresses into constraints between segment
//! instances. Here they become labels, greedily in creation order: an instance the final
//! snapshot names keeps its pool; any other takes the first label that breaks no constraint
//! among, in order, the pool of the allocation just before its first one on the same stream,
//! the pool of the next one the snapshot names, the default pool, the private pools already
//! seen on its stream, and a new pool. Under the recording's own config any label that breaks
//! no constraint replays the same (every decision that showed is a constraint); under another
//! config the label matters more, and a capture allocates on its stream in one stretch, so
//! the neighbours on the stream are the best guess. A pool becomes freeable (its graph
//! released) just before the first release that gave one of its segments back, the earliest
//! moment the trace shows it.

use std::collections::{BTreeMap, HashMap};

use vramroom_alloc::{MempoolId, DEFAULT_POOL};

use super::model::Facts;

/// The inferred pools.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    /// Pool of each instance.
    pub label: Vec<MempoolId>,
    /// For each private pool, the release run before which it became freeable.
    pub freeable_at: BTreeMap<usize, Vec<MempoolId>>,
}

impl Pools {
    /// Pool of the `alloc` entry at trace index `i`.
    pub fn of_alloc(&self, facts: &Facts, i: usize) -> MempoolId {
        facts
            .alloc_in
            .get(&i)
            .and_then(|&inst| self.label.get(inst as usize))
            .copied()
            .unwrap_or(DEFAULT_POOL)
    }
}

/// Per private label: the earliest run that released one of its instances, and the latest
/// run that kept one wholly free (a pool is freeable from its first release on, so the
/// latter must come before the former).
#[derive(Clone, Copy)]
struct Window {
    first_release: usize,
    last_kept: Option<usize>,
}

pub(crate) fn infer(facts: &Facts) -> Pools {
    let n = facts.instances.len();
    let mut adj: Vec<Vec<u32>> = vec![Vec::new(); n];
    for &(a, b) in &facts.differ {
        if a != b {
            adj[a as usize].push(b);
            adj[b as usize].push(a);
        }
    }
    let mut kept: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(x, run) in &facts.kept {
        kept[x as usize].push(run);
    }
    let mut label: Vec<Option<MempoolId>> = facts.instances.iter().map(|i| i.known).collect();
    let mut windows: HashMap<MempoolId, Window> = HashMap::new();
    let note = |windows: &mut HashMap<MempoolId, Window>, l: MempoolId, x: usize| {
        if l == DEFAULT_POOL {
            return;
        }
        let w = windows.entry(l).or_insert(Window {
            first_release: usize::MAX,
            last_kept: None,
        });
        if let Some(r) = facts.instances[x].released {
            w.first_release = w.first_release.min(r);
        }
        if let Some(&k) = kept[x].iter().max() {
            w.last_kept = Some(w.last_kept.map_or(k, |m| m.max(k)));
        }
    };
    for (x, l) in label.iter().enumerate() {
        if let Some(l) = *l {
            note(&mut windows, l, x);
        }
    }
    // Private labels seen on each stream, oldest first.
    let mut on_stream: HashMap<u64, Vec<MempoolId>> = HashMap::new();
    for (x, inst) in facts.instances.iter().enumerate() {
        if let Some(l) = label[x].filter(|&l| l != DEFAULT_POOL) {
            let v = on_stream.entry(inst.stream).or_default();
            if !v.contains(&l) {
                v.push(l);
            }
        }
    }
    let mut next_graph = facts
        .instances
        .iter()
        .filter_map(|i| i.known)
        .map(|l| l.0)
        .max()
        .unwrap_or(0)
        + 1;
    for x in 0..n {
        if label[x].is_some() {
            continue;
        }
        let inst = &facts.instances[x];
        let fits = |l: MempoolId, windows: &HashMap<MempoolId, Window>| -> bool {
            if adj[x].iter().any(|&y| label[y as usize] == Some(l)) {
                return false;
            }
            if l == DEFAULT_POOL {
                // The default pool always gives back a wholly free segment.
                return kept[x].is_empty();
            }
            let w = windows.get(&l).copied().unwrap_or(Window {
                first_release: usize::MAX,
                last_kept: None,
            });
            let first_release = inst
                .released
                .map_or(w.first_release, |r| r.min(w.first_release));
            let last_kept = kept[x].iter().copied().chain(w.last_kept).max();
            last_kept.is_none_or(|k| k < first_release)
        };
        let (before, after) = neighbours(facts, x, &label);
        let mut candidates: Vec<MempoolId> = before
            .into_iter()
            .chain(after)
            .chain(std::iter::once(DEFAULT_POOL))
            .chain(on_stream.get(&inst.stream).cloned().unwrap_or_default())
            .collect();
        dedup_in_order(&mut candidates);
        let l = match candidates.into_iter().find(|&l| fits(l, &windows)) {
            Some(l) => l,
            None => {
                let l = (next_graph, 0);
                next_graph += 1;
                on_stream.entry(inst.stream).or_default().push(l);
                l
            }
        };
        label[x] = Some(l);
        note(&mut windows, l, x);
    }
    let mut freeable_at: BTreeMap<usize, Vec<MempoolId>> = BTreeMap::new();
    for (l, w) in &windows {
        if w.first_release != usize::MAX {
            freeable_at.entry(w.first_release).or_default().push(*l);
        }
    }
    for v in freeable_at.values_mut() {
        v.sort_unstable();
    }
    Pools {
        label: label
            .into_iter()
            .map(|l| l.unwrap_or(DEFAULT_POOL))
            .collect(),
        freeable_at,
    }
}

/// The pools of the allocations on the same stream just before instance `x`'s first one
/// (as labelled so far) and just after it (as the snapshot names them).
fn neighbours(
    facts: &Facts,
    x: usize,
    label: &[Option<MempoolId>],
) -> (Option<MempoolId>, Option<MempoolId>) {
    let inst = &facts.instances[x];
    let (Some(first), Some(allocs)) = (inst.first_alloc, facts.stream_allocs.get(&inst.stream))
    else {
        return (None, None);
    };
    let at = allocs.partition_point(|&(i, _)| i < first);
    let other = |&&(_, y): &&(usize, u32)| y as usize != x;
    let before = allocs[..at]
        .iter()
        .rev()
        .find(other)
        .and_then(|&(_, y)| label[y as usize]);
    let after = allocs[at..]
        .iter()
        .find(other)
        .and_then(|&(_, y)| facts.instances[y as usize].known);
    (before, after)
}

fn dedup_in_order(v: &mut Vec<MempoolId>) {
    let mut seen = Vec::with_capacity(v.len());
    v.retain(|l| {
        let new = !seen.contains(l);
        seen.push(*l);
        new
    });
}
