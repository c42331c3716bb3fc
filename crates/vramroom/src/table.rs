//! The tables every command prints, through vramroom-alloc's one printer.

pub use vramroom_alloc::table::cell;

/// A plain-text table (vramroom-alloc's one printer): the first column left-aligned, the
/// numbers right-aligned; long cells are cut.
pub fn print_rows(header: &[&str], rows: &[Vec<String>]) {
    let right: Vec<bool> = (0..header.len()).map(|i| i > 0).collect();
    print!(
        "{}",
        vramroom_alloc::table::format_table(header, rows, &right)
    );
}
