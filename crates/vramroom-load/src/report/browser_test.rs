//! The HTML report in a real browser: headless Chromium opens it from a file, with no
//! console errors; its DOM holds every plot as an SVG; a screenshot of it has the page's
//! size and is not blank, and shows the plots' colours.
//!
//! At each of [`WIDTHS`], a copy of the report with a small script appended (the report
//! itself needs none) writes the laid-out page's facts into the DOM, which `--dump-dom`
//! hands back: no table runs past the page (each scrolls inside its box), and the OOM
//! marker of the memory timeline sits at its bytes on the plot's own scale (reserved +
//! request, above the capacity line), read from the SVG the browser parsed.
//!
//! Skips (with the reason printed) only when no Chromium is installed; `.ci/run` installs
//! Debian's `chromium`. Set `VRAMROOM_KEEP_SCREENSHOT=1` to keep the screenshot and the
//! report (the test prints where).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::html::PLOT_IDS;
use super::http::HTTP_PLOT_IDS;
use super::plots::oom_markers;
use super::testdata::{synthetic, synthetic_http};
use super::write_html;
use crate::results::RunResult;

/// The window widths checked: a laptop's and a desktop's.
const WIDTHS: [u32; 2] = [1280, 1920];

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

/// Opens `r`'s report in Chromium and checks its DOM (`ids` are its plots, the memory
/// timeline first), its layout at each width of [`WIDTHS`], its console and a `W`×`H`
/// screenshot at each.
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

    for W in WIDTHS {
        layout_at(&bin, &dir, r, ids[0], W, limit);
        screenshot_at(&bin, &dir, &url, W, H, limit);
    }
    if std::env::var_os("VRAMROOM_KEEP_SCREENSHOT").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// What the injected script reports: the page's widths, each table's box, and in the memory
/// timeline's SVG (user units) the capacity line's dashes, the OOM crosses and the plot area
/// (the stage bands span it from 0 to the axis top).
const LAYOUT_SCRIPT: &str = r#"<script>
(function () {
  var main = document.querySelector('main').getBoundingClientRect();
  var f = { inner: window.innerWidth, page: document.documentElement.scrollWidth,
            main_right: main.right, tables: [], cap_ys: [], crosses: [], band: null };
  document.querySelectorAll('table').forEach(function (t) {
    var box = t.parentElement;
    var b = box.getBoundingClientRect();
    f.tables.push([box.className === 'scroll' ? 1 : 0, b.left, b.right]);
  });
  var fig = document.getElementById('PLOT_ID');
  var red = function (e) { return (e.getAttribute('stroke') || '').toUpperCase() === '#D62728'; };
  fig.querySelectorAll('polyline').forEach(function (p) {
    if (!red(p)) return;
    var ys = p.getAttribute('points').trim().split(/\s+/).map(function (xy) { return +xy.split(',')[1]; });
    if (ys.length > 1 && ys.every(function (y) { return y === ys[0]; })) f.cap_ys.push(ys[0]);
  });
  var seen = [];
  fig.querySelectorAll('line').forEach(function (l) {
    if (!red(l)) return;
    var n = function (a) { return +l.getAttribute(a); };
    // A cross is two such lines about one centre: one entry per centre.
    var c = [(n('x1') + n('x2')) / 2, (n('y1') + n('y2')) / 2];
    if (Math.abs(n('x2') - n('x1')) === 12 && Math.abs(n('y2') - n('y1')) === 12 &&
        seen.indexOf(c.join()) < 0) { seen.push(c.join()); f.crosses.push(c[1]); }
  });
  fig.querySelectorAll('rect').forEach(function (r) {
    if ((r.getAttribute('fill') || '').toUpperCase() !== '#F0F4FA' || f.band) return;
    f.band = [+r.getAttribute('y'), +r.getAttribute('y') + +r.getAttribute('height')];
  });
  var pre = document.createElement('pre');
  pre.id = 'layout-facts';
  pre.textContent = JSON.stringify(f);
  document.body.appendChild(pre);
})();
</script>"#;

/// The page laid out `w` pixels wide: no table past the page, the OOM markers at their bytes.
fn layout_at(bin: &Path, dir: &Path, r: &RunResult, timeline_id: &str, w: u32, limit: Duration) {
    let page = super::render_html(r).replace(
        "</body>",
        &format!("{}</body>", LAYOUT_SCRIPT.replace("PLOT_ID", timeline_id)),
    );
    let file = dir.join(format!("layout-{w}.html"));
    std::fs::write(&file, page).unwrap();
    let out = chromium(
        bin,
        &dir.join(format!("profile-layout-{w}")),
        &[format!("--window-size={w},900"), "--dump-dom".into()],
        &format!("file://{}", file.display()),
        limit,
    );
    assert_eq!(
        out.code,
        Some(0),
        "chromium --dump-dom failed: {}",
        out.stderr
    );
    let at = out
        .stdout
        .find("<pre id=\"layout-facts\">")
        .unwrap_or_else(|| panic!("the layout script did not run at {w}px: {}", out.stderr));
    let rest = &out.stdout[at..];
    let json = &rest[rest.find('>').unwrap() + 1..rest.find("</pre>").expect("pre closes")];
    let f: serde_json::Value = serde_json::from_str(json).expect("layout facts are JSON");
    let num = |v: &serde_json::Value| v.as_f64().expect("a number");
    println!("layout at {w}px: {f}");
    assert_eq!(num(&f["inner"]), w as f64);
    // The page itself never scrolls sideways.
    assert!(
        num(&f["page"]) <= w as f64,
        "the page is wider than {w}px: {f}"
    );
    let tables = f["tables"].as_array().expect("tables");
    assert!(!tables.is_empty());
    for t in tables {
        assert_eq!(num(&t[0]), 1.0, "a table outside a scroll box at {w}px");
        assert!(
            num(&t[2]) <= num(&f["main_right"]) + 0.5,
            "a table runs past the page at {w}px: {t} (page ends at {})",
            f["main_right"]
        );
    }
    // The OOM markers on the plot's scale: bytes / capacity = their heights above the
    // axis over the capacity line's.
    let markers = oom_markers(r);
    if markers.is_empty() || r.capacity_bytes == 0 {
        return;
    }
    let cap_ys: Vec<f64> = f["cap_ys"]
        .as_array()
        .expect("cap_ys")
        .iter()
        .map(num)
        .collect();
    let cap_y = *cap_ys
        .iter()
        .max_by_key(|y| cap_ys.iter().filter(|z| z == y).count())
        .expect("the capacity line is drawn");
    let bottom = num(&f["band"][1]);
    let crosses: Vec<f64> = f["crosses"]
        .as_array()
        .expect("crosses")
        .iter()
        .map(num)
        .collect();
    assert_eq!(crosses.len(), markers.len(), "one cross per OOM: {f}");
    for ((_, bytes), y) in markers.iter().zip(&crosses) {
        assert!(
            *y < cap_y,
            "an OOM cross at y={y} is below the capacity line at {cap_y}"
        );
        let drawn = (bottom - y) / (bottom - cap_y);
        let want = *bytes as f64 / r.capacity_bytes as f64;
        assert!(
            (drawn - want).abs() < 0.02,
            "an OOM cross at {drawn:.3} x the capacity, its bytes are {want:.3} x"
        );
    }
}

/// A `W`×`H` screenshot, with the page's console on stderr: not blank, the plots' colours.
#[allow(non_snake_case)]
fn screenshot_at(bin: &Path, dir: &Path, url: &str, W: u32, H: u32, limit: Duration) {
    // 2. A screenshot, with the page's console on stderr.
    let shot = dir.join(format!("screenshot-{W}.png"));
    let profile2 = dir.join(format!("profile-shot-{W}"));
    let out = chromium(
        bin,
        &profile2,
        &[
            "--enable-logging=stderr".into(),
            "--v=0".into(),
            format!("--window-size={W},{H}"),
            format!("--screenshot={}", shot.display()),
        ],
        url,
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
}
