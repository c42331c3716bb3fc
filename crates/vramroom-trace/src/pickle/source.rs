//! The bytes of a pickle, read as the decoder asks for them.
//!
//! Design note: snapshots reach hundreds of megabytes, and the decoder only ever looks at
//! the next few bytes, so the input is streamed through one fixed buffer instead of being
//! read whole: a file is never held in memory next to what is decoded from it. Three rules
//! keep hostile input cheap:
//!
//! * Nothing is allocated from a length field. A string argument of length `n` is gathered
//!   as its bytes arrive, so a `BINUNICODE8` that claims 2^62 bytes fails at end of input
//!   having allocated only what was really there.
//! * The whole input is capped at [`MAX_INPUT_BYTES`]; an endless stream (a pipe, a device
//!   file) stops there with an error that names the limit. `/dev/zero` stops at once: its
//!   first byte, 0x00, is not an opcode.
//! * Positions are input offsets, so every error can say at which byte it happened.
//!
//! In-memory bytes go through the same path (`&[u8]` is a reader); the extra copy into
//! the buffer costs well under a millisecond per 10 MB.

use std::io::{ErrorKind, Read};
use std::path::PathBuf;

use super::MAX_INPUT_BYTES;
use crate::error::TraceError;

/// Buffer size: large enough that refills are rare, small enough to be noise in RSS.
const BUF: usize = 64 << 10;

/// A format error at input offset `at` (the opcode being decoded).
pub(super) fn bad(at: u64, what: impl std::fmt::Display) -> TraceError {
    TraceError::Pickle(format!("{what} (opcode at byte {at})"))
}

pub(super) struct Source<R> {
    reader: R,
    /// Where read errors are reported (empty for in-memory input).
    path: PathBuf,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// Input offset of `buf[0]`.
    base: u64,
    eof: bool,
}

impl<R: Read> Source<R> {
    pub(super) fn new(reader: R, path: PathBuf) -> Self {
        Source {
            reader,
            path,
            buf: vec![0; BUF].into_boxed_slice(),
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
        }
    }

    /// Input offset of the next byte.
    #[inline]
    pub(super) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Tries to have at least `want` (at most [`BUF`]) bytes buffered; returns how many
    /// are. Fewer only at end of input.
    #[cold]
    fn fill(&mut self, want: usize) -> Result<usize, TraceError> {
        let want = want.min(BUF);
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        while self.end < want && !self.eof {
            let Some(space) = self.buf.get_mut(self.end..) else {
                break;
            };
            match self.reader.read(space) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.end += n;
                    if self.base + self.end as u64 > MAX_INPUT_BYTES {
                        return Err(TraceError::Pickle(format!(
                            "input is larger than the {} GiB limit on snapshot files",
                            MAX_INPUT_BYTES >> 30
                        )));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(TraceError::Io {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        }
        Ok(self.end)
    }

    /// What is buffered after the next byte, for a caller that decodes straight from it
    /// (then [`Self::consume`] what it used). May be empty.
    #[inline]
    pub(super) fn buffered(&self) -> &[u8] {
        self.buf.get(self.pos..self.end).unwrap_or(&[])
    }

    /// Marks `n` bytes of [`Self::buffered`] as read.
    #[inline]
    pub(super) fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }

    /// The next byte, or `None` at end of input.
    #[inline]
    pub(super) fn byte(&mut self) -> Result<Option<u8>, TraceError> {
        if self.pos == self.end && self.fill(1)? == 0 {
            return Ok(None);
        }
        let b = self.buf.get(self.pos).copied();
        self.pos += 1;
        Ok(b)
    }

    /// `N` bytes of an argument of the opcode at `at`.
    #[inline]
    pub(super) fn array<const N: usize>(&mut self, at: u64) -> Result<[u8; N], TraceError> {
        if self.end - self.pos < N && self.fill(N)? < N {
            return Err(self.truncated(N, at));
        }
        let mut out = [0u8; N];
        if let Some(src) = self.buf.get(self.pos..self.pos + N) {
            out.copy_from_slice(src);
        }
        self.pos += N;
        Ok(out)
    }

    #[inline]
    pub(super) fn u8(&mut self, at: u64) -> Result<u8, TraceError> {
        Ok(self.array::<1>(at)?[0])
    }

    fn truncated(&self, n: usize, at: u64) -> TraceError {
        bad(
            at,
            format_args!(
                "truncated: argument needs {n} bytes, {} left",
                self.end - self.pos
            ),
        )
    }

    /// The next `n` bytes, handed to `f`: borrowed from the buffer when they fit in it,
    /// otherwise gathered into `scratch` as they arrive (never reserved from `n`).
    pub(super) fn bytes<T>(
        &mut self,
        n: usize,
        at: u64,
        scratch: &mut Vec<u8>,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, TraceError> {
        if n <= BUF {
            if self.end - self.pos < n && self.fill(n)? < n {
                return Err(self.truncated(n, at));
            }
            let out = f(self.buf.get(self.pos..self.pos + n).unwrap_or(&[]));
            self.pos += n;
            return Ok(out);
        }
        scratch.clear();
        while scratch.len() < n {
            if self.pos == self.end && self.fill(BUF)? == 0 {
                return Err(bad(
                    at,
                    format_args!(
                        "truncated: argument needs {n} bytes, {} left",
                        scratch.len()
                    ),
                ));
            }
            let take = (n - scratch.len()).min(self.end - self.pos);
            scratch.extend_from_slice(self.buf.get(self.pos..self.pos + take).unwrap_or(&[]));
            self.pos += take;
        }
        Ok(f(scratch))
    }

    /// Reads past `n` bytes without keeping them.
    pub(super) fn skip(&mut self, n: usize, at: u64) -> Result<(), TraceError> {
        let mut left = n;
        while left > 0 {
            if self.pos == self.end && self.fill(BUF)? == 0 {
                return Err(bad(
                    at,
                    format_args!("truncated: argument needs {n} bytes, {} left", n - left),
                ));
            }
            let take = left.min(self.end - self.pos);
            self.pos += take;
            left -= take;
        }
        Ok(())
    }

    /// A newline-terminated argument into `out`, without the newline (and a `\r` before
    /// it). Longer than `max` bytes is an error, found without reading further.
    pub(super) fn line(
        &mut self,
        at: u64,
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), TraceError> {
        out.clear();
        loop {
            if self.pos == self.end && self.fill(BUF)? == 0 {
                return Err(bad(at, "truncated: text argument without newline"));
            }
            let avail = self.buf.get(self.pos..self.end).unwrap_or(&[]);
            let (chunk, found) = match avail.iter().position(|&b| b == b'\n') {
                Some(nl) => (avail.get(..nl).unwrap_or(&[]), true),
                None => (avail, false),
            };
            if out.len() + chunk.len() > max {
                return Err(bad(
                    at,
                    format_args!("text argument is too long (over {max} bytes)"),
                ));
            }
            out.extend_from_slice(chunk);
            self.pos += chunk.len() + usize::from(found);
            if found {
                if out.last() == Some(&b'\r') {
                    out.pop();
                }
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes a call, to cross buffer refills.
    struct Trickle<'a>(&'a [u8], usize);
    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(out.len()).min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn arguments_cross_refills() {
        let mut data = vec![7u8; BUF - 1];
        data.extend(0x0102_0304u32.to_le_bytes());
        let mut s = Source::new(Trickle(&data, 1000), PathBuf::new());
        let mut scratch = Vec::new();
        s.bytes(BUF - 1, 0, &mut scratch, |b| {
            assert!(b.iter().all(|&x| x == 7))
        })
        .unwrap();
        assert_eq!(s.array::<4>(0).unwrap(), 0x0102_0304u32.to_le_bytes());
        assert_eq!(s.offset(), data.len() as u64);
        assert_eq!(s.byte().unwrap(), None);
    }

    #[test]
    fn long_arguments_are_gathered_and_truncation_is_reported() {
        let data = vec![b'x'; 3 * BUF + 5];
        let mut s = Source::new(Trickle(&data, 7000), PathBuf::new());
        let mut scratch = Vec::new();
        let n = s.bytes(3 * BUF, 0, &mut scratch, |b| b.len()).unwrap();
        assert_eq!(n, 3 * BUF);
        let err = s.bytes(1 << 40, 9, &mut scratch, |b| b.len()).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        assert!(scratch.capacity() <= 4 * BUF, "grew only with the data");
    }

    #[test]
    fn lines_stop_at_newline_and_at_the_limit() {
        let mut s = Source::new(&b"12\r\nabc"[..], PathBuf::new());
        let mut out = Vec::new();
        s.line(0, 10, &mut out).unwrap();
        assert_eq!(out, b"12");
        let err = s.line(4, 10, &mut out).unwrap_err();
        assert!(err.to_string().contains("without newline"), "{err}");
        let mut s = Source::new(&b"123456789\n"[..], PathBuf::new());
        let err = s.line(0, 4, &mut out).unwrap_err();
        assert!(err.to_string().contains("too long"), "{err}");
    }

    #[test]
    fn endless_input_stops_at_the_cap() {
        struct Ones;
        impl Read for Ones {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                out.fill(b'1');
                Ok(out.len())
            }
        }
        // skip to just below the cap instead of reading 8 GiB
        let mut s = Source::new(Ones, PathBuf::new());
        s.base = MAX_INPUT_BYTES - 10;
        let mut out = Vec::new();
        let err = s.line(0, usize::MAX, &mut out).unwrap_err();
        assert!(err.to_string().contains("8 GiB limit"), "{err}");
    }
}
