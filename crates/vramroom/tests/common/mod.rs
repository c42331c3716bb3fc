//! Helpers of the CLI tests that run `vramroom` as a user does: the binary, a fresh folder
//! per test, a run's exit code and output, the files it left.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramroom"))
}

/// A fresh, empty folder for one test, under `group` in the target's temporary folder.
pub fn scratch(group: &str, name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(group)
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `vramroom ARGS` in `dir`: (exit code, stdout, stderr).
pub fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = bin()
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run vramroom");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`run_in`], failing the test when the run takes `limit` or longer.
pub fn run_in_within(dir: &Path, args: &[&str], limit: Duration) -> (i32, String, String) {
    let t = Instant::now();
    let r = run_in(dir, args);
    assert!(t.elapsed() < limit, "{args:?} took {:?}", t.elapsed());
    r
}

/// Every file and folder below `dir`.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                v.push(p.clone());
                v.extend(files_under(&p));
            } else {
                v.push(p);
            }
        }
    }
    v
}

pub fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("results.json")).expect("json")
}

/// A child process killed (and reaped) when the test ends, passing or not.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `vramroom serve ARGS` (with `--port 0` among them) started, and the address it printed
/// on its first line, `listening on http://ADDR`, waited for up to 60 s.
pub fn spawn_serve(args: &[&str]) -> (Killed, String) {
    use std::io::{BufRead, BufReader};
    let child = bin()
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vramroom serve");
    let mut child = Killed(child);
    let stdout = child.0.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the listening line within 60 s");
    let url = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (child, url)
}

/// One raw HTTP/1.1 exchange with `vramroom serve` at `addr` (`req` asks for
/// `Connection: close`): the whole answer, read for at most `read_timeout`.
pub fn http(addr: &str, req: &str, read_timeout: Duration) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(read_timeout)).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the answer");
    out
}

/// `POST /v1/infer` with a JSON `body`, through [`http`].
pub fn post_infer(addr: &str, body: &str, read_timeout: Duration) -> String {
    http(
        addr,
        &format!(
            "POST /v1/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: \
             application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
        read_timeout,
    )
}
