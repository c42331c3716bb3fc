//! `vramroom replay r0.pickle r1.pickle …` (or a folder of them): one row per rank, the
//! imbalance, and each rank's minimum capacity. The replay itself is `vramroom_trace::ranks`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use vramroom_alloc::size::human_bytes;
use vramroom_alloc::AllocatorConfig;
use vramroom_trace::ranks::{rank_table, RankOptions, RankTable};
use vramroom_trace::Snapshot;

use crate::error::UserError;
use crate::table::{cell, print_rows};

/// Why a `.pickle` entry of a folder is not a snapshot to read, or `None` for a regular
/// file (a symlink to one included).
fn not_a_snapshot(f: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(f) {
        Ok(m) if m.is_file() => None,
        Ok(m) if m.is_dir() => Some("a folder".into()),
        Ok(m) if m.file_type().is_fifo() => Some("a FIFO".into()),
        Ok(m) if m.file_type().is_socket() => Some("a socket".into()),
        Ok(_) => Some("a device".into()),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Some("a symlink loop".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("a dangling symlink".into()),
        Err(e) => Some(e.to_string()),
    }
}

/// The `.pickle` snapshots of folder `p`, sorted, and the `.pickle` entries skipped with
/// why: nothing in a rank folder is dropped without being named.
pub fn scan_folder(p: &Path) -> Result<(Vec<PathBuf>, Vec<(PathBuf, String)>), UserError> {
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for e in std::fs::read_dir(p).with_context(|| format!("cannot read folder {}", p.display()))? {
        let f = match e {
            Ok(e) => e.path(),
            Err(e) => {
                skipped.push((p.to_path_buf(), format!("an entry could not be read: {e}")));
                continue;
            }
        };
        if !f.extension().is_some_and(|e| e == "pickle") {
            continue;
        }
        match not_a_snapshot(&f) {
            None => files.push(f),
            Some(why) => skipped.push((f, why)),
        }
    }
    files.sort_by_key(|f| natural_key(f));
    skipped.sort();
    Ok((files, skipped))
}

/// The snapshots named on the command line, a folder standing for the `.pickle` files in it
/// (sorted, so `rank0 … rank10` come in the order a user lists them). Entries of a folder
/// that are not files (FIFOs, folders, symlink loops) are skipped, each named on stderr.
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, UserError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let (files, skipped) = scan_folder(p)?;
            for (f, why) in &skipped {
                eprintln!("skipped {}: {why}, not a snapshot file", f.display());
            }
            if files.is_empty() {
                return Err(anyhow::anyhow!(
                    "folder {} holds no .pickle snapshots{}",
                    p.display(),
                    if skipped.is_empty() {
                        String::new()
                    } else {
                        format!(" ({} skipped: not files)", skipped.len())
                    }
                )
                .into());
            }
            out.extend(files);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// `rank10` after `rank9`: runs of digits compare as numbers.
fn natural_key(p: &Path) -> Vec<(String, u64)> {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut digits = c.to_string();
            while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                digits.push(*d);
                chars.next();
            }
            key.push((
                std::mem::take(&mut text),
                digits.parse().unwrap_or(u64::MAX),
            ));
        } else {
            text.push(c);
        }
    }
    key.push((text, 0));
    key
}

/// What the rank table needs from `vramroom replay`'s flags.
pub struct RankArgs<'a> {
    pub configs: Vec<(String, AllocatorConfig)>,
    pub capacity: Option<u64>,
    pub min_capacity: bool,
    pub json: bool,
    pub files: &'a [PathBuf],
}

pub fn run(
    a: RankArgs,
    load: impl Fn(&Path) -> Result<Snapshot, UserError>,
) -> Result<ExitCode, UserError> {
    let snaps: Vec<(String, Snapshot)> = a
        .files
        .iter()
        .map(|p| {
            Ok((
                p.file_name().map_or_else(
                    || p.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                ),
                load(p)?,
            ))
        })
        .collect::<Result<_, UserError>>()?;
    let named: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    // No --alloc-conf: each rank under its own recorded config (one table).
    let configs: Vec<(String, Option<AllocatorConfig>)> = if a.configs.is_empty() {
        vec![("each rank's own".into(), None)]
    } else {
        a.configs.into_iter().map(|(l, c)| (l, Some(c))).collect()
    };
    let bar = (a.min_capacity && !a.json)
        .then(|| crate::progress::spinner("searching for each rank's minimum capacity"));
    let mut tables = Vec::new();
    for (label, config) in configs {
        let opts = RankOptions {
            config,
            capacity: a.capacity,
            min_capacity: a.min_capacity,
        };
        tables.push((label, rank_table(&named, &opts)?));
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if a.json {
        let v: Vec<serde_json::Value> = tables
            .iter()
            .map(|(l, t)| {
                let mut v = serde_json::to_value(t).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("config".into(), l.clone().into());
                }
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        for (i, (l, t)) in tables.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print_table(l, t);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(label: &str, t: &RankTable) {
    println!("{} ranks under {}", t.rows.len(), cell(label));
    let has_min = t.min_capacity_bytes.is_some();
    let mut header = vec![
        "rank",
        "device",
        "events",
        "peak allocated",
        "peak reserved",
        "vs mean",
        "OOMs",
    ];
    if has_min {
        header.push("min capacity");
    }
    let mean = t.mean_peak_reserved();
    let rows: Vec<Vec<String>> = t
        .rows
        .iter()
        .map(|r| {
            let mut row = vec![
                cell(&r.rank),
                r.device.to_string(),
                r.events.to_string(),
                human_bytes(r.peak_allocated_bytes),
                human_bytes(r.peak_reserved_bytes),
                if mean > 0.0 {
                    format!("{:.2}x", r.peak_reserved_bytes as f64 / mean)
                } else {
                    "-".into()
                },
                if r.oom {
                    format!("{} (stopped)", r.num_ooms.max(1))
                } else {
                    r.num_ooms.to_string()
                },
            ];
            if has_min {
                row.push(
                    r.min_capacity_bytes
                        .map(human_bytes)
                        .unwrap_or_else(|| "-".into()),
                );
            }
            row
        })
        .collect();
    print_rows(&header, &rows);
    if let Some(w) = t.rows.get(t.worst) {
        println!(
            "imbalance: the highest rank ({} device {}) reserves {:.2}x the mean; an OOM there stops every rank",
            cell(&w.rank),
            w.device,
            t.imbalance
        );
    }
    if let Some(m) = t.min_capacity_bytes {
        println!("every rank fits a GPU of {} ({} bytes)", human_bytes(m), m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_sort_by_number() {
        let mut v: Vec<PathBuf> = ["r10.pickle", "r2.pickle", "r1.pickle"]
            .iter()
            .map(PathBuf::from)
            .collect();
        v.sort_by_key(|f| natural_key(f));
        assert_eq!(
            v,
            ["r1.pickle", "r2.pickle", "r10.pickle"]
                .iter()
                .map(PathBuf::from)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn folder_entries_that_are_not_files_are_named() {
        let d = std::env::temp_dir().join(format!("vramroom-ranks-skip-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("dir.pickle")).unwrap();
        std::fs::write(d.join("r0.pickle"), b"x").unwrap();
        std::os::unix::fs::symlink("loop.pickle", d.join("loop.pickle")).unwrap();
        let c = std::ffi::CString::new(d.join("fifo.pickle").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let Ok((files, skipped)) = scan_folder(&d) else {
            panic!("scan_folder failed")
        };
        assert_eq!(files, vec![d.join("r0.pickle")]);
        let why: Vec<(String, &str)> = skipped
            .iter()
            .map(|(f, w)| {
                (
                    f.file_name().unwrap().to_string_lossy().into_owned(),
                    w.as_str(),
                )
            })
            .collect();
        assert_eq!(
            why,
            vec![
                ("dir.pickle".into(), "a folder"),
                ("fifo.pickle".into(), "a FIFO"),
                ("loop.pickle".into(), "a symlink loop"),
            ]
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
