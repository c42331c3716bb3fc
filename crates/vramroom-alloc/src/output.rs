//! Writing output files without losing or replacing what the user had.
//!
//! Design note: every file Vramroom writes (snapshots, RMM logs, reports, results) goes
//! through [`write_file`], and every command checks its outputs with [`probe_dir`] or
//! [`probe_file`] *before* its work starts, so a read-only folder is reported in the first
//! second, not after a ten-minute load test whose measurements would then be lost.
//!
//! The rules of [`write_file`]:
//! * a regular file (or a name that does not exist yet) is written atomically: a temporary
//!   file in the same folder, flushed, given the old file's permissions, then renamed over
//!   the target. A crash or a full disk never leaves a partial file;
//! * a symlink is followed (to any depth, cycles refused) and the rule applies to its
//!   final target: the link stays a link and its target gets the bytes;
//! * an existing file that is not a regular file (a character device such as `/dev/null`
//!   or `/dev/full`, a FIFO, a socket) is never replaced: the bytes are written into it.
//!   Renaming over `/dev/full` as root would have destroyed the device node. A FIFO with
//!   no reader is waited for at most [`FIFO_WAIT`], then refused, instead of hanging;
//! * a folder is refused.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long [`write_file`] waits for a reader to open a FIFO before giving up.
pub const FIFO_WAIT: Duration = Duration::from_secs(10);
/// Symlink hops [`resolve`] follows before calling it a loop (Linux's own limit is 40).
const MAX_LINK_HOPS: usize = 40;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique name in `dir` for a temporary or probe file: pid + a process-wide counter, so
/// two writers, in one process or two, never share one.
fn unique(dir: &Path, stem: &str, kind: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{stem}.{}.{n}.{kind}", std::process::id()))
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `path` with every symlink in its last component followed: the file the bytes are for.
/// A dangling link resolves to the path it points at (the file is then created there).
pub fn resolve(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINK_HOPS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&p)?;
                p = if target.is_absolute() {
                    target
                } else {
                    parent_of(&p).join(target)
                };
            }
            _ => return Ok(p),
        }
    }
    Err(io::Error::other(format!(
        "{}: too many levels of symbolic links",
        path.display()
    )))
}

/// What is at a (resolved) path now.
enum Existing {
    Nothing,
    Regular(fs::Permissions),
    Folder,
    /// A device, FIFO or socket: written into, never replaced.
    Special,
}

fn existing(p: &Path) -> io::Result<Existing> {
    match fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(Existing::Regular(m.permissions())),
        Ok(m) if m.is_dir() => Ok(Existing::Folder),
        Ok(_) => Ok(Existing::Special),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Existing::Nothing),
        Err(e) => Err(e),
    }
}

fn is_a_folder(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is a folder, not a file", p.display()),
    )
}

/// Writes `bytes` to `path` by the rules of the module docs. On error nothing the user had
/// is changed (a special file may have received part of the bytes, as with any write).
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let target = resolve(path)?;
    match existing(&target)? {
        Existing::Folder => Err(is_a_folder(&target)),
        Existing::Special => write_into(&target, bytes),
        Existing::Regular(perm) => write_atomic(&target, bytes, Some(perm)),
        Existing::Nothing => write_atomic(&target, bytes, None),
    }
}

/// A temporary file beside `target`, flushed, then renamed over it.
fn write_atomic(target: &Path, bytes: &[u8], perm: Option<fs::Permissions>) -> io::Result<()> {
    let dir = parent_of(target);
    let stem = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let tmp = unique(&dir, &stem, "tmp");
    let res = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if let Some(p) = perm {
            // the replaced file's mode, not the umask's: a 0600 results file stays 0600
            f.set_permissions(p)?;
        }
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, target)
    })();
    if res.is_err() {
        // best effort: the first error is the one worth reporting
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Write into an existing device, FIFO or socket without truncating or replacing it.
#[cfg(unix)]
fn write_into(target: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = open_special(target)?;
    f.write_all(bytes)?;
    f.flush()
}

#[cfg(not(unix))]
fn write_into(target: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(target)?;
    f.write_all(bytes)?;
    f.flush()
}

/// Opens a special file for writing. A FIFO is opened non-blocking first, because a plain
/// open blocks until a reader comes, possibly forever; once open it is switched back to
/// blocking writes.
#[cfg(unix)]
fn open_special(target: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    let fifo = fs::metadata(target)?.file_type().is_fifo();
    if !fifo {
        return fs::OpenOptions::new().write(true).open(target);
    }
    let start = Instant::now();
    loop {
        match fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(target)
        {
            Ok(f) => {
                // SAFETY: fcntl on a descriptor we own; only the O_NONBLOCK flag changes.
                unsafe {
                    let fd = f.as_raw_fd();
                    let flags = libc::fcntl(fd, libc::F_GETFL);
                    if flags >= 0 {
                        libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
                    }
                }
                return Ok(f);
            }
            // ENXIO: no reader has the FIFO open yet
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) && start.elapsed() < FIFO_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is a FIFO and nothing read it for {} s",
                        target.display(),
                        FIFO_WAIT.as_secs()
                    ),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Checks, before any work, that files can later be written into folder `dir`: creates it
/// (and its parents) when missing, then creates and removes a probe file in it. Returns
/// the folders it created, outermost first, for [`remove_created`] when the work then
/// fails before writing anything.
pub fn probe_dir(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let dir = resolve(dir)?;
    match existing(&dir)? {
        Existing::Folder | Existing::Nothing => {}
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} exists and is not a folder", dir.display()),
            ))
        }
    }
    let mut missing: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .map(Path::to_path_buf)
        .collect();
    missing.reverse();
    fs::create_dir_all(&dir)?;
    if let Err(e) = probe_in(&dir) {
        remove_created(&missing);
        return Err(e);
    }
    Ok(missing)
}

/// Removes folders [`probe_dir`] created, innermost first, as long as they are empty.
pub fn remove_created(created: &[PathBuf]) {
    for d in created.iter().rev() {
        if fs::remove_dir(d).is_err() {
            break;
        }
    }
}

fn probe_in(dir: &Path) -> io::Result<()> {
    let probe = unique(dir, "vramroom-probe", "probe");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    let res = f.write_all(b"probe").and_then(|_| f.sync_all());
    drop(f);
    let rm = fs::remove_file(&probe);
    res.and(rm)
}

/// Checks, before any work, that [`write_file`] will be able to write `path`: a folder is
/// refused; a device, FIFO or socket must be writable by this user (nothing is written to
/// it now: a probe would consume a FIFO's reader or fill a device); otherwise its folder
/// must exist and take a probe file (which is removed).
pub fn probe_file(path: &Path) -> io::Result<()> {
    let target = resolve(path)?;
    match existing(&target)? {
        Existing::Folder => Err(is_a_folder(&target)),
        Existing::Special => writable_special(&target),
        Existing::Regular(_) | Existing::Nothing => {
            let dir = parent_of(&target);
            match existing(&dir)? {
                Existing::Folder => probe_in(&dir),
                Existing::Nothing => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("folder {} does not exist", dir.display()),
                )),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a folder", dir.display()),
                )),
            }
        }
    }
}

#[cfg(unix)]
fn writable_special(p: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    // SAFETY: a valid NUL-terminated path; access() only reads it.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn writable_special(_p: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vramroom-output-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn leftovers(d: &Path) -> Vec<String> {
        fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp") || n.ends_with(".probe"))
            .collect()
    }

    #[test]
    fn regular_files_are_replaced_atomically_keeping_their_mode() {
        let d = tmp("regular");
        let p = d.join("out.json");
        write_file(&p, b"one").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
            write_file(&p, b"two").unwrap();
            assert_eq!(
                fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert!(leftovers(&d).is_empty());
        // a folder is refused and left alone
        let e = write_file(&d, b"x").unwrap_err();
        assert!(e.to_string().contains("is a folder"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_stay_links_and_their_target_gets_the_bytes() {
        let d = tmp("symlink");
        let real = d.join("real.pickle");
        fs::write(&real, b"old").unwrap();
        let link = d.join("link.pickle");
        std::os::unix::fs::symlink("real.pickle", &link).unwrap();
        let link2 = d.join("link2.pickle");
        std::os::unix::fs::symlink(&link, &link2).unwrap();
        write_file(&link2, b"new").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(fs::symlink_metadata(&link2)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&real).unwrap(), b"new");
        // dangling: the file is created where the link points
        let dangling = d.join("dangling");
        std::os::unix::fs::symlink("made.txt", &dangling).unwrap();
        write_file(&dangling, b"made").unwrap();
        assert_eq!(fs::read(d.join("made.txt")).unwrap(), b"made");
        // a loop is an error, not a hang
        let a = d.join("a");
        let b = d.join("b");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(write_file(&a, b"x").is_err());
        assert!(leftovers(&d).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn devices_are_written_into_never_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let null = Path::new("/dev/null");
        if null.exists() {
            write_file(null, b"bytes").unwrap();
            assert!(fs::metadata(null).unwrap().file_type().is_char_device());
            probe_file(null).unwrap();
        }
        let full = Path::new("/dev/full");
        if full.exists() {
            let e = write_file(full, b"bytes").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            assert!(fs::metadata(full).unwrap().file_type().is_char_device());
            // through a link too
            let d = tmp("devlink");
            let link = d.join("full");
            std::os::unix::fs::symlink(full, &link).unwrap();
            assert!(write_file(&link, b"bytes").is_err());
            assert!(fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink());
            assert!(leftovers(&d).is_empty());
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_gets_the_bytes_and_stays_a_fifo() {
        use std::os::unix::fs::FileTypeExt;
        let d = tmp("fifo");
        let p = d.join("pipe");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        probe_file(&p).unwrap();
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || fs::read(&p).unwrap())
        };
        let payload = vec![7u8; 300_000]; // more than a pipe buffer: blocking writes
        write_file(&p, &payload).unwrap();
        assert_eq!(reader.join().unwrap(), payload);
        assert!(fs::metadata(&p).unwrap().file_type().is_fifo());
        assert!(leftovers(&d).is_empty());
    }

    #[test]
    fn probes_find_unwritable_places_before_the_work() {
        let d = tmp("probe");
        // created when missing, parents included, and left without a probe file
        let out = d.join("a/b/c");
        let created = probe_dir(&out).unwrap();
        assert_eq!(created, vec![d.join("a"), d.join("a/b"), out.clone()]);
        assert!(out.is_dir());
        assert!(leftovers(&out).is_empty());
        // and taken back when the work fails before writing
        remove_created(&created);
        assert!(!d.join("a").exists());
        assert!(probe_dir(&d).unwrap().is_empty());
        // a folder that exists but takes no file (procfs refuses even root)
        #[cfg(target_os = "linux")]
        {
            let e = probe_dir(Path::new("/proc/self")).unwrap_err();
            assert!(e.raw_os_error().is_some(), "{e}");
        }
        // a file where a folder should be
        let f = d.join("file");
        fs::write(&f, b"x").unwrap();
        assert!(probe_dir(&f).is_err());
        assert!(probe_file(&d).is_err());
        // a file in a folder that does not exist
        let e = probe_file(&d.join("nope/out.pickle")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        probe_file(&d.join("out.pickle")).unwrap();
        assert!(!d.join("out.pickle").exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let ro = d.join("ro");
            fs::create_dir(&ro).unwrap();
            fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
            // root writes anywhere; the check is only meaningful for other users
            let root = unsafe { libc::geteuid() } == 0;
            if !root {
                assert!(probe_dir(&ro).is_err());
                assert!(probe_file(&ro.join("x")).is_err());
            }
            fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
}
