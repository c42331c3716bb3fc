//! `vramroom replay SNAPSHOT --evidence FILE`: the diagnosis of a traced program (#30
//! Deliver 3), by the load tester's engine (vramroom_load::diagnose::diagnose_traced).

use std::path::Path;

use anyhow::Context;
use vramroom_alloc::AllocatorConfig;
use vramroom_load::diagnose::{
    diagnose_traced, replay_traced, traced_finding_lines, TracedEvidence, TracedFinding,
};

use crate::error::UserError;

/// The findings, when `--evidence` was given.
pub fn findings(
    evidence: Option<&Path>,
    snap: &vramroom_trace::Snapshot,
    conf: &AllocatorConfig,
    capacity: Option<u64>,
) -> Result<Option<Vec<TracedFinding>>, UserError> {
    let Some(path) = evidence else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --evidence {}", path.display()))?;
    let ev = TracedEvidence::from_json(&text).with_context(|| {
        format!(
            "--evidence {} is not a tracer's evidence file",
            path.display()
        )
    })?;
    let r = replay_traced(snap, conf, capacity, &ev)?;
    Ok(Some(diagnose_traced(&ev, &r)))
}

/// The Findings section after the table.
pub fn print(findings: Option<&[TracedFinding]>) {
    let Some(f) = findings else {
        return;
    };
    println!("\nFindings:");
    if f.is_empty() {
        println!("  none: no mistake of the seed's found in the traced program");
        return;
    }
    for (line, t) in traced_finding_lines(f).iter().zip(f) {
        println!("  {line}");
        println!("      {}", t.finding.evidence);
        println!("      fix: {}", t.finding.fix);
    }
}
