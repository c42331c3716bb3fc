//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `/work/shared` in the dev container: the repository's sibling `shared/` folder.
pub fn shared_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
}

/// The six recorded traces plus the golden dump, or `None` (with a note) when the shared
/// folder is not there, e.g. in a bare checkout.
pub fn shared_pickles() -> Option<Vec<PathBuf>> {
    let dir = shared_dir();
    if !dir.is_dir() {
        eprintln!("skipping: {} not found", dir.display());
        return None;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("traces"))
        .expect("shared/traces is readable")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 6, "expected six traces in shared/traces");
    files.push(dir.join("spec/golden/dump.pickle"));
    Some(files)
}

/// A scratch directory unique to this test process and `tag`.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vramroom-trace-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Runs `python3 -c script args…`; `None` when there is no python3 at all.
pub fn python(script: &str, args: &[&Path]) -> Option<String> {
    let out = match Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
    {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("skipping: python3 not found");
            return None;
        }
        Err(e) => panic!("running python3: {e}"),
    };
    assert!(
        out.status.success(),
        "python3 failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}
