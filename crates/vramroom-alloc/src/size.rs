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
    #[error("size {input:?} is not a whole number of bytes (a size is never rounded: write it in a smaller unit or in bytes)")]
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
/// The rules, each pinned by a test below:
/// * surrounding whitespace is ignored, and whitespace may stand between the number and the
///   unit (`" 12 MiB "`); none inside the number (`"1 024"` is an unknown unit `024`);
/// * a non-negative decimal number: `4096`, `1.5`, `.5`, `5.`, a leading `+`; no exponent;
///   any sign `-` is refused as negative, `-0` included;
/// * then an optional case-insensitive unit: none, `B`, `byte`, `bytes` → bytes; decimal
///   `KB`/`MB`/`GB`/`TB`/`PB` → 10^3 … 10^15; binary `KiB`/`MiB`/`GiB`/`TiB`/`PiB` → 2^10 …
///   2^50; shorthand `K`/`M`/`G`/`T`/`P` → **binary** (as in `80G` meaning a GPU's 80 GiB,
///   and as PyTorch's own `*_mb` keys count MiB);
/// * the value must be a whole number of bytes, exactly: `0.5KiB` = 512 and `1.5GB` =
///   1,500,000,000 are sizes, `0.1KiB` (102.4 bytes) and `1.5` are refused — no rounding,
///   so the size used is the size typed;
/// * it must fit in a `u64` (`16383PiB` does, `16384PiB` does not);
/// * zero is a size (`0`, `0KiB`); callers for which zero makes no sense (a capacity)
///   refuse it themselves, naming their flag.
///
/// Time and memory are linear in the input's length.
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
    let overflow = || SizeError::Overflow {
        input: input.clone(),
    };
    // The fraction in bytes, exactly, by Horner's rule from the last digit:
    // x_k = d_k * mult, x_i = d_i * mult + x_{i+1} / 10, bytes = x_1 / 10. Each x is below
    // 10 * mult, so u128 never overflows, however many digits there are. A division by 10
    // that leaves a remainder means a fraction of a byte that no later digit can cancel.
    let mut frac_bytes: u128 = 0;
    for d in frac_part.bytes().rev() {
        let x = u128::from(d - b'0') * u128::from(mult) + frac_bytes;
        if !x.is_multiple_of(10) {
            return Err(SizeError::FractionalBytes { input });
        }
        frac_bytes = x / 10;
    }
    let int_digits = int_part.trim_start_matches('0');
    // More than 20 significant digits is more than u64::MAX before any unit.
    if int_digits.len() > 20 {
        return Err(overflow());
    }
    let int_value: u128 = if int_digits.is_empty() {
        0
    } else {
        int_digits.parse::<u128>().map_err(|_| overflow())?
    };
    let total = int_value
        .checked_mul(u128::from(mult))
        .and_then(|v| v.checked_add(frac_bytes))
        .ok_or_else(overflow)?;
    u64::try_from(total).map_err(|_| overflow())
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
            ("0.0009765625KiB", 1),
            ("0.00000095367431640625MiB", 1),
            ("0.000001MB", 1),
            ("16383PiB", 16383 << 50),
            ("16383.5PiB", (16383 << 50) + (1 << 49)),
            ("0KiB", 0),
            ("\t7\n", 7),
            ("7\u{00a0}KiB", 7 << 10),
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
        assert!(matches!(parse_size("-0"), Err(SizeError::Negative { .. })));
        assert!(matches!(
            parse_size(" -1 KiB"),
            Err(SizeError::Negative { .. })
        ));
        assert!(matches!(
            parse_size("1 024"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("16384PiB"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("18446744073709551615.5KiB"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("18446744073709551616B"),
            Err(SizeError::Overflow { .. })
        ));
    }

    #[test]
    fn fractions_of_a_byte_are_refused_never_rounded() {
        // The module's promise: 0.1KiB is 102.4 bytes and is refused, not rounded to 102.
        for bad in [
            "0.1KiB",
            "1.2GiB",
            "0.5",
            "0.0001KB",
            "1.0000000000000000000000000000000000000001GiB",
            "0.00048828125KiB", // half a byte
            "1.1",
            "0.000000000000000000000000000000000000000000000000000000001PiB",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(
                matches!(&e, SizeError::FractionalBytes { input } if input == bad),
                "{bad}: {e:?}"
            );
            assert!(e.to_string().contains("whole number of bytes"), "{e}");
        }
        // trailing zeros are not a fraction
        assert_eq!(
            parse_size("1.000000000000000000000000000000000000000000000"),
            Ok(1)
        );
        assert_eq!(
            parse_size("3.0000000000000000000000000000000000000000KB"),
            Ok(3000)
        );
    }

    #[test]
    fn long_inputs_are_linear_not_slow() {
        // 200,000 fraction digits: answered at once, and correctly.
        let long = format!("1.{}5KiB", "0".repeat(200_000));
        assert!(matches!(
            parse_size(&long),
            Err(SizeError::FractionalBytes { .. })
        ));
        let zeros = format!("{}1MiB", "0".repeat(200_000));
        assert_eq!(parse_size(&zeros), Ok(1 << 20));
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

        /// A number in any unit parses to exactly `digits * unit / 10^k` when that is a
        /// whole number of bytes that fits, is refused as fractional when it is not whole,
        /// and as overflow when it does not fit: checked against u128 arithmetic.
        #[test]
        fn parse_size_is_exact_in_every_unit(
            int in 0u64..100_000,
            frac in "[0-9]{0,12}",
            unit in prop::sample::select(vec![
                ("", 1u128), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30),
                ("TiB", 1 << 40), ("PiB", 1 << 50), ("KB", 1_000), ("MB", 1_000_000),
                ("GB", 1_000_000_000), ("TB", 1_000_000_000_000), ("PB", 1_000_000_000_000_000),
            ]),
            space in any::<bool>(),
        ) {
            let (u, mult) = unit;
            let s = format!("{int}{}{frac}{}{u}", if frac.is_empty() { "" } else { "." }, if space { " " } else { "" });
            let k = frac.len() as u32;
            let f: u128 = if frac.is_empty() { 0 } else { frac.parse().unwrap() };
            let scaled = (int as u128 * 10u128.pow(k) + f) * mult;
            let got = parse_size(&s);
            if !scaled.is_multiple_of(10u128.pow(k)) {
                prop_assert!(matches!(got, Err(SizeError::FractionalBytes { .. })), "{} -> {:?}", s, got);
            } else {
                let v = scaled / 10u128.pow(k);
                match u64::try_from(v) {
                    Ok(v) => prop_assert_eq!(got, Ok(v), "{}", s),
                    Err(_) => prop_assert!(matches!(got, Err(SizeError::Overflow { .. })), "{} -> {:?}", s, got),
                }
            }
        }

        /// Sizes around u64::MAX in every binary unit: the exact value or Overflow, never a
        /// wrapped one.
        #[test]
        fn parse_size_overflows_instead_of_wrapping(n in any::<u64>(), shift in 0u32..=50) {
            let s = format!("{n}B");
            prop_assert_eq!(parse_size(&s), Ok(n));
            let unit = match shift { 0..=9 => ("KiB", 10), 10..=19 => ("MiB", 20), 20..=29 => ("GiB", 30), 30..=39 => ("TiB", 40), _ => ("PiB", 50) };
            let got = parse_size(&format!("{n}{}", unit.0));
            match n.checked_mul(1u64 << unit.1) {
                Some(v) if (v >> unit.1) == n => prop_assert_eq!(got, Ok(v)),
                _ => prop_assert!(matches!(got, Err(SizeError::Overflow { .. })), "{:?}", got),
            }
        }
    }
}
