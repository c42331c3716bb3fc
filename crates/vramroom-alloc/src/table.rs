//! The one plain-text table printer of the workspace (`vramroom replay`, `predict`, the
//! load test's terminal summary).
//!
//! Design note: it lives in the lowest crate so every command prints tables the same way
//! without depending sideways on another. Cells are cut to [`MAX_CELL_CHARS`] characters
//! (a 70,000-character conf string from a snapshot stays one readable cell; `--json`
//! keeps the whole string), so neither the widths nor the output grow with the input.
//! Padding is done by hand: `format!("{c:<w$}")` panics when `w` exceeds `u16::MAX`, and a
//! width computed from input must never do that.

/// The longest cell printed in full; longer ones are cut with a `…` and their length.
pub const MAX_CELL_CHARS: usize = 80;

/// `s` cut to [`MAX_CELL_CHARS`] characters (not bytes: a cut never splits a character).
pub fn cell(s: &str) -> String {
    let n = s.chars().count();
    if n <= MAX_CELL_CHARS {
        return s.to_string();
    }
    let note = format!("… ({n} chars)");
    let keep = MAX_CELL_CHARS.saturating_sub(note.chars().count());
    s.chars().take(keep).chain(note.chars()).collect()
}

/// A table: the header, a dashed rule under each column, then the rows. Column `i` is
/// right-aligned when `right[i]` is true (numbers), left-aligned otherwise; trailing
/// spaces are trimmed from every line.
pub fn format_table(header: &[&str], rows: &[Vec<String>], right: &[bool]) -> String {
    let n = header.len();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().take(n).map(|c| cell(c)).collect())
        .collect();
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (i, wi) in w.iter().enumerate() {
            let c = cells.get(i).map(String::as_str).unwrap_or("");
            let fill = " ".repeat(wi.saturating_sub(c.chars().count()));
            if i > 0 {
                s.push_str("  ");
            }
            if right.get(i).copied().unwrap_or(false) {
                s.push_str(&fill);
                s.push_str(c);
            } else {
                s.push_str(c);
                s.push_str(&fill);
            }
        }
        let mut s = s.trim_end().to_string();
        s.push('\n');
        s
    };
    let mut out = line(&header.iter().map(|s| cell(s)).collect::<Vec<_>>());
    let rule: Vec<String> = w.iter().map(|n| "-".repeat(*n)).collect();
    out.push_str(&rule.join("  "));
    out.push('\n');
    for r in &rows {
        out.push_str(&line(r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_align() {
        let rows = vec![
            vec!["a".to_string(), "1".to_string()],
            vec!["longer".to_string(), "12345".to_string()],
        ];
        let t = format_table(&["name", "n"], &rows, &[false, true]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        // every number ends in the same column
        let ends: Vec<usize> = lines[2..].iter().map(|l| l.chars().count()).collect();
        assert_eq!(ends[0], ends[1]);
        assert!(lines[2].starts_with("a "));
        assert!(lines[1].chars().all(|c| c == '-' || c == ' '));
        assert!(t.lines().all(|l| !l.ends_with(' ')));
    }

    #[test]
    fn long_cells_are_cut_and_huge_widths_do_not_panic() {
        let big = "x".repeat(100_000);
        let t = format_table(&["c"], &[vec![big]], &[true]);
        assert!(t.lines().all(|l| l.chars().count() <= MAX_CELL_CHARS));
        assert!(t.contains("(100000 chars)"));
        // a row shorter than the header leaves its cells empty
        let t = format_table(&["a", "b"], &[vec!["1".into()]], &[]);
        assert_eq!(t.lines().count(), 3);
    }
}
