//! Criterion bench of the Prometheus text parser (filled in with the parser).
fn main() {}
