//! Request bodies: a template with placeholders, a file, a folder of files, or filler of a
//! size drawn from a distribution.
//!
//! Design note: a body is a pure function of the request's sequence number and the seed,
//! so a run is reproducible and every worker can make its own bodies without sharing a
//! random generator. Everything that can be done once is done before the run: templates
//! are parsed into pieces (a template without placeholders becomes one shared buffer),
//! files are read, and sized bodies are cut from one buffer prepared at the largest size,
//! so a request costs at most one small allocation (a rendered template) and usually none
//! (`Bytes::slice` of a shared buffer).
//!
//! Template placeholders (`-d/--body`), `{{` always opens one and `\{{` is a literal `{{`:
//!
//! | placeholder | becomes |
//! | --- | --- |
//! | `{{seq}}` | the request's sequence number in the run (0, 1, 2, …) |
//! | `{{rand_int A B}}` | an integer drawn uniformly from `A..=B` |
//! | `{{tokens A..B}}`, `{{tokens N}}` | `N` words (`N` drawn from `A..=B`), space-separated: a prompt of about that many tokens |
//! | `{{rand_ints A..B MIN MAX}}`, `{{rand_ints N MIN MAX}}` | `N` integers from `MIN..=MAX`, comma-separated: token ids (`[{{rand_ints 16..512 0 50256}}]`) |
//! | `{{choice a,b,c}}` | one of the comma-separated alternatives |
//! | `{{uuid}}` | a random version-4 UUID |
//!
//! Size distributions (`--body-size`): `N`, `fixed:N`, `uniform:A..B`, `choice:a,b,c`,
//! `normal:MEAN,SD` (clamped at 0), with sizes in bytes or with a unit (`1KiB`, `2MB`).
//! Alone, `--body-size` sends filler text of the drawn size; with `--body-file` the file
//! is repeated or cut to the drawn size; with `--body-dir` the file whose size is nearest
//! the draw is sent. With a template the template decides the size (use `{{tokens}}`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bytes::Bytes;

use crate::error::{LoadError, Result};

/// Draws come from the workspace's one generator.
pub use vramroom_alloc::rng::Rng;

/// Largest body a distribution may ask for: a typo of a unit must not allocate the machine.
pub const MAX_BODY: u64 = 1 << 30;

/// A distribution of body sizes in bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum SizeDist {
    Fixed(u64),
    Uniform { lo: u64, hi: u64 },
    Choice(Vec<u64>),
    Normal { mean: f64, sd: f64 },
}

impl SizeDist {
    pub fn draw(&self, rng: &mut Rng) -> u64 {
        match self {
            SizeDist::Fixed(n) => *n,
            SizeDist::Uniform { lo, hi } => rng.range(*lo, *hi),
            SizeDist::Choice(v) => v[(rng.next_u64() % v.len() as u64) as usize],
            SizeDist::Normal { mean, sd } => (mean + sd * rng.normal())
                .round()
                .clamp(0.0, self.max() as f64) as u64,
        }
    }
    /// The largest size a draw can give.
    pub fn max(&self) -> u64 {
        match self {
            SizeDist::Fixed(n) => *n,
            SizeDist::Uniform { hi, .. } => *hi,
            SizeDist::Choice(v) => v.iter().copied().max().unwrap_or(0),
            // Six standard deviations: a draw beyond is clamped.
            SizeDist::Normal { mean, sd } => ((mean + 6.0 * sd).ceil() as u64).min(MAX_BODY),
        }
    }
}

impl fmt::Display for SizeDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeDist::Fixed(n) => write!(f, "fixed:{n}"),
            SizeDist::Uniform { lo, hi } => write!(f, "uniform:{lo}..{hi}"),
            SizeDist::Choice(v) => write!(
                f,
                "choice:{}",
                v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            ),
            SizeDist::Normal { mean, sd } => write!(f, "normal:{mean},{sd}"),
        }
    }
}

fn size(s: &str, whole: &str) -> Result<u64> {
    let v = vramroom_alloc::parse_size(s.trim()).map_err(|e| {
        LoadError::Config(format!(
            "--body-size {whole:?}: {:?} is not a size ({e})",
            s.trim()
        ))
    })?;
    if v > MAX_BODY {
        return Err(LoadError::Config(format!(
            "--body-size {whole:?}: {v} bytes is more than the 1 GiB limit"
        )));
    }
    Ok(v)
}

impl FromStr for SizeDist {
    type Err = LoadError;
    /// `N`, `fixed:N`, `uniform:A..B`, `choice:a,b,c`, `normal:MEAN,SD`.
    fn from_str(s: &str) -> Result<SizeDist> {
        let t = s.trim();
        let bad = |m: &str| {
            LoadError::Config(format!(
                "--body-size {t:?}: {m} (expected N, uniform:A..B, choice:a,b,c or normal:MEAN,SD)"
            ))
        };
        let Some((kind, rest)) = t.split_once(':') else {
            return Ok(SizeDist::Fixed(size(t, t)?));
        };
        match kind.trim() {
            "fixed" => Ok(SizeDist::Fixed(size(rest, t)?)),
            "uniform" => {
                let (a, b) = rest.split_once("..").ok_or_else(|| bad("no '..'"))?;
                let (lo, hi) = (size(a, t)?, size(b, t)?);
                if lo > hi {
                    return Err(bad("the low end is above the high end"));
                }
                Ok(SizeDist::Uniform { lo, hi })
            }
            "choice" => {
                let v = rest
                    .split(',')
                    .map(|x| size(x, t))
                    .collect::<Result<Vec<_>>>()?;
                if v.is_empty() {
                    return Err(bad("no sizes"));
                }
                Ok(SizeDist::Choice(v))
            }
            "normal" => {
                let (m, d) = rest.split_once(',').ok_or_else(|| bad("no ','"))?;
                let (mean, sd) = (size(m, t)? as f64, size(d, t)? as f64);
                Ok(SizeDist::Normal { mean, sd })
            }
            k => Err(bad(&format!("unknown distribution {k:?}"))),
        }
    }
}

/// Words for `{{tokens}}`: short, common, ASCII, safe inside a JSON string.
const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "model", "memory", "token",
    "layer", "batch", "cache", "tensor", "graph", "load", "time", "space", "light", "water",
    "river", "stone", "cloud",
];

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Lit(String),
    Seq,
    RandInt(i64, i64),
    Tokens(u64, u64),
    /// (count lo, count hi, min, max).
    Ints(u64, u64, i64, i64),
    Choice(Vec<String>),
    Uuid,
}

/// A parsed `-d/--body` template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pieces: Vec<Piece>,
    /// The whole body when there is no placeholder.
    fixed: Option<Bytes>,
    /// Upper bound of a rendered body's length, to size the buffer once.
    max_len: usize,
}

impl FromStr for Template {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Template> {
        let bad = |m: String| LoadError::Config(format!("--body template: {m}"));
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut rest = s;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("\\{{") {
                lit.push_str("{{");
                rest = r;
                continue;
            }
            if let Some(r) = rest.strip_prefix("{{") {
                let end = r.find("}}").ok_or_else(|| {
                    bad(format!(
                        "'{{{{' at byte {} is not closed by '}}}}'",
                        s.len() - rest.len()
                    ))
                })?;
                let inner = r[..end].trim();
                rest = &r[end + 2..];
                if !lit.is_empty() {
                    pieces.push(Piece::Lit(std::mem::take(&mut lit)));
                }
                pieces.push(placeholder(inner).map_err(bad)?);
                continue;
            }
            let ch = rest.chars().next().unwrap_or('\0');
            lit.push(ch);
            rest = &rest[ch.len_utf8()..];
        }
        if !lit.is_empty() {
            pieces.push(Piece::Lit(lit));
        }
        let fixed = match pieces.as_slice() {
            [] => Some(Bytes::new()),
            [Piece::Lit(l)] => Some(Bytes::from(l.clone())),
            _ => None,
        };
        let max_len = pieces
            .iter()
            .map(|p| match p {
                Piece::Lit(l) => l.len(),
                Piece::Seq | Piece::RandInt(..) => 20,
                Piece::Tokens(_, hi) => *hi as usize * 7,
                Piece::Ints(_, hi, ..) => *hi as usize * 21,
                Piece::Choice(v) => v.iter().map(String::len).max().unwrap_or(0),
                Piece::Uuid => 36,
            })
            .sum();
        Ok(Template {
            pieces,
            fixed,
            max_len,
        })
    }
}

/// `N` or `A..B`.
fn count(
    t: &str,
    int: &dyn Fn(&str) -> std::result::Result<i64, String>,
) -> std::result::Result<(i64, i64), String> {
    Ok(match t.split_once("..") {
        Some((a, b)) => (int(a.trim())?, int(b.trim())?),
        None => {
            let n = int(t.trim())?;
            (n, n)
        }
    })
}

fn placeholder(inner: &str) -> std::result::Result<Piece, String> {
    let (name, args) = match inner.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (inner, ""),
    };
    let int = |t: &str| {
        t.parse::<i64>()
            .map_err(|_| format!("{{{{{inner}}}}}: {t:?} is not an integer"))
    };
    match name {
        "seq" if args.is_empty() => Ok(Piece::Seq),
        "uuid" if args.is_empty() => Ok(Piece::Uuid),
        "rand_int" => {
            let v: Vec<&str> = args.split_whitespace().collect();
            let [a, b] = v.as_slice() else {
                return Err(format!("{{{{{inner}}}}}: expected rand_int MIN MAX"));
            };
            let (a, b) = (int(a)?, int(b)?);
            if a > b {
                return Err(format!("{{{{{inner}}}}}: MIN is above MAX"));
            }
            Ok(Piece::RandInt(a, b))
        }
        "rand_ints" => {
            let v: Vec<&str> = args.split_whitespace().collect();
            let [n, a, b] = v.as_slice() else {
                return Err(format!("{{{{{inner}}}}}: expected rand_ints A..B MIN MAX"));
            };
            let (lo, hi) = count(n, &int)?;
            let (a, b) = (int(a)?, int(b)?);
            if lo < 0 || lo > hi || hi > 1_000_000 || a > b {
                return Err(format!(
                    "{{{{{inner}}}}}: expected rand_ints A..B MIN MAX with 0 ≤ A ≤ B ≤ 1000000 \
                     and MIN ≤ MAX"
                ));
            }
            Ok(Piece::Ints(lo as u64, hi as u64, a, b))
        }
        "tokens" => {
            let (lo, hi) = count(args, &int)?;
            if lo < 0 || lo > hi || hi > 1_000_000 {
                return Err(format!(
                    "{{{{{inner}}}}}: expected tokens N or tokens A..B with 0 ≤ A ≤ B ≤ 1000000"
                ));
            }
            Ok(Piece::Tokens(lo as u64, hi as u64))
        }
        "choice" => {
            let v: Vec<String> = args.split(',').map(|x| x.trim().to_string()).collect();
            if args.is_empty() {
                return Err(format!("{{{{{inner}}}}}: expected choice a,b,c"));
            }
            Ok(Piece::Choice(v))
        }
        _ => Err(format!(
            "unknown placeholder {{{{{inner}}}}} (expected seq, rand_int A B, tokens A..B, \
             rand_ints A..B MIN MAX, choice a,b,c or uuid)"
        )),
    }
}

impl Template {
    /// The body of request `seq`.
    pub fn render(&self, seed: u64, seq: u64) -> Bytes {
        if let Some(b) = &self.fixed {
            return b.clone();
        }
        let mut out = Vec::with_capacity(self.max_len.min(1 << 20));
        let mut rng = Rng::for_request(seed, seq, 1);
        for p in &self.pieces {
            match p {
                Piece::Lit(l) => out.extend_from_slice(l.as_bytes()),
                Piece::Seq => push_int(&mut out, seq as i128),
                Piece::RandInt(a, b) => {
                    let span = (*b as i128 - *a as i128) as u64;
                    let v = *a as i128 + rng.range(0, span) as i128;
                    push_int(&mut out, v);
                }
                Piece::Tokens(lo, hi) => {
                    let n = rng.range(*lo, *hi);
                    for i in 0..n {
                        if i > 0 {
                            out.push(b' ');
                        }
                        out.extend_from_slice(WORDS[(rng.next_u64() % 64) as usize].as_bytes());
                    }
                }
                Piece::Ints(lo, hi, a, b) => {
                    let n = rng.range(*lo, *hi);
                    let span = (*b as i128 - *a as i128) as u64;
                    for i in 0..n {
                        if i > 0 {
                            out.push(b',');
                        }
                        push_int(&mut out, *a as i128 + rng.range(0, span) as i128);
                    }
                }
                Piece::Choice(v) => {
                    out.extend_from_slice(v[(rng.next_u64() % v.len() as u64) as usize].as_bytes())
                }
                Piece::Uuid => {
                    let (a, b) = (rng.next_u64(), rng.next_u64());
                    let b = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
                    let a = (a & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
                    let s = format!(
                        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                        a >> 32,
                        (a >> 16) & 0xFFFF,
                        a & 0xFFFF,
                        b >> 48,
                        b & 0xFFFF_FFFF_FFFF
                    );
                    out.extend_from_slice(s.as_bytes());
                }
            }
        }
        Bytes::from(out)
    }

    /// True when the template has no placeholder.
    pub fn is_fixed(&self) -> bool {
        self.fixed.is_some()
    }
}

fn push_int(out: &mut Vec<u8>, v: i128) {
    use std::io::Write;
    let _ = write!(out, "{v}");
}

/// What the user asked for, before any file is read.
#[derive(Debug, Clone, Default)]
pub struct BodySpec {
    /// `-d/--body`.
    pub template: Option<String>,
    /// `--body-file`.
    pub file: Option<PathBuf>,
    /// `--body-dir`.
    pub dir: Option<PathBuf>,
    /// `--body-size`.
    pub size: Option<String>,
    pub seed: u64,
}

#[derive(Debug, Clone)]
enum Source {
    Empty,
    Template(Template),
    /// The same bytes every time.
    Fixed(Bytes),
    /// `base` is at least `dist.max()` long; a body is its first `draw` bytes.
    Sized {
        base: Bytes,
        dist: SizeDist,
    },
    /// Files sorted by size; with `dist`, the nearest to the draw, else a uniform pick.
    Files {
        files: Vec<Bytes>,
        dist: Option<SizeDist>,
    },
}

/// The bodies of a run.
#[derive(Debug, Clone)]
pub struct Bodies {
    source: Source,
    seed: u64,
    describe: String,
    json: bool,
}

const FILLER: &[u8] = b"vramroom load test body filler text 0123456789 ";

fn read(p: &Path) -> Result<Bytes> {
    vramroom_alloc::input::read_file(p, vramroom_alloc::input::Limit::BODY)
        .map(Bytes::from)
        .map_err(|e| LoadError::Config(format!("cannot read body file {e}")))
}

/// `bytes` repeated (or cut) to exactly `n` bytes.
fn cycle(bytes: &[u8], n: usize) -> Bytes {
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let take = (n - v.len()).min(bytes.len());
        v.extend_from_slice(&bytes[..take]);
    }
    Bytes::from(v)
}

fn looks_json(b: &[u8]) -> bool {
    matches!(
        b.iter().find(|c| !c.is_ascii_whitespace()),
        Some(b'{') | Some(b'[')
    )
}

impl Bodies {
    /// Checks and prepares the bodies: reads files, parses the template and the size
    /// distribution. Every problem is a [`LoadError::Config`] that names it.
    pub fn new(spec: &BodySpec) -> Result<Bodies> {
        let given = [
            spec.template.is_some(),
            spec.file.is_some(),
            spec.dir.is_some(),
        ]
        .iter()
        .filter(|x| **x)
        .count();
        if given > 1 {
            return Err(LoadError::Config(
                "give one of --body, --body-file and --body-dir".into(),
            ));
        }
        let dist = spec
            .size
            .as_deref()
            .map(str::parse::<SizeDist>)
            .transpose()?;
        let (source, describe, json) = if let Some(t) = &spec.template {
            if dist.is_some() {
                return Err(LoadError::Config(
                    "--body-size does not apply to a --body template: the template sets the \
                     size (use {{tokens A..B}} for variable lengths)"
                        .into(),
                ));
            }
            let tpl: Template = t.parse()?;
            let json = looks_json(t.as_bytes());
            let d = if tpl.is_fixed() {
                format!("fixed body of {} bytes", t.len())
            } else {
                format!("template {t:?}")
            };
            (Source::Template(tpl), d, json)
        } else if let Some(p) = &spec.file {
            let data = read(p)?;
            let json = looks_json(&data);
            match dist {
                None => (
                    Source::Fixed(data.clone()),
                    format!("{} ({} bytes)", p.display(), data.len()),
                    json,
                ),
                Some(d) => {
                    if data.is_empty() {
                        return Err(LoadError::Config(format!(
                            "body file {} is empty: it cannot be sized to --body-size",
                            p.display()
                        )));
                    }
                    let base = cycle(&data, d.max() as usize);
                    (
                        Source::Sized {
                            base,
                            dist: d.clone(),
                        },
                        format!("{} repeated or cut to {d}", p.display()),
                        false,
                    )
                }
            }
        } else if let Some(dir) = &spec.dir {
            let rd = std::fs::read_dir(dir).map_err(|e| {
                LoadError::Config(format!("cannot read body folder {}: {e}", dir.display()))
            })?;
            let mut paths: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            paths.sort();
            if paths.is_empty() {
                return Err(LoadError::Config(format!(
                    "body folder {} has no files",
                    dir.display()
                )));
            }
            let mut files = paths.iter().map(|p| read(p)).collect::<Result<Vec<_>>>()?;
            files.sort_by_key(|b| b.len());
            let json = files.iter().all(|f| looks_json(f));
            let d = format!(
                "{} files of {}..{} bytes from {}{}",
                files.len(),
                files.first().map(|f| f.len()).unwrap_or(0),
                files.last().map(|f| f.len()).unwrap_or(0),
                dir.display(),
                dist.as_ref()
                    .map(|d| format!(", nearest to {d}"))
                    .unwrap_or_default()
            );
            (Source::Files { files, dist }, d, json)
        } else if let Some(d) = dist {
            let base = cycle(FILLER, d.max() as usize);
            (
                Source::Sized {
                    base,
                    dist: d.clone(),
                },
                format!("filler of {d} bytes"),
                false,
            )
        } else {
            (Source::Empty, "none".into(), false)
        };
        Ok(Bodies {
            source,
            seed: spec.seed,
            describe,
            json,
        })
    }

    /// No body at all.
    pub fn none() -> Bodies {
        Bodies {
            source: Source::Empty,
            seed: 0,
            describe: "none".into(),
            json: false,
        }
    }

    /// The body of request `seq`.
    pub fn body(&self, seq: u64) -> Bytes {
        match &self.source {
            Source::Empty => Bytes::new(),
            Source::Template(t) => t.render(self.seed, seq),
            Source::Fixed(b) => b.clone(),
            Source::Sized { base, dist } => {
                let mut rng = Rng::for_request(self.seed, seq, 2);
                let n = (dist.draw(&mut rng) as usize).min(base.len());
                base.slice(..n)
            }
            Source::Files { files, dist } => {
                let mut rng = Rng::for_request(self.seed, seq, 3);
                let i = match dist {
                    None => (rng.next_u64() % files.len() as u64) as usize,
                    Some(d) => {
                        let want = d.draw(&mut rng) as usize;
                        let i = files.partition_point(|f| f.len() < want);
                        // The nearer of the two neighbours.
                        if i == files.len()
                            || (i > 0 && want - files[i - 1].len() < files[i].len() - want)
                        {
                            i - 1
                        } else {
                            i
                        }
                    }
                };
                files[i].clone()
            }
        }
    }

    /// Whether there is a body at all.
    pub fn is_empty(&self) -> bool {
        matches!(self.source, Source::Empty)
    }

    /// `application/json` when every body starts like JSON (`{` or `[`); the client sets it
    /// unless a `-H Content-Type` was given.
    pub fn content_type(&self) -> Option<&'static str> {
        self.json.then_some("application/json")
    }

    pub fn describe(&self) -> &str {
        &self.describe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(b: &Bytes) -> String {
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[test]
    fn template_placeholders() {
        let t: Template =
            r#"{"id":{{seq}},"n":{{ rand_int 5 7 }},"p":"{{tokens 3..6}}","c":"{{choice a,bb}}","u":"{{uuid}}","lit":"\{{x}}","ids":[{{rand_ints 2..4 0 9}}]}"#
                .parse()
                .unwrap();
        let mut lens = std::collections::BTreeSet::new();
        let mut ns = std::collections::BTreeSet::new();
        for seq in 0..200 {
            let b = s(&t.render(9, seq));
            let v: serde_json::Value = serde_json::from_str(&b).unwrap();
            assert_eq!(v["id"], seq);
            let n = v["n"].as_i64().unwrap();
            assert!((5..=7).contains(&n));
            ns.insert(n);
            let words = v["p"].as_str().unwrap().split(' ').count();
            assert!((3..=6).contains(&words), "{b}");
            lens.insert(words);
            assert!(["a", "bb"].contains(&v["c"].as_str().unwrap()));
            let u = v["u"].as_str().unwrap();
            assert_eq!(u.len(), 36);
            assert_eq!(&u[14..15], "4");
            assert_eq!(v["lit"], "{{x}}");
            let ids = v["ids"].as_array().unwrap();
            assert!((2..=4).contains(&ids.len()), "{b}");
            assert!(ids.iter().all(|x| (0..=9).contains(&x.as_i64().unwrap())));
            // A pure function of (seed, seq).
            assert_eq!(t.render(9, seq), t.render(9, seq));
        }
        assert_eq!(ns.len(), 3, "every value of rand_int 5 7 is drawn");
        assert_eq!(lens.len(), 4, "every length of tokens 3..6 is drawn");
        let fixed: Template = "plain text".parse().unwrap();
        assert!(fixed.is_fixed());
        assert_eq!(s(&fixed.render(1, 2)), "plain text");
    }

    #[test]
    fn bad_templates_name_the_problem() {
        for (bad, what) in [
            ("{{nope}}", "unknown placeholder"),
            ("{{seq", "not closed"),
            ("{{rand_int 5}}", "rand_int MIN MAX"),
            ("{{rand_int 9 1}}", "above"),
            ("{{rand_int a 1}}", "not an integer"),
            ("{{tokens 9..3}}", "tokens"),
            ("{{choice}}", "choice"),
            ("{{seq 3}}", "unknown placeholder"),
            ("{{rand_ints 3 0}}", "rand_ints A..B MIN MAX"),
            ("{{rand_ints 3 9 0}}", "MIN ≤ MAX"),
        ] {
            let e = bad.parse::<Template>().expect_err(bad).to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn size_distributions() {
        let mut rng = Rng::new(3);
        let d: SizeDist = "uniform:16..1KiB".parse().unwrap();
        assert_eq!(d, SizeDist::Uniform { lo: 16, hi: 1024 });
        let draws: Vec<u64> = (0..5000).map(|_| d.draw(&mut rng)).collect();
        assert!(draws.iter().all(|x| (16..=1024).contains(x)));
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        assert!((mean - 520.0).abs() < 20.0, "mean {mean}");
        let c: SizeDist = "choice:1,2KiB".parse().unwrap();
        let n1 = (0..1000).filter(|_| c.draw(&mut rng) == 1).count();
        assert!((400..600).contains(&n1), "{n1}");
        let n: SizeDist = "normal:1000,100".parse().unwrap();
        let draws: Vec<f64> = (0..5000).map(|_| n.draw(&mut rng) as f64).collect();
        let m = draws.iter().sum::<f64>() / 5000.0;
        let sd = (draws.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 5000.0).sqrt();
        assert!(
            (m - 1000.0).abs() < 10.0 && (sd - 100.0).abs() < 10.0,
            "{m} {sd}"
        );
        assert_eq!("512".parse::<SizeDist>().unwrap(), SizeDist::Fixed(512));
        for bad in [
            "uniform:9..3",
            "uniform:3",
            "lots",
            "choice:",
            "pareto:3",
            "2GiB",
            "normal:5",
        ] {
            assert!(bad.parse::<SizeDist>().is_err(), "{bad}");
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vramroom-body-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn files_folders_and_sizes() {
        let d = scratch("files");
        std::fs::write(d.join("a.json"), "{\"a\":1}").unwrap();
        let spec = |f: &str, size: Option<&str>| BodySpec {
            file: Some(d.join(f)),
            size: size.map(String::from),
            seed: 1,
            ..Default::default()
        };
        let b = Bodies::new(&spec("a.json", None)).unwrap();
        assert_eq!(s(&b.body(0)), "{\"a\":1}");
        assert_eq!(b.content_type(), Some("application/json"));
        // Sized from a file: repeated or cut to the draw.
        let b = Bodies::new(&spec("a.json", Some("uniform:3..20"))).unwrap();
        for seq in 0..100 {
            let x = b.body(seq);
            assert!((3..=20).contains(&x.len()));
            assert!("{\"a\":1}{\"a\":1}{\"a\":1}".starts_with(&s(&x)));
        }
        // A folder: the nearest file to the draw.
        let dir = d.join("dir");
        std::fs::create_dir_all(&dir).unwrap();
        for n in [10usize, 100, 1000] {
            std::fs::write(dir.join(format!("f{n}")), vec![b'x'; n]).unwrap();
        }
        let b = Bodies::new(&BodySpec {
            dir: Some(dir.clone()),
            size: Some("choice:12,900".into()),
            ..Default::default()
        })
        .unwrap();
        let got: std::collections::BTreeSet<usize> = (0..100).map(|i| b.body(i).len()).collect();
        assert_eq!(got, [10, 1000].into_iter().collect());
        let b = Bodies::new(&BodySpec {
            dir: Some(dir),
            ..Default::default()
        })
        .unwrap();
        let got: std::collections::BTreeSet<usize> = (0..100).map(|i| b.body(i).len()).collect();
        assert_eq!(got.len(), 3);
        // Filler alone.
        let b = Bodies::new(&BodySpec {
            size: Some("fixed:4KiB".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(b.body(7).len(), 4096);
        // Problems.
        for bad in [
            BodySpec {
                file: Some(d.join("missing")),
                ..Default::default()
            },
            BodySpec {
                dir: Some(d.join("missing")),
                ..Default::default()
            },
            BodySpec {
                template: Some("x".into()),
                size: Some("3".into()),
                ..Default::default()
            },
            BodySpec {
                template: Some("x".into()),
                file: Some(d.join("a.json")),
                ..Default::default()
            },
        ] {
            assert!(Bodies::new(&bad).is_err(), "{bad:?}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
