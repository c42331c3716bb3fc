//! `vramroom replay` over several ranks: files, a folder, JSON, and flags that need one.

use std::path::PathBuf;
use std::process::Command;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/snapshots")
}

fn vramroom(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vramroom"))
        .args(args)
        .output()
        .expect("vramroom runs")
}

#[test]
fn a_folder_of_ranks_gives_one_row_per_rank_and_the_same_numbers_as_the_files() {
    let dir = std::env::temp_dir().join(format!("vramroom-ranks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for r in [0, 1] {
        let name = format!("ddp_gloo_2rank__default.rank{r}.pickle");
        std::fs::copy(fixtures().join(&name), dir.join(&name)).unwrap();
        files.push(fixtures().join(&name));
    }
    let json = |args: Vec<&std::ffi::OsStr>| -> serde_json::Value {
        let mut a = args;
        a.push("--json".as_ref());
        let out = vramroom(&a);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let from_dir = json(vec!["replay".as_ref(), dir.as_os_str()]);
    let from_files = json(vec![
        "replay".as_ref(),
        files[0].as_os_str(),
        files[1].as_os_str(),
    ]);
    assert_eq!(from_dir, from_files);
    let rows = from_dir[0]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0]["rank"].as_str().unwrap().contains("rank0"));
    // each row is the single-snapshot replay of that rank
    for (row, f) in rows.iter().zip(&files) {
        let single = json(vec!["replay".as_ref(), f.as_os_str()]);
        assert_eq!(row["peak_reserved_bytes"], single[0]["peak_reserved_bytes"]);
        assert_eq!(
            row["peak_allocated_bytes"],
            single[0]["peak_allocated_bytes"]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flags_for_one_snapshot_are_refused_with_several() {
    let f0 = fixtures().join("ddp_gloo_2rank__default.rank0.pickle");
    let f1 = fixtures().join("ddp_gloo_2rank__default.rank1.pickle");
    let out = vramroom(&[
        "replay".as_ref(),
        f0.as_os_str(),
        f1.as_os_str(),
        "--recommend".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--recommend takes one snapshot"));
    let empty = std::env::temp_dir().join(format!("vramroom-noranks-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = vramroom(&["replay".as_ref(), empty.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no .pickle"));
    let _ = std::fs::remove_dir_all(&empty);
}
