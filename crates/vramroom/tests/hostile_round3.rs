//! Hostile input, round 3 (issue 28), at the command line: sizes that wrap, work that grows
//! with a number in the input, reads without a bound, gates that pass unmeasured and
//! accounting that hides what happened. Each case ends in exit 0 with a sane result, 1 for
//! a run that failed, 2 with one line naming the problem, or 99 for a broken threshold;
//! never a crash, a hang or unbounded memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vramroom_load::http::server::{Reply, Seen, TestServer};

mod common;

use common::read_json;

fn scratch(name: &str) -> PathBuf {
    common::scratch("hostile-round3", name)
}

fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    common::run_in_within(dir, args, Duration::from_secs(60))
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(name)
        .display()
        .to_string()
}

/// `fixtures/hf/<base>`'s config with `extra` merged in, as folder `dir/name`.
fn config(dir: &Path, name: &str, base: &str, extra: &[(&str, serde_json::Value)]) -> String {
    let text = std::fs::read_to_string(Path::new(&fixture(base)).join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (k, x) in extra {
        v[*k] = x.clone();
    }
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), v.to_string()).unwrap();
    d.display().to_string()
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Exit 2 with one line (no panic), mentioning `what`.
fn assert_refused(r: (i32, String, String), what: &str, case: &str) {
    let (code, out, err) = r;
    assert!(!err.contains("panicked"), "{case}: {err}");
    assert_eq!(code, 2, "{case}: stdout {out}\nstderr {err}");
    assert_eq!(err.trim().lines().count(), 1, "{case}: {err}");
    assert!(err.contains(what), "{case}: wanted {what:?} in {err}");
}

#[test]
fn sizes_that_wrap_are_refused_naming_the_field() {
    let d = scratch("wrap");
    let inter = config(
        &d,
        "inter",
        "llama-tiny",
        &[("intermediate_size", (1u64 << 62).into())],
    );
    let vocab = config(
        &d,
        "vocab",
        "llama-tiny",
        &[("vocab_size", ((1u64 << 58) + 1000).into())],
    );
    assert_refused(
        run_in(&d, &["predict", "--model", &inter]),
        "intermediate_size",
        "predict",
    );
    assert_refused(
        run_in(&d, &["predict", "--model", &vocab]),
        "vocab_size",
        "predict vocab",
    );
    // It was a SIGSEGV in the cpu backend's GEMM.
    assert_refused(
        run_in(
            &d,
            &[
                "loadtest", "--model", &inter, "--device", "cpu", "-n", "1", "--quiet",
            ],
        ),
        "intermediate_size",
        "loadtest cpu",
    );
}

#[test]
fn a_model_past_the_device_is_an_answer_before_any_layer_is_built() {
    let d = scratch("layers");
    let m = config(
        &d,
        "l",
        "llama-tiny",
        &[("num_hidden_layers", 1_000_000_000_000u64.into())],
    );
    let (code, _, err) =
        common::run_in_within(&d, &["predict", "--model", &m], Duration::from_secs(10));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("out of memory") && err.contains("need"),
        "{err}"
    );
    let m = config(
        &d,
        "eib",
        "llama-tiny",
        &[
            ("num_hidden_layers", 1_000_000_000_000u64.into()),
            ("intermediate_size", 1_000_000_000u64.into()),
        ],
    );
    let (code, _, err) =
        common::run_in_within(&d, &["predict", "--model", &m], Duration::from_secs(10));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("EiB"), "{err}");
}

#[test]
fn special_files_and_endless_files_are_bounded() {
    let d = scratch("reads");
    assert_refused(
        run_in(&d, &["predict", "--model", "/dev/zero"]),
        "larger than",
        "/dev/zero",
    );
    // A FIFO as the config: no writer, so it reads as empty instead of blocking.
    let fifo = d.join("fifo.json");
    mkfifo(&fifo);
    assert_refused(
        run_in(&d, &["predict", "--model", fifo.to_str().unwrap()]),
        "config",
        "fifo config",
    );
    // A FIFO named *.safetensors in a model folder.
    let m = config(&d, "withfifo", "llama-tiny", &[]);
    mkfifo(&Path::new(&m).join("model.safetensors"));
    assert_refused(
        run_in(
            &d,
            &[
                "loadtest", "--model", &m, "--device", "cpu", "-n", "1", "--quiet",
            ],
        ),
        "not a regular file",
        "fifo weights",
    );
    // /dev/zero is not JSON (it is read as a snapshot, and refused as one); a results JSON
    // of 300 MiB (sparse: it costs no disk) is past diff's bound.
    let big = d.join("big.json");
    let f = std::fs::File::create(&big).unwrap();
    std::io::Write::write_all(&mut &f, b"{").unwrap();
    f.set_len(300 << 20).unwrap();
    let big = big.to_str().unwrap();
    assert_refused(run_in(&d, &["diff", big, big]), "larger than", "diff");
    assert_refused(
        run_in(&d, &["diff", "/dev/zero", "/dev/zero"]),
        "snapshot",
        "diff zero",
    );
    let fifo = d.join("trace.pickle");
    mkfifo(&fifo);
    assert_refused(
        run_in(&d, &["replay", fifo.to_str().unwrap()]),
        "pickle",
        "fifo snapshot",
    );
    let csv = d.join("log.csv");
    std::os::unix::fs::symlink("/dev/zero", &csv).unwrap();
    assert_refused(
        run_in(&d, &["replay", csv.to_str().unwrap()]),
        "larger than",
        "rmm log",
    );
    assert_refused(
        run_in(&d, &["bench", "alloc", "--reference", "/dev/zero"]),
        "larger than",
        "bench alloc --reference",
    );
    assert_refused(
        run_in(
            &d,
            &[
                "http",
                "http://127.0.0.1:9/",
                "--ramp-until-oom",
                "--predicted-from",
                "/dev/zero",
            ],
        ),
        "larger than",
        "--predicted-from",
    );
    assert_refused(
        run_in(
            &d,
            &[
                "http",
                "http://127.0.0.1:9/",
                "--body-file",
                "/dev/zero",
                "-n",
                "1",
            ],
        ),
        "larger than",
        "--body-file",
    );
}

fn server(reply: fn() -> Reply) -> TestServer {
    TestServer::start(1, Arc::new(move |_: &Seen| reply())).unwrap()
}

#[test]
fn an_http_gate_on_memory_nobody_measured_fails_saying_so() {
    let s = server(|| Reply::ok("ok"));
    let d = scratch("gate");
    let url = s.url("/");
    let (code, out, err) = run_in(
        &d,
        &[
            "http",
            &url,
            "-n",
            "10",
            "--no-nvml",
            "--quiet",
            "--out",
            "o",
            "--threshold",
            "peak_reserved<1B",
        ],
    );
    assert_eq!(code, 99, "stdout {out}\nstderr {err}");
    assert!(err.contains("peak_reserved<1B (not measured"), "{err}");
    let v = read_json(&d.join("o/results.json"));
    assert_eq!(v["thresholds"][0]["passed"], false);
    assert!(v["thresholds"][0]["actual"].is_null());
    // diff applies the same rule to that results.json, and takes loadtest's `==`.
    let r = d.join("o/results.json");
    let r = r.to_str().unwrap();
    let (code, _, err) = run_in(&d, &["diff", r, r, "--threshold", "peak_reserved<1GiB"]);
    assert_eq!(code, 99, "{err}");
    let (code, _, err) = run_in(&d, &["diff", r, r, "--threshold", "oom_count==0"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn all_503_counts_each_request_once() {
    let s = server(|| Reply::status(503));
    let d = scratch("shed");
    let url = s.url("/");
    let (code, _, err) = run_in(&d, &["http", &url, "-n", "20", "--no-nvml", "--quiet"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("0 of 20 (20 shed (503))"), "{err}");
}

#[test]
fn a_loadtest_whose_every_request_failed_exits_1_with_its_report() {
    let d = scratch("allfail");
    // BERT with no token types: every request's embedding lookup fails (an index error).
    let m = config(&d, "bt", "bert-tiny", &[("type_vocab_size", 0.into())]);
    let (code, _, err) = run_in(
        &d,
        &[
            "loadtest", "--model", &m, "--device", "cpu", "-n", "3", "--quiet", "--out", "o",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no request succeeded: 0 of 3"), "{err}");
    assert!(d.join("o/results.json").is_file());
}

#[test]
fn replay_names_each_rank_file_it_skips() {
    let d = scratch("ranks");
    let traces = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    let Some(one) = std::fs::read_dir(&traces)
        .ok()
        .and_then(|mut rd| rd.find_map(|e| e.ok().map(|e| e.path())))
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
    else {
        eprintln!("no shared traces: skipped");
        return;
    };
    let f = d.join("ranks");
    std::fs::create_dir_all(f.join("dir.pickle")).unwrap();
    std::fs::copy(&one, f.join("rank0.pickle")).unwrap();
    mkfifo(&f.join("rank1.pickle"));
    std::os::unix::fs::symlink("loop.pickle", f.join("loop.pickle")).unwrap();
    let (code, _, err) = run_in(&d, &["replay", f.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    for (name, why) in [
        ("dir.pickle", "a folder"),
        ("rank1.pickle", "a FIFO"),
        ("loop.pickle", "a symlink loop"),
    ] {
        assert!(err.contains(name) && err.contains(why), "{name}: {err}");
    }
}

/// `vramroom predict --json | true`: the reader is gone before the first write. The command
/// ends as `cat` does (SIGPIPE, quietly), not with a panic about a broken pipe.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    // The pipe's reader is closed before the command starts: with a reader that closed
    // after the spawn, a fast command could fill the pipe's buffer first and exit 0.
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    unsafe { libc::close(fds[0]) };
    let writer = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    let child = Command::new(env!("CARGO_BIN_EXE_vramroom"))
        .args(["predict", "--json"])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {err}",
        out.status
    );
}
