//! How much of an HTTP body the client reads: every body it buffers has a cap fitted to
//! what it is, applied while the body streams in.
//!
//! Design note: `vramroom http` and `watch` read whole bodies only off the hot path (metrics
//! scrapes, the probe's `/snapshot`), and before these caps an endless body grew until the
//! process died (7.7 GB for a snapshot, 5 GB in 5 s for a metrics scrape). A body past its
//! cap is an error for that one scrape or fetch, naming the cap and how to raise it; the
//! run goes on and its report is written. Metrics text is small by nature; a snapshot of a
//! long-recorded service is legitimately large, so its cap is a setting
//! (`vramroom http --max-snapshot-size`), process-wide because one command sets it once.

use std::sync::atomic::{AtomicU64, Ordering};

use vramroom_alloc::input::Limit;

/// A Prometheus metrics body.
pub const METRICS: Limit = Limit {
    what: "metrics body",
    bytes: 16 << 20,
    raise: None,
};

/// The default cap on the probe's snapshot pickles.
pub const DEFAULT_SNAPSHOT_BYTES: u64 = 512 << 20;

static SNAPSHOT_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_SNAPSHOT_BYTES);

/// Sets the cap on the probe's `/snapshot` and `/oom_snapshot` bodies.
pub fn set_snapshot_bytes(bytes: u64) {
    SNAPSHOT_BYTES.store(bytes, Ordering::Relaxed);
}

/// The cap on the probe's snapshot bodies.
pub fn snapshot() -> Limit {
    Limit {
        what: "snapshot",
        bytes: SNAPSHOT_BYTES.load(Ordering::Relaxed),
        raise: Some("--max-snapshot-size"),
    }
}
