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

/// A threshold's measured value, in the terms its limit was written in (`written`, the text
/// after the operator): a ratio whose limit was a percentage prints as one, rounded
/// (`17.4%`), so it reads against `10%` rather than as the raw fraction 0.1736806947227789;
/// anything else as [`fmt_value`].
pub fn fmt_measured(v: f64, unit: &str, written: Option<&str>) -> String {
    match unit {
        "ratio" if written.is_some_and(|w| w.ends_with('%')) && v.is_finite() => {
            format!("{:.1}%", 100.0 * v)
        }
        _ => fmt_value(v, unit),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_values_read_against_the_written_limit() {
        let v = 0.1736806947227789;
        assert_eq!(fmt_measured(v, "ratio", Some("10%")), "17.4%");
        assert_eq!(fmt_measured(v, "ratio", Some("0.1")), "0.174");
        assert_eq!(fmt_measured(v, "ratio", None), "0.174");
        assert_eq!(
            fmt_measured(64.0 * 1048576.0, "bytes", Some("64MiB")),
            "64.00 MiB"
        );
        assert_eq!(fmt_measured(12.345, "ms", Some("200ms")), "12.3 ms");
    }
}
