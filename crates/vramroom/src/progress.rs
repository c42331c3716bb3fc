//! Progress lines that fit the terminal, however wide.
//!
//! Design note: indicatif's `{wide_msg}` truncates to the width console reports, which is 80
//! columns whenever the terminal's size cannot be read (and spinners' `{msg}` is not
//! truncated at all, so a long line wraps and every redraw leaves a copy behind). So each
//! message is cut here instead, to the width of stderr's terminal (the ioctl), else
//! `$COLUMNS` (what shells export, and what a user sets to say how wide), else 80, less the
//! columns the template draws before the message and one spare column (writing the last
//! column makes some terminals wrap). Widths count chars: the messages are ASCII but for
//! labels the user chose, and a char overcounts nothing that matters here.

use std::time::Duration;

/// Columns the run bar's template draws before its message: spinner, space, `[elapsed]`
/// padded to 4 inside brackets, space, the 24-column bar, space.
pub const RUN_PREFIX_COLS: usize = 1 + 1 + 6 + 1 + 24 + 1;
/// Columns a spinner's template (`{spinner} {msg}`) draws before its message.
pub const SPINNER_PREFIX_COLS: usize = 2;

/// The terminal's width in columns, as the design note says.
pub fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ writes a winsize into the struct we own; on failure it is left 0.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col > 0 {
        return ws.ws_col as usize;
    }
    columns_env(std::env::var("COLUMNS").ok().as_deref()).unwrap_or(80)
}

/// `$COLUMNS` read leniently: a positive number, else nothing (a bad value is not an error
/// worth stopping a run for, only a width we cannot use).
fn columns_env(v: Option<&str>) -> Option<usize> {
    v?.trim().parse::<usize>().ok().filter(|w| *w > 0)
}

/// `msg` cut to `cols` columns, with `…` as its last when cut.
pub fn fit(msg: &str, cols: usize) -> String {
    if msg.chars().count() <= cols {
        return msg.to_string();
    }
    if cols == 0 {
        return String::new();
    }
    let mut s: String = msg.chars().take(cols - 1).collect();
    s.push('…');
    s
}

/// `msg` fitted to a line of `width` columns after a template's `prefix_cols`.
pub fn fit_line(msg: &str, width: usize, prefix_cols: usize) -> String {
    fit(msg, width.saturating_sub(prefix_cols + 1))
}

/// `msg` fitted to this terminal after a template's `prefix_cols`.
pub fn fitted(msg: &str, prefix_cols: usize) -> String {
    fit_line(msg, terminal_width(), prefix_cols)
}

/// A ticking spinner on stderr whose message fits the terminal.
pub fn spinner(msg: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb.set_message(fitted(msg, SPINNER_PREFIX_COLS));
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSG: &str = "stage 3/5 c=16 | 12345 req | 0 OOM | alloc 12.00 GiB | reserved 14.00 GiB | peak 13.50 GiB of 80.00 GiB";

    #[test]
    fn a_narrow_terminal_cuts_the_message_to_its_width() {
        let line = fit_line(MSG, 60, RUN_PREFIX_COLS);
        assert_eq!(line.chars().count() + RUN_PREFIX_COLS + 1, 60);
        assert!(line.ends_with('…') && MSG.starts_with(line.trim_end_matches('…')));
        assert_eq!(fit_line(MSG, 10, RUN_PREFIX_COLS), "");
        assert_eq!(fit_line("searching", 8, SPINNER_PREFIX_COLS), "sear…");
    }

    #[test]
    fn a_wide_terminal_shows_the_whole_message_past_80_columns() {
        assert!(MSG.len() + RUN_PREFIX_COLS > 80);
        assert_eq!(fit_line(MSG, 200, RUN_PREFIX_COLS), MSG);
        // Exactly fitting is not cut.
        let w = MSG.len() + RUN_PREFIX_COLS + 1;
        assert_eq!(fit_line(MSG, w, RUN_PREFIX_COLS), MSG);
        assert!(fit_line(MSG, w - 1, RUN_PREFIX_COLS).ends_with('…'));
    }

    #[test]
    fn columns_from_the_environment() {
        assert_eq!(columns_env(Some("132")), Some(132));
        for bad in [None, Some(""), Some("0"), Some("wide"), Some("-5")] {
            assert_eq!(columns_env(bad), None, "{bad:?}");
        }
    }
}
