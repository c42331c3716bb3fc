//! Reading input files with a bound: the twin of [`crate::output`].
//!
//! Design note: every file Vramroom reads whole (a `config.json`, a results JSON for
//! `diff`, `http --body-file`, `--predicted-from`, `bench --reference`) goes through
//! [`read_file`] with a limit fitted to what the file is ([`Limit`]), so `/dev/zero`, a 1 GB
//! JSON array or a FIFO end in an error that names the file, never in a read that grows
//! until the kernel kills the process or blocks start-up forever. The rules:
//! * the path is opened with `O_NONBLOCK`, so opening a FIFO that has no writer returns at
//!   once (a plain open would wait for a writer forever); the flag is then cleared and the
//!   file's type checked on the open descriptor (no race with a rename);
//! * a folder, a socket or a block device is refused by name; a FIFO or a character device
//!   (process substitution `<(...)`, `/dev/stdin`) is read, with the same bound: with no
//!   writer a FIFO reads as empty;
//! * at most `limit` bytes are read: one byte more is an error saying which limit was hit
//!   and, where one exists, the flag that raises it.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The most a file of one kind may hold, and how to raise it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// What the file is, for messages ("config.json", "results JSON").
    pub what: &'static str,
    pub bytes: u64,
    /// The flag (or variable) that raises it, when a real input can be larger.
    pub raise: Option<&'static str>,
}

impl Limit {
    /// A Hugging Face `config.json` (real ones are a few KiB).
    pub const CONFIG: Limit = Limit {
        what: "config.json",
        bytes: 16 << 20,
        raise: None,
    };
    /// A results JSON or report that a Vramroom command wrote (`diff`, `--predicted-from`,
    /// `bench --reference`).
    pub const RESULTS: Limit = Limit {
        what: "results JSON",
        bytes: 256 << 20,
        raise: None,
    };
    /// An RMM CSV log replayed as a trace.
    pub const RMM_LOG: Limit = Limit {
        what: "RMM log",
        bytes: 512 << 20,
        raise: None,
    };
    /// A request body for `http --body-file`.
    pub const BODY: Limit = Limit {
        what: "request body",
        bytes: 64 << 20,
        raise: None,
    };
}

/// Why a bounded read failed.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: is {kind}, not a file")]
    NotAFile { path: String, kind: &'static str },
    #[error("{path}: larger than the {limit} a {what} may have{raise}")]
    TooLarge {
        path: String,
        what: &'static str,
        limit: String,
        raise: String,
    },
    #[error("{path}: not UTF-8 text")]
    NotUtf8 { path: String },
}

/// What kind of file a file type is, when it is not a regular one.
#[cfg(unix)]
fn special_kind(ft: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        Some("a folder")
    } else if ft.is_socket() {
        Some("a socket")
    } else if ft.is_block_device() {
        Some("a block device")
    } else {
        None
    }
}

#[cfg(not(unix))]
fn special_kind(ft: std::fs::FileType) -> Option<&'static str> {
    ft.is_dir().then_some("a folder")
}

/// Opens `path` for reading without blocking on a FIFO that has no writer.
pub fn open_nonblocking(path: &Path) -> io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        // Reads block again (a FIFO whose writer is slow is waited for, not read as empty).
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let fd = f.as_raw_fd();
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl >= 0 {
                libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
            }
        }
        Ok(f)
    }
    #[cfg(not(unix))]
    {
        File::open(path)
    }
}

/// Reads at most `r`'s first `limit.bytes` bytes; more is [`InputError::TooLarge`].
pub fn read_bounded(r: impl Read, limit: Limit, path: &str) -> Result<Vec<u8>, InputError> {
    let mut buf = Vec::new();
    r.take(limit.bytes.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|source| InputError::Io {
            path: path.into(),
            source,
        })?;
    if buf.len() as u64 > limit.bytes {
        return Err(too_large(limit, path));
    }
    Ok(buf)
}

/// The error for a body or file past `limit`.
pub fn too_large(limit: Limit, path: &str) -> InputError {
    InputError::TooLarge {
        path: path.into(),
        what: limit.what,
        limit: crate::size::human_bytes(limit.bytes),
        raise: limit
            .raise
            .map(|f| format!(" (raise it with {f})"))
            .unwrap_or_default(),
    }
}

/// The bytes of `path`, within `limit` (see the module note).
pub fn read_file(path: &Path, limit: Limit) -> Result<Vec<u8>, InputError> {
    let shown = path.display().to_string();
    let io = |source| InputError::Io {
        path: shown.clone(),
        source,
    };
    let f = open_nonblocking(path).map_err(io)?;
    let ft = f.metadata().map_err(io)?.file_type();
    if let Some(kind) = special_kind(ft) {
        return Err(InputError::NotAFile { path: shown, kind });
    }
    read_bounded(f, limit, &shown)
}

/// [`read_file`] as UTF-8 text.
pub fn read_text(path: &Path, limit: Limit) -> Result<String, InputError> {
    let b = read_file(path, limit)?;
    String::from_utf8(b).map_err(|_| InputError::NotUtf8 {
        path: path.display().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("vramroom-input-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const SMALL: Limit = Limit {
        what: "test file",
        bytes: 10,
        raise: Some("--max-test"),
    };

    #[test]
    fn reads_within_the_limit_and_refuses_past_it() {
        let d = tmp("limit");
        let p = d.join("a");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_file(&p, SMALL).unwrap(), b"0123456789");
        std::fs::write(&p, b"0123456789x").unwrap();
        let e = read_file(&p, SMALL).unwrap_err().to_string();
        assert!(e.contains("10 B") && e.contains("--max-test"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn dev_zero_is_bounded_and_a_folder_refused() {
        let e = read_file(Path::new("/dev/zero"), SMALL).unwrap_err();
        assert!(matches!(e, InputError::TooLarge { .. }), "{e}");
        let e = read_file(&std::env::temp_dir(), SMALL).unwrap_err();
        assert!(e.to_string().contains("a folder"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn fifo_without_a_writer_does_not_block() {
        let d = tmp("fifo");
        let p = d.join("config.json");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = Instant::now();
        assert_eq!(read_file(&p, SMALL).unwrap(), b"");
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
