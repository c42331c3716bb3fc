//! How the pages write numbers (bytes, milliseconds, threshold values): below every page,
//! so pages and parts read it without reaching back into `report/mod.rs`.

/// `1.50 GiB`, PyTorch's `memory_summary` style.
pub fn fmt_bytes(n: u64) -> String {
    vramroom_alloc::human_bytes(n)
}

/// Signed bytes: `-12.00 MiB`.
pub fn fmt_signed_bytes(n: i64) -> String {
    if n < 0 {
        format!("-{}", fmt_bytes(n.unsigned_abs()))
    } else {
        fmt_bytes(n as u64)
    }
}

/// Milliseconds with a precision that suits the size.
pub fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() {
        "-".into()
    } else if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// A threshold's value in its unit, for tables.
pub fn fmt_value(v: f64, unit: &str) -> String {
    match unit {
        "bytes" if v >= 0.0 => fmt_bytes(v.round() as u64),
        "ms" => fmt_ms(v),
        "count" => format!("{v:.0}"),
        "ratio" => format!("{v:.3}"),
        "1/s" => format!("{v:.1}/s"),
        _ => format!("{v}"),
    }
}
