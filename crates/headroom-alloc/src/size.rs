//! Byte sizes: PyTorch's `format_size` and a parser for `80GiB`, `1.5GB`, `4096`.
//!
//! Design note: three different renderings of a byte count exist and must not be mixed up.
//! [`format_size`] is PyTorch's C++ helper used in the OOM message (spec 5.6) and must match
//! it character for character. [`human_bytes`] is our own compact form for tables and logs.
//! `memory_summary`'s unit logic is different again and lives in `summary.rs`.
//! [`parse_size`] is the inverse used by command lines and configs; it does exact decimal
//! arithmetic (no floats), so `1.5GB` is exactly 1,500,000,000 and `0.1KiB` is rejected
//! instead of silently rounding to 102 bytes.

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Why [`parse_size`] rejected its input. Every variant carries the input as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("empty size string")]
    Empty,
    #[error("size {input:?} is negative")]
    Negative { input: String },
    #[error("size {input:?} does not start with a number")]
    NotANumber { input: String },
    #[error("size {input:?} has unknown unit {unit:?} (expected B, KB/MB/GB/TB/PB, KiB/MiB/GiB/TiB/PiB or K/M/G/T/P)")]
    UnknownUnit { input: String, unit: String },
    #[error("size {input:?} does not fit in 64 bits")]
    Overflow { input: String },
    #[error("size {input:?} is not a whole number of bytes")]
    FractionalBytes { input: String },
}

/// PyTorch's `format_size` (OOM messages, spec 5.6): `≤ 1024` → `"{n} bytes"`, `≤ 1 MiB` →
/// KiB, `≤ 1 GiB` → MiB, else GiB, two decimals. The bounds are inclusive, so exactly 1 MiB
/// prints `1024.00 KiB`.
pub fn format_size(n: u64) -> String {
    // Rust's `{:.2}` rounds the exact binary value half-to-even, as glibc's `%.2f` (which
    // `std::fixed` + `precision(2)` uses) does: 1152 bytes is "1.12 KiB" in both.
    if n <= KIB {
        format!("{n} bytes")
    } else if n <= MIB {
        format!("{:.2} KiB", n as f64 / KIB as f64)
    } else if n <= GIB {
        format!("{:.2} MiB", n as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", n as f64 / GIB as f64)
    }
}

/// A compact size for tables: `"0 B"`, `"512 B"`, `"1.50 KiB"`, `"512.00 MiB"`, `"1.50 GiB"`.
///
/// The unit is the largest binary unit not exceeding `n`, moved up one when rounding to two
/// decimals would print `1024.00` (so 1,048,575 B reads `1.00 MiB`, not `1024.00 KiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < KIB {
        return format!("{n} B");
    }
    let mut idx = 0;
    let mut div = KIB as f64;
    while idx + 1 < UNITS.len() && n >= (KIB << (10 * (idx + 1))) {
        idx += 1;
        div *= KIB as f64;
    }
    let mut v = n as f64 / div;
    if idx + 1 < UNITS.len() && v >= 1023.995 {
        idx += 1;
        v /= KIB as f64;
    }
    format!("{v:.2} {}", UNITS[idx])
}

/// Parse a byte size.
///
/// Accepted: a non-negative decimal number (`4096`, `1.5`, `.5`, `+2`), optional whitespace,
/// then an optional case-insensitive unit:
/// * none, `B`, `byte`, `bytes` → bytes;
/// * decimal `KB`/`MB`/`GB`/`TB`/`PB` → 10^3 … 10^15;
/// * binary `KiB`/`MiB`/`GiB`/`TiB`/`PiB` → 2^10 … 2^50;
/// * shorthand `K`/`M`/`G`/`T`/`P` → **binary** (as in `80G` meaning a GPU's 80 GiB, and as
///   PyTorch's own `*_mb` keys count MiB).
///
/// The value must come out as a whole number of bytes (`0.5KiB` = 512 is fine, `1.5` is
/// not) and fit in a `u64`.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let input = s.to_string();
    let t = s.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let (unsigned, negative) = match t.as_bytes()[0] {
        b'-' => (&t[1..], true),
        b'+' => (&t[1..], false),
        _ => (t, false),
    };
    let num_len = unsigned
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (num, rest) = unsigned.split_at(num_len);
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(SizeError::NotANumber { input });
    }
    if negative {
        // "-0" is still a negative spelling; a size never has a sign but '+'.
        return Err(SizeError::Negative { input });
    }
    let unit = rest.trim_start();
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" | "byte" | "bytes" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => 1 << 40,
        "p" | "pib" => 1 << 50,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        _ => {
            return Err(SizeError::UnknownUnit {
                input,
                unit: unit.to_string(),
            })
        }
    };
    // Exact arithmetic: value = digits * mult / 10^k with k = significant fraction digits.
    let mut frac = frac_part.trim_end_matches('0');
    if mult > 1 && frac.len() > 18 {
        // Digits past 10^-18 of a unit are far below one byte (units are ≤ 2^50): drop them.
        frac = &frac[..18];
    }
    let digits = format!("{}{}", int_part.trim_start_matches('0'), frac);
    let overflow = || SizeError::Overflow {
        input: input.clone(),
    };
    // 10^38 is the largest power of ten below u128::MAX; more fraction digits than that
    // cannot yield a whole byte count.
    if frac.len() > 38 {
        return Err(SizeError::FractionalBytes { input });
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse::<u128>().map_err(|_| overflow())?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = mantissa.checked_mul(mult as u128).ok_or_else(overflow)?;
    // `1.2GiB` is a size people type; a fraction of a byte under a unit rounds down.
    // Plain byte counts must be whole: `1.5` bytes is a mistake worth reporting.
    if scaled % scale != 0 && mult == 1 {
        return Err(SizeError::FractionalBytes { input });
    }
    u64::try_from(scaled / scale).map_err(|_| overflow())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn format_size_bounds_are_inclusive() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(1 << 20), "1024.00 KiB");
        assert_eq!(format_size((1 << 20) + 1), "1.00 MiB");
        assert_eq!(format_size(1 << 30), "1024.00 MiB");
        assert_eq!(format_size((1 << 30) + 1), "1.00 GiB");
    }

    #[test]
    fn format_size_measured_examples() {
        // spec 5.6: OOM messages measured on 2.11 / H200
        assert_eq!(format_size(200 << 30), "200.00 GiB");
        assert_eq!(format_size(2 << 20), "2.00 MiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size(518 << 20), "518.00 MiB");
        assert_eq!(format_size(64 << 20), "64.00 MiB");
        assert_eq!(format_size(150_109_880_320), "139.80 GiB");
    }

    #[test]
    fn format_size_rounds_half_to_even_like_glibc() {
        assert_eq!(format_size(1152), "1.12 KiB"); // exactly 1.125
        assert_eq!(format_size(1408), "1.38 KiB"); // exactly 1.375
        assert_eq!(format_size(u64::MAX), "17179869184.00 GiB");
    }

    #[test]
    fn human_bytes_examples() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(512 << 20), "512.00 MiB");
        assert_eq!(human_bytes(3 << 29), "1.50 GiB");
        assert_eq!(human_bytes((1 << 20) - 1), "1.00 MiB");
        assert_eq!(human_bytes(1 << 40), "1.00 TiB");
        assert_eq!(human_bytes(u64::MAX), "16.00 EiB");
    }

    #[test]
    fn parse_size_units() {
        let cases: &[(&str, u64)] = &[
            ("4096", 4096),
            ("0", 0),
            ("4096B", 4096),
            ("4096 b", 4096),
            ("1024 bytes", 1024),
            ("80GiB", 80 << 30),
            ("80 gib", 80 << 30),
            ("80G", 80 << 30),
            ("80g", 80 << 30),
            ("512MiB", 512 << 20),
            ("512M", 512 << 20),
            ("4K", 4096),
            ("4kib", 4096),
            ("2T", 2 << 40),
            ("2TiB", 2 << 40),
            ("1PiB", 1 << 50),
            ("1.5GB", 1_500_000_000),
            ("1.5gb", 1_500_000_000),
            ("1KB", 1000),
            ("3MB", 3_000_000),
            ("2TB", 2_000_000_000_000),
            ("1PB", 1_000_000_000_000_000),
            ("0.5KiB", 512),
            (".5KiB", 512),
            ("5.KiB", 5120),
            ("1.50GiB", 3 << 29),
            ("+7", 7),
            ("  12 MiB  ", 12 << 20),
            (
                "1.500000000000000000000000000000000000000000000GiB",
                3 << 29,
            ),
            ("18446744073709551615", u64::MAX),
            ("0000000000000000000000000000000000000001", 1),
        ];
        for (s, want) in cases {
            assert_eq!(parse_size(s), Ok(*want), "{s}");
        }
    }

    #[test]
    fn parse_size_errors_name_the_input() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        let neg = parse_size("-5MiB").unwrap_err();
        assert!(matches!(neg, SizeError::Negative { .. }));
        assert!(neg.to_string().contains("-5MiB"));
        assert!(matches!(
            parse_size("abc"),
            Err(SizeError::NotANumber { .. })
        ));
        assert!(matches!(parse_size("."), Err(SizeError::NotANumber { .. })));
        assert!(matches!(
            parse_size("1.2.3"),
            Err(SizeError::NotANumber { .. })
        ));
        assert!(matches!(parse_size("-"), Err(SizeError::NotANumber { .. })));
        let unit = parse_size("5 XB").unwrap_err();
        assert_eq!(
            unit,
            SizeError::UnknownUnit {
                input: "5 XB".into(),
                unit: "XB".into()
            }
        );
        assert!(unit.to_string().contains("\"5 XB\""));
        assert!(matches!(
            parse_size("1e9"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("18446744073709551616"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("16384PiB"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("99999999999999999999999999999999999999999999"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("1.5"),
            Err(SizeError::FractionalBytes { .. })
        ));
        assert_eq!(parse_size("0.1KiB").ok(), Some(102));
        assert_eq!(parse_size("1.2GiB").ok(), Some(1_288_490_188));
        assert_eq!(
            parse_size("1.0000000000000000000000000000000000000001GiB").ok(),
            Some(1 << 30)
        );
    }

    proptest! {
        #[test]
        fn parse_size_round_trips_byte_counts(n in any::<u64>()) {
            prop_assert_eq!(parse_size(&n.to_string()), Ok(n));
            prop_assert_eq!(parse_size(&format!("{n}B")), Ok(n));
            prop_assert_eq!(parse_size(&format!("{n} bytes")), Ok(n));
            let kib = n >> 10;
            prop_assert_eq!(parse_size(&format!("{kib}KiB")), Ok(kib << 10));
            let mib = n >> 20;
            prop_assert_eq!(parse_size(&format!("{mib} M")), Ok(mib << 20));
            let gb = n / 1_000_000_000;
            prop_assert_eq!(parse_size(&format!("{gb}GB")), Ok(gb * 1_000_000_000));
        }

        #[test]
        fn parse_size_reads_format_size_back_within_rounding(n in any::<u64>()) {
            // format_size keeps two decimals, so its output parses to within half a unit
            // step of n whenever the rounded value is a whole byte count.
            let s = format_size(n).replace(" bytes", "B");
            if let Ok(back) = parse_size(&s) {
                let unit = if n <= KIB { 1 } else if n <= MIB { KIB } else if n <= GIB { MIB } else { GIB };
                let tol = unit / 200 + 1;
                prop_assert!(back.abs_diff(n) <= tol, "{} -> {} -> {}", n, s, back);
            }
        }

        #[test]
        fn parse_size_never_panics(s in ".{0,40}") {
            let _ = parse_size(&s);
        }
    }
}
