//! The HTML report in a real browser: headless Chromium opens it from a file, with no
//! console errors; its DOM holds every plot as an SVG; a screenshot of it has the page's
//! size and is not blank, and shows the plots' colours.
//!
//! Skips (with the reason printed) only when no Chromium is installed; `.ci/run` installs
//! Debian's `chromium`. Set `VRAMROOM_KEEP_SCREENSHOT=1` to keep the screenshot and the
//! report (the test prints where).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::html::PLOT_IDS;
use super::http::HTTP_PLOT_IDS;
use super::testdata::{synthetic, synthetic_http};
use super::write_html;
use crate::results::RunResult;

const W: u32 = 1280;

fn find_chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("VRAMROOM_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome", "chrome"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs Chromium headless with the flags that keep it off the network, killing it after
/// `limit`.
fn chromium(bin: &Path, profile: &Path, extra: &[String], url: &str, limit: Duration) -> Out {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(extra)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start chromium");
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut so, &mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut se, &mut s);
        s
    });
    let start = Instant::now();
    let code = loop {
        match child.try_wait().expect("wait chromium") {
            Some(st) => break st.code(),
            None if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not finish within {limit:?}");
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    Out {
        code,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

/// Lines of Chromium's log that are errors of the page (console messages, uncaught
/// exceptions, failed loads), not of the browser's own start-up.
fn page_errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.contains("Uncaught")
                || l.contains(":CONSOLE")
                || l.contains("console.error")
                || l.contains("Failed to load resource")
                || l.contains("net::ERR_")
        })
        .collect()
}

#[test]
fn report_opens_in_headless_chromium_with_every_plot() {
    in_chromium("loadtest", &synthetic(), &PLOT_IDS, 4000);
}

#[test]
fn http_report_opens_in_headless_chromium_with_every_plot() {
    in_chromium("http", &synthetic_http(true), &HTTP_PLOT_IDS, 2600);
}

/// Opens `r`'s report in Chromium and checks its DOM (`ids` are its plots), console and a
/// `W`×`H` screenshot.
#[allow(non_snake_case)]
fn in_chromium(name: &str, r: &RunResult, ids: &[&str], H: u32) {
    let Some(bin) = find_chromium() else {
        println!(
            "SKIPPED: no Chromium found on PATH (install Debian's `chromium`, as .ci/run does, \
             or set VRAMROOM_CHROMIUM)"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("vramroom-browser-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.html");
    write_html(&report, r).unwrap();
    let url = format!("file://{}", report.display());
    let limit = Duration::from_secs(120);

    // 1. The DOM as the browser parsed it: every plot is a figure holding an <svg>.
    let profile1 = dir.join("profile-dom");
    let dom = chromium(&bin, &profile1, &["--dump-dom".into()], &url, limit);
    assert_eq!(
        dom.code,
        Some(0),
        "chromium --dump-dom failed: {}",
        dom.stderr
    );
    for id in ids {
        let at = dom
            .stdout
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("plot {id} missing from the DOM"));
        let rest = &dom.stdout[at..];
        let end = rest.find("</figure>").expect("figure closes");
        let fig = &rest[..end];
        assert!(fig.contains("<svg"), "plot {id} has no <svg> in the DOM");
        assert!(
            fig.contains("<polyline") || fig.contains("<rect") || fig.contains("<path"),
            "plot {id} has no drawing in it"
        );
    }
    assert!(
        !dom.stdout.contains("<script"),
        "the report must need no script"
    );

    // 2. A screenshot, with the page's console on stderr.
    let shot = dir.join("screenshot.png");
    let profile2 = dir.join("profile-shot");
    let out = chromium(
        &bin,
        &profile2,
        &[
            "--enable-logging=stderr".into(),
            "--v=0".into(),
            format!("--window-size={W},{H}"),
            format!("--screenshot={}", shot.display()),
        ],
        &url,
        limit,
    );
    assert_eq!(
        out.code,
        Some(0),
        "chromium --screenshot failed: {}",
        out.stderr
    );
    let errs = page_errors(&out.stderr);
    assert!(errs.is_empty(), "console errors:\n{}", errs.join("\n"));

    // 3. The screenshot: the window's size, mostly drawn, with the plots' colours in it.
    let file = std::io::BufReader::new(std::fs::File::open(&shot).expect("screenshot written"));
    let mut reader = png::Decoder::new(file).read_info().expect("png header");
    let mut buf = vec![0u8; reader.output_buffer_size().expect("png buffer size")];
    let info = reader.next_frame(&mut buf).expect("png pixels");
    assert_eq!((info.width, info.height), (W, H), "screenshot size");
    let ch = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        t => panic!("unexpected screenshot colour type {t:?}"),
    };
    let px = &buf[..info.buffer_size()];
    let n = (info.width * info.height) as usize;
    let mut non_white = 0usize;
    let mut colours = std::collections::HashSet::new();
    let (mut blue, mut orange, mut red) = (0usize, 0usize, 0usize);
    let near = |p: &[u8], c: (u8, u8, u8)| {
        (p[0] as i32 - c.0 as i32).abs() < 24
            && (p[1] as i32 - c.1 as i32).abs() < 24
            && (p[2] as i32 - c.2 as i32).abs() < 24
    };
    // Rows that hold anything but the page background: the page is drawn top to bottom.
    let mut drawn_rows = 0usize;
    for y in 0..info.height as usize {
        let row = &px[y * info.width as usize * ch..(y + 1) * info.width as usize * ch];
        let mut row_drawn = false;
        for p in row.chunks_exact(ch) {
            if p[0] < 245 || p[1] < 245 || p[2] < 245 {
                non_white += 1;
                row_drawn = true;
            }
            colours.insert((p[0] >> 3, p[1] >> 3, p[2] >> 3));
            blue += near(p, (31, 119, 180)) as usize;
            orange += near(p, (255, 127, 14)) as usize;
            red += near(p, (214, 39, 40)) as usize;
        }
        drawn_rows += row_drawn as usize;
    }
    let frac = non_white as f64 / n as f64;
    let keep = std::env::var_os("VRAMROOM_KEEP_SCREENSHOT").is_some();
    println!(
        "screenshot {}: {}x{}, {:.1}% non-white, {} colours, {} drawn rows, blue {blue}, \
         orange {orange}, red {red}{}",
        shot.display(),
        info.width,
        info.height,
        frac * 100.0,
        colours.len(),
        drawn_rows,
        if keep { " (kept)" } else { "" }
    );
    assert!(
        frac > 0.03,
        "the screenshot is nearly blank ({:.2}% drawn)",
        frac * 100.0
    );
    assert!(colours.len() > 40, "too few colours: {}", colours.len());
    assert!(
        drawn_rows as f64 > 0.5 * info.height as f64,
        "most of the page is empty"
    );
    // The allocated (blue) and reserved (orange) lines and the capacity (red) are drawn.
    assert!(
        blue > 500 && orange > 500 && red > 200,
        "plot colours missing"
    );
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
