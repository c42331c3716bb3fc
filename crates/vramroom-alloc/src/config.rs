//! `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`: the allocator's configuration.
//!
//! Design note: PyTorch 2.11 parses one string in three passes over the same token list
//! (spec 10.1–10.3): `large_segment_size_mb` first (other minimums depend on it), then the
//! device-generic keys, then the CUDA keys. We keep that order so that a string with several
//! problems reports the same one PyTorch would, and so that `max_split_size_mb:24,
//! large_segment_size_mb:24` validates against 24 regardless of key order.
//!
//! Where PyTorch is lenient by accident we are strict on purpose, and say so at the spot:
//! PyTorch ignores the result of its `:`/`,` token checks and reads integers with `stoull`
//! prefix semantics (`12abc` → 12, `-1` → 2^64−1). Here a missing `:`/`,`, a trailing
//! garbage suffix or a sign is an error. A parse also never leaves a half-applied
//! configuration behind: it works on a copy and commits only on success.
//!
//! Error texts start with PyTorch's wording where the spec or the golden probe gives it and
//! append the offending key/value; [`ConfigError::pytorch_message`] returns the bare PyTorch
//! text for comparisons with real output.

use std::fmt;
use std::str::FromStr;

use crate::snapshot::AllocatorSettings;

const MIB: u64 = 1 << 20;
/// `kMinLargeAlloc / kMB`: `large_segment_size_mb` must be strictly larger.
const MIN_LARGE_SEGMENT_MB: u64 = 10;
/// `pinned_max_register_threads()`.
const PINNED_MAX_REGISTER_THREADS: u64 = 128;
const INTERVALS: usize = 16;
const KEY_ROUNDUP: &str = "roundup_power2_divisions";

/// Which allocator implementation PyTorch would use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Native,
    CudaMallocAsync,
}

impl Backend {
    /// The config-string spelling, also what `get_allocator_backend()` returns.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Native => "native",
            Backend::CudaMallocAsync => "cudaMallocAsync",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every key PyTorch 2.11 accepts, with PyTorch's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Bytes; `u64::MAX` = unlimited (reported as -1).
    pub max_split_size: u64,
    /// Bytes; defaults to `large_segment_size`.
    pub max_non_split_rounding_size: u64,
    /// Bytes; 20 MiB by default.
    pub large_segment_size: u64,
    /// In (0, 1); 0 = off.
    pub garbage_collection_threshold: f64,
    /// Divisions per power-of-two interval, index i = [2^i MiB, 2^(i+1) MiB); 0 = off.
    pub roundup_power2_divisions: [u64; 16],
    pub expandable_segments: bool,
    pub pinned_use_background_threads: bool,
    pub backend: Backend,
    pub release_lock_on_cudamalloc: bool,
    pub pinned_use_cuda_host_register: bool,
    pub pinned_num_register_threads: u64,
    pub pinned_reserve_segment_size_mb: u64,
    pub graph_capture_record_stream_reuse: bool,
    /// In [0, 1]; 1 = no limit.
    pub per_process_memory_fraction: f64,
    /// The last string parsed, as the snapshot's `PYTORCH_CUDA_ALLOC_CONF` reports it.
    pub last_conf: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: 20 << 20,
            large_segment_size: 20 << 20,
            garbage_collection_threshold: 0.0,
            roundup_power2_divisions: [0; 16],
            expandable_segments: false,
            pinned_use_background_threads: false,
            backend: Backend::Native,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
            per_process_memory_fraction: 1.0,
            last_conf: String::new(),
        }
    }
}

/// Which parser reports an unknown key. PyTorch words the error after the object that
/// noticed it: the CUDA parser when the environment is read at CUDA init, the generic
/// "Accelerator" parser for `_set_allocator_settings` at runtime (both measured on 2.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigScope {
    /// Environment variable read at initialisation ([`AllocatorConfig::parse`]).
    Cuda,
    /// Runtime `_set_allocator_settings` ([`AllocatorConfig::update`]).
    Accelerator,
}

impl fmt::Display for ConfigScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigScope::Cuda => "CUDA",
            ConfigScope::Accelerator => "Accelerator",
        })
    }
}

/// A rejected configuration string (or snapshot settings). One line each.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("Unrecognized key '{key}' in {scope} allocator config.")]
    UnrecognizedKey { key: String, scope: ConfigScope },
    #[error("unexpected '{token}' at token {index} of the allocator config, expected a key")]
    UnexpectedToken { token: String, index: usize },
    #[error("allocator config: expected '{expected}' after '{after}' at token {index}, got {got}")]
    ExpectedToken {
        expected: char,
        after: String,
        index: usize,
        /// The token found instead, quoted, or "end of config".
        got: String,
    },
    #[error("Error, expecting {key} value")]
    MissingValue { key: String },
    #[error(
        "Expected closing bracket ']' in ConfigTokenizer but reached end of config (key '{key}')"
    )]
    UnclosedList { key: String },
    #[error("allocator config key '{key}' takes a single value, not a list")]
    ListNotAllowed { key: String },
    #[error("allocator config key '{key}': '{value}' is not an unsigned decimal integer")]
    InvalidInteger { key: String, value: String },
    #[error("allocator config key '{key}': '{value}' is out of range for a 64-bit integer")]
    IntegerOutOfRange { key: String, value: String },
    #[error("allocator config key '{key}': '{value}' is not a number")]
    InvalidFloat { key: String, value: String },
    #[error("Expected 'True' or 'False' at index {index} in ConfigTokenizer but got '{value}' (key '{key}')")]
    InvalidBool {
        key: String,
        value: String,
        index: usize,
    },
    #[error("CachingAllocator option large_segment_size_mb must be > 10 MB (got '{value}')")]
    LargeSegmentTooSmall { value: String },
    #[error(
        "CachingAllocator option max_split_size_mb too small, must be >= {min} (got '{value}')"
    )]
    MaxSplitTooSmall { value: String, min: u64 },
    #[error(
        "CachingAllocator option max_non_split_rounding_mb too small, must be >= {min} (got '{value}')"
    )]
    MaxNonSplitRoundingTooSmall { value: String, min: u64 },
    #[error("garbage_collect_threshold is invalid, set it in (0.0, 1.0) (garbage_collection_threshold:{value})")]
    GarbageCollectionThreshold { value: String },
    #[error("For roundups, the divisions has to be power of 2 (roundup_power2_divisions:{value})")]
    RoundupDivisions { value: String },
    #[error("For roundups, the divisions has to be power of 2 or 0 to disable roundup (roundup_power2_divisions entry '{interval}:{value}')")]
    RoundupListDivisions { interval: String, value: String },
    #[error("For roundups, the intervals have to be power of 2 (roundup_power2_divisions entry '{interval}:{value}')")]
    RoundupInterval { interval: String, value: String },
    #[error("Unknown allocator backend, options are native and cudaMallocAsync (backend:{value})")]
    UnknownBackend { value: String },
    #[error("Allocator backend parsed at runtime != allocator backend parsed at load time, {parsed} != {current}")]
    BackendChanged { parsed: Backend, current: Backend },
    #[error("Number of register threads has to be power of 2, got {value} (pinned_num_register_threads)")]
    RegisterThreadsNotPowerOfTwo { value: String },
    #[error("Number of register threads should be less than or equal to 128, got {value} (pinned_num_register_threads)")]
    TooManyRegisterThreads { value: String },
    #[error("Pinned reserve segment size has to be greater than 0 (pinned_reserve_segment_size_mb:{value})")]
    PinnedReserveSegmentSize { value: String },
    #[error("per_process_memory_fraction is invalid, set it in [0.0, 1.0] (per_process_memory_fraction:{value})")]
    MemoryFraction { value: String },
    #[error("environment variable {var} is not valid UTF-8")]
    EnvNotUnicode { var: String },
    #[error("allocator_settings.{field} = {value} is not a valid setting")]
    InvalidSetting { field: String, value: String },
}

impl ConfigError {
    /// The message PyTorch 2.11 itself raises for this error, without our key/value suffix
    /// (trailing spaces included, as in PyTorch's source). For errors PyTorch has no
    /// counterpart for, the same text as `Display`.
    pub fn pytorch_message(&self) -> String {
        use ConfigError::*;
        match self {
            InvalidBool { value, index, .. } => format!(
                "Expected 'True' or 'False' at index {index} in ConfigTokenizer but got '{value}'"
            ),
            UnclosedList { .. } => {
                "Expected closing bracket ']' in ConfigTokenizer but reached end of config".into()
            }
            LargeSegmentTooSmall { .. } => {
                "CachingAllocator option large_segment_size_mb must be > 10 MB".into()
            }
            MaxSplitTooSmall { min, .. } => {
                format!("CachingAllocator option max_split_size_mb too small, must be >= {min}")
            }
            MaxNonSplitRoundingTooSmall { min, .. } => format!(
                "CachingAllocator option max_non_split_rounding_mb too small, must be >= {min}"
            ),
            GarbageCollectionThreshold { .. } => {
                "garbage_collect_threshold is invalid, set it in (0.0, 1.0)".into()
            }
            RoundupDivisions { .. } => "For roundups, the divisions has to be power of 2 ".into(),
            RoundupListDivisions { .. } => {
                "For roundups, the divisions has to be power of 2 or 0 to disable roundup ".into()
            }
            RoundupInterval { .. } => "For roundups, the intervals have to be power of 2 ".into(),
            UnknownBackend { .. } => {
                "Unknown allocator backend, options are native and cudaMallocAsync".into()
            }
            RegisterThreadsNotPowerOfTwo { value } => {
                format!("Number of register threads has to be power of 2, got {value}")
            }
            TooManyRegisterThreads { value } => format!(
                "Number of register threads should be less than or equal to {PINNED_MAX_REGISTER_THREADS}, got {value}"
            ),
            PinnedReserveSegmentSize { .. } => {
                "Pinned reserve segment size has to be greater than 0".into()
            }
            MemoryFraction { .. } => {
                "per_process_memory_fraction is invalid, set it in [0.0, 1.0]".into()
            }
            other => other.to_string(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tokenizer and structure
// ---------------------------------------------------------------------------------------

/// `ConfigTokenizer`: `,` `:` `[` `]` are tokens of their own, every other run of characters
/// is one token, and whitespace (C `isspace`) is dropped wherever it appears.
fn tokenize(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        match ch {
            ',' | ':' | '[' | ']' => {
                if !buf.is_empty() {
                    out.push(std::mem::take(&mut buf));
                }
                out.push(ch.to_string());
            }
            // exactly C's isspace set in the "C" locale; Rust's is_ascii_whitespace lacks \v
            ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r' => {}
            _ => buf.push(ch),
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

fn is_delim(t: &str) -> bool {
    matches!(t, "," | ":" | "[" | "]")
}

#[derive(Debug)]
enum Value<'a> {
    /// A single token and its index in the token list.
    Scalar(&'a str, usize),
    /// `[a:b, c:d, …]` as (a, b) pairs.
    List(Vec<(&'a str, &'a str)>),
}

#[derive(Debug)]
struct Entry<'a> {
    key: &'a str,
    value: Value<'a>,
}

fn got(tokens: &[String], i: usize) -> String {
    tokens
        .get(i)
        .map_or_else(|| "end of config".to_string(), |t| format!("'{t}'"))
}

fn expect(tokens: &[String], i: usize, c: char, after: &str) -> Result<(), ConfigError> {
    // PyTorch's checkToken result is ignored (`expandable_segments,True` is accepted
    // there); we require the separator.
    if tokens
        .get(i)
        .is_some_and(|t| t.len() == 1 && t.starts_with(c))
    {
        Ok(())
    } else {
        Err(ConfigError::ExpectedToken {
            expected: c,
            after: after.to_string(),
            index: i,
            got: got(tokens, i),
        })
    }
}

/// Split the token list into `key:value` entries. A trailing `,` is accepted, as in PyTorch.
fn structure(tokens: &[String], scope: ConfigScope) -> Result<Vec<Entry<'_>>, ConfigError> {
    let mut entries = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let key = tokens[i].as_str();
        if is_delim(key) {
            return Err(ConfigError::UnexpectedToken {
                token: key.to_string(),
                index: i,
            });
        }
        // `max_split_size_mb=128` is one token: call it an unknown key, as PyTorch would,
        // rather than a missing ':'.
        if !is_known(key) && tokens.get(i + 1).map(String::as_str) != Some(":") {
            return Err(ConfigError::UnrecognizedKey {
                key: key.to_string(),
                scope,
            });
        }
        expect(tokens, i + 1, ':', key)?;
        i += 2;
        let missing = || ConfigError::MissingValue {
            key: key.to_string(),
        };
        let tok = tokens.get(i).ok_or_else(missing)?.as_str();
        let value = if tok == "[" {
            // Only the roundup table is a list in 2.11; say so instead of tripping over the
            // list's insides.
            if key != KEY_ROUNDUP {
                return Err(if is_known(key) {
                    ConfigError::ListNotAllowed {
                        key: key.to_string(),
                    }
                } else {
                    ConfigError::UnrecognizedKey {
                        key: key.to_string(),
                        scope,
                    }
                });
            }
            let mut pairs = Vec::new();
            i += 1;
            loop {
                let t = tokens
                    .get(i)
                    .ok_or_else(|| ConfigError::UnclosedList {
                        key: key.to_string(),
                    })?
                    .as_str();
                if t == "]" {
                    break;
                }
                if is_delim(t) {
                    return Err(ConfigError::ExpectedToken {
                        expected: ']',
                        after: "[".to_string(),
                        index: i,
                        got: got(tokens, i),
                    });
                }
                expect(tokens, i + 1, ':', t)?;
                let v = tokens
                    .get(i + 2)
                    .filter(|v| !is_delim(v))
                    .ok_or_else(missing)?
                    .as_str();
                pairs.push((t, v));
                i += 3;
                match tokens.get(i).map(String::as_str) {
                    Some("]") => break,
                    // a trailing comma before `]` is accepted, as in PyTorch
                    Some(",") => i += 1,
                    None => {
                        return Err(ConfigError::UnclosedList {
                            key: key.to_string(),
                        })
                    }
                    Some(t) => {
                        return Err(ConfigError::ExpectedToken {
                            expected: ',',
                            after: v.to_string(),
                            index: i,
                            got: format!("'{t}'"),
                        })
                    }
                }
            }
            Value::List(pairs)
        } else if is_delim(tok) {
            return Err(missing());
        } else {
            Value::Scalar(tok, i)
        };
        entries.push(Entry { key, value });
        i += 1;
        if i < tokens.len() {
            let after = match &entries.last().map(|e| &e.value) {
                Some(Value::Scalar(t, _)) => t.to_string(),
                _ => "]".to_string(),
            };
            expect(tokens, i, ',', &after)?;
            i += 1;
        }
    }
    Ok(entries)
}

// ---------------------------------------------------------------------------------------
// Value readers
// ---------------------------------------------------------------------------------------

fn scalar<'a>(e: &Entry<'a>) -> Result<(&'a str, usize), ConfigError> {
    match e.value {
        Value::Scalar(t, i) => Ok((t, i)),
        Value::List(_) => Err(ConfigError::ListNotAllowed {
            key: e.key.to_string(),
        }),
    }
}

/// An unsigned decimal integer. Deliberately stricter than PyTorch's `stoull`, which takes
/// the leading digits (`12abc` → 12), skips a sign (`-1` → 2^64−1) and accepts `0x`-less
/// hex-looking prefixes digit by digit: here the whole token must be ASCII digits.
fn uint(key: &str, t: &str) -> Result<u64, ConfigError> {
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConfigError::InvalidInteger {
            key: key.to_string(),
            value: t.to_string(),
        });
    }
    // stoull throws out_of_range for these too
    t.parse::<u64>()
        .map_err(|_| ConfigError::IntegerOutOfRange {
            key: key.to_string(),
            value: t.to_string(),
        })
}

/// A double. Stricter than `stod` (`0.5abc` → 0.5 there): the whole token must be a number
/// in Rust's grammar (`1e-3`, `.5`, `inf`, `nan` are numbers; range checks reject the last two).
fn float(key: &str, t: &str) -> Result<f64, ConfigError> {
    f64::from_str(t).map_err(|_| ConfigError::InvalidFloat {
        key: key.to_string(),
        value: t.to_string(),
    })
}

fn boolean(key: &str, t: &str, index: usize) -> Result<bool, ConfigError> {
    match t {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(ConfigError::InvalidBool {
            key: key.to_string(),
            value: t.to_string(),
            index,
        }),
    }
}

fn mib_clamped(mb: u64) -> u64 {
    // PyTorch clamps to SIZE_MAX / kMB before multiplying, so huge values never wrap.
    mb.min(u64::MAX / MIB) * MIB
}

/// Index of the divisions-table entry for an interval start of `mb` MiB (a power of two).
fn interval_index(mb: u64) -> usize {
    (mb.ilog2() as usize).min(INTERVALS - 1)
}

const COMMON_KEYS: [&str; 7] = [
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    KEY_ROUNDUP,
    "expandable_segments",
    "pinned_use_background_threads",
];

const CUDA_KEYS: [&str; 9] = [
    "backend",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
    "per_process_memory_fraction",
];

fn is_known(key: &str) -> bool {
    COMMON_KEYS.contains(&key) || CUDA_KEYS.contains(&key)
}

// ---------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------

impl AllocatorConfig {
    /// Parse a conf string as PyTorch does when it reads the environment at CUDA init:
    /// defaults, then the string.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut c = AllocatorConfig::default();
        c.apply(s, ConfigScope::Cuda)?;
        Ok(c)
    }

    /// `torch.cuda.memory._set_allocator_settings(s)`: first `max_split_size`,
    /// `roundup_power2_divisions` and `garbage_collection_threshold` go back to their
    /// defaults and `max_non_split_rounding_size` to `large_segment_size`; then the keys in
    /// `s` are applied. Every other setting keeps its value unless `s` names it. The backend
    /// cannot change. On error `self` is left untouched.
    pub fn update(&mut self, s: &str) -> Result<(), ConfigError> {
        self.apply(s, ConfigScope::Accelerator)
    }

    /// The configuration from the environment: `PYTORCH_CUDA_ALLOC_CONF`, then
    /// `PYTORCH_HIP_ALLOC_CONF`, then `PYTORCH_ALLOC_CONF`; the first one that is set (even
    /// to an empty string) is the only one read. 2.11 checks the HIP name on CUDA builds
    /// too. None set → defaults.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var_os(var))
    }

    fn from_lookup(
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Self, ConfigError> {
        for var in [
            "PYTORCH_CUDA_ALLOC_CONF",
            "PYTORCH_HIP_ALLOC_CONF",
            "PYTORCH_ALLOC_CONF",
        ] {
            if let Some(v) = lookup(var) {
                let s = v.into_string().map_err(|_| ConfigError::EnvNotUnicode {
                    var: var.to_string(),
                })?;
                return Self::parse(&s);
            }
        }
        Ok(AllocatorConfig::default())
    }

    fn apply(&mut self, s: &str, scope: ConfigScope) -> Result<(), ConfigError> {
        let tokens = tokenize(s);
        let entries = structure(&tokens, scope)?;
        let mut c = self.clone();
        c.max_split_size = u64::MAX;
        c.roundup_power2_divisions = [0; INTERVALS];
        c.garbage_collection_threshold = 0.0;

        // Pass 1: the large segment size, which the minimums below depend on.
        for e in entries.iter().filter(|e| e.key == "large_segment_size_mb") {
            let (t, _) = scalar(e)?;
            let mb = uint(e.key, t)?;
            if mb <= MIN_LARGE_SEGMENT_MB {
                return Err(ConfigError::LargeSegmentTooSmall {
                    value: t.to_string(),
                });
            }
            c.large_segment_size = mib_clamped(mb);
        }
        c.max_non_split_rounding_size = c.large_segment_size;

        // Pass 2: device-generic keys. At runtime this parser is also the one that rejects
        // unknown keys (hence the "Accelerator" wording).
        for e in &entries {
            c.apply_common(e)?;
            if scope == ConfigScope::Accelerator && !is_known(e.key) {
                return Err(ConfigError::UnrecognizedKey {
                    key: e.key.to_string(),
                    scope,
                });
            }
        }

        // Pass 3: CUDA keys.
        let mut used_async = false;
        let mut used_native_specific = false;
        for e in &entries {
            if c.apply_cuda(e, scope, &mut used_async)? {
                used_native_specific |= e.key != "backend";
            } else if !is_known(e.key) {
                return Err(ConfigError::UnrecognizedKey {
                    key: e.key.to_string(),
                    scope,
                });
            }
        }
        if used_async && used_native_specific {
            // PyTorch's (inaccurate) wording; only the CUDA-specific keys raise it in 2.11.
            tracing::warn!(
                "backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and garbage_collect_threshold."
            );
        }

        c.last_conf = s.to_string();
        *self = c;
        Ok(())
    }

    fn apply_common(&mut self, e: &Entry<'_>) -> Result<(), ConfigError> {
        let key = e.key;
        match key {
            "max_split_size_mb" | "max_non_split_rounding_mb" => {
                let (t, _) = scalar(e)?;
                let mb = uint(key, t)?;
                let min = self.large_segment_size / MIB;
                if mb < min {
                    let value = t.to_string();
                    return Err(if key == "max_split_size_mb" {
                        ConfigError::MaxSplitTooSmall { value, min }
                    } else {
                        ConfigError::MaxNonSplitRoundingTooSmall { value, min }
                    });
                }
                if key == "max_split_size_mb" {
                    self.max_split_size = mib_clamped(mb);
                } else {
                    self.max_non_split_rounding_size = mib_clamped(mb);
                }
            }
            "garbage_collection_threshold" => {
                let (t, _) = scalar(e)?;
                let v = float(key, t)?;
                // written so that NaN fails, as PyTorch's `v > 0 && v < 1` does
                if !(v > 0.0 && v < 1.0) {
                    return Err(ConfigError::GarbageCollectionThreshold {
                        value: t.to_string(),
                    });
                }
                self.garbage_collection_threshold = v;
            }
            KEY_ROUNDUP => self.apply_roundup(e)?,
            "expandable_segments" => {
                let (t, i) = scalar(e)?;
                self.expandable_segments = boolean(key, t, i)?;
            }
            "pinned_use_background_threads" => {
                let (t, i) = scalar(e)?;
                self.pinned_use_background_threads = boolean(key, t, i)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Spec 3.2. Single value: every entry, must be a power of two (0 rejected). List: each
    /// `B:v` sets the entry of interval `B` MiB; the first such pair also fills every entry
    /// below it; `>:v` fills every entry after the last explicit one (after entry 0 when none
    /// came yet, as 2.11's `last_index + 1` does). Entries are set in order.
    fn apply_roundup(&mut self, e: &Entry<'_>) -> Result<(), ConfigError> {
        match &e.value {
            Value::Scalar(t, _) => {
                let v = uint(KEY_ROUNDUP, t)?;
                if !v.is_power_of_two() {
                    return Err(ConfigError::RoundupDivisions {
                        value: t.to_string(),
                    });
                }
                self.roundup_power2_divisions = [v; INTERVALS];
            }
            Value::List(pairs) => {
                let table = &mut self.roundup_power2_divisions;
                let mut first = true;
                let mut last_index = 0usize;
                for &(interval, value) in pairs {
                    let v = uint(KEY_ROUNDUP, value)?;
                    if v != 0 && !v.is_power_of_two() {
                        return Err(ConfigError::RoundupListDivisions {
                            interval: interval.to_string(),
                            value: value.to_string(),
                        });
                    }
                    if interval == ">" {
                        for slot in table.iter_mut().skip(last_index + 1) {
                            *slot = v;
                        }
                        continue;
                    }
                    let b = uint(KEY_ROUNDUP, interval)?;
                    if !b.is_power_of_two() {
                        return Err(ConfigError::RoundupInterval {
                            interval: interval.to_string(),
                            value: value.to_string(),
                        });
                    }
                    let idx = interval_index(b);
                    if first {
                        table[..idx].fill(v);
                        first = false;
                    }
                    table[idx] = v;
                    last_index = idx;
                }
            }
        }
        Ok(())
    }

    /// Returns whether `e` was a CUDA key.
    fn apply_cuda(
        &mut self,
        e: &Entry<'_>,
        scope: ConfigScope,
        used_async: &mut bool,
    ) -> Result<bool, ConfigError> {
        let key = e.key;
        match key {
            "backend" => {
                let (t, _) = scalar(e)?;
                let parsed = match t {
                    "native" => Backend::Native,
                    "cudaMallocAsync" => Backend::CudaMallocAsync,
                    _ => {
                        return Err(ConfigError::UnknownBackend {
                            value: t.to_string(),
                        })
                    }
                };
                // The backend is fixed at library load; 2.11 asserts at runtime.
                if scope == ConfigScope::Accelerator && parsed != self.backend {
                    return Err(ConfigError::BackendChanged {
                        parsed,
                        current: self.backend,
                    });
                }
                self.backend = parsed;
                *used_async = parsed == Backend::CudaMallocAsync;
            }
            "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                let (t, i) = scalar(e)?;
                self.release_lock_on_cudamalloc = boolean(key, t, i)?;
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                let (t, i) = scalar(e)?;
                self.pinned_use_cuda_host_register = boolean(key, t, i)?;
            }
            "pinned_num_register_threads" => {
                let (t, _) = scalar(e)?;
                let v = uint(key, t)?;
                if !v.is_power_of_two() {
                    return Err(ConfigError::RegisterThreadsNotPowerOfTwo {
                        value: t.to_string(),
                    });
                }
                if v > PINNED_MAX_REGISTER_THREADS {
                    return Err(ConfigError::TooManyRegisterThreads {
                        value: t.to_string(),
                    });
                }
                self.pinned_num_register_threads = v;
            }
            "pinned_reserve_segment_size_mb" => {
                let (t, _) = scalar(e)?;
                let v = uint(key, t)?;
                if v == 0 {
                    return Err(ConfigError::PinnedReserveSegmentSize {
                        value: t.to_string(),
                    });
                }
                self.pinned_reserve_segment_size_mb = v;
            }
            "graph_capture_record_stream_reuse" => {
                let (t, i) = scalar(e)?;
                self.graph_capture_record_stream_reuse = boolean(key, t, i)?;
            }
            "per_process_memory_fraction" => {
                let (t, _) = scalar(e)?;
                let v = float(key, t)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(ConfigError::MemoryFraction {
                        value: t.to_string(),
                    });
                }
                self.per_process_memory_fraction = v;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The `max_split_size` stat: the byte value as `int64`, so unlimited (`SIZE_MAX`) is -1.
    pub fn max_split_size_stat(&self) -> i64 {
        self.max_split_size as i64
    }

    /// Divisions for a request of `size` bytes (spec 3.2): entry `floor(log2(size)) − 20`,
    /// clamped to `[0, 15]`; sub-MiB sizes (and 0, which never reaches rounding) use entry 0.
    #[inline]
    pub fn divisions_for(&self, size: u64) -> u64 {
        let idx = if size == 0 {
            0
        } else {
            (size.ilog2() as usize)
                .saturating_sub(20)
                .min(INTERVALS - 1)
        };
        self.roundup_power2_divisions[idx]
    }

    /// The snapshot's `allocator_settings`.
    pub fn to_settings(&self) -> AllocatorSettings {
        AllocatorSettings {
            pytorch_cuda_alloc_conf: self.last_conf.clone(),
            max_split_size: self.max_split_size_stat(),
            garbage_collection_threshold: self.garbage_collection_threshold,
            expandable_segments: self.expandable_segments,
            pinned_num_register_threads: self.pinned_num_register_threads as i64,
            release_lock_on_cudamalloc: self.release_lock_on_cudamalloc,
            pinned_use_cuda_host_register: self.pinned_use_cuda_host_register,
            graph_capture_record_stream_reuse: self.graph_capture_record_stream_reuse,
            roundup_power2_divisions: self
                .roundup_power2_divisions
                .iter()
                .enumerate()
                .map(|(i, &v)| ((1u64 << i).to_string(), v as i64))
                .collect(),
        }
    }

    /// A configuration from a snapshot's `allocator_settings`.
    ///
    /// The conf string is re-parsed first (if it does not parse here, defaults stand in), because it is the only source of the keys the
    /// settings dict does not carry (large segment size, non-split rounding, backend, the
    /// remaining pinned keys, memory fraction). The dict's fields are then laid over it:
    /// when a runtime `_set_allocator_settings` call only named some keys, the string alone
    /// would miss values set earlier, while the dict reports what was in force.
    pub fn from_settings(s: &AllocatorSettings) -> Result<Self, ConfigError> {
        let mut c = match Self::parse(&s.pytorch_cuda_alloc_conf) {
            Ok(c) => c,
            Err(e) => {
                // PyTorch accepted this string (its parser is more lenient, e.g. `128MB`);
                // the fields below still carry what was in force.
                tracing::warn!(
                    "allocator_settings.PYTORCH_CUDA_ALLOC_CONF {:?} does not parse ({e}); using the settings fields",
                    s.pytorch_cuda_alloc_conf
                );
                AllocatorConfig {
                    last_conf: s.pytorch_cuda_alloc_conf.clone(),
                    ..AllocatorConfig::default()
                }
            }
        };
        let bad = |field: &str, value: String| ConfigError::InvalidSetting {
            field: field.to_string(),
            value,
        };
        // The int64 bit pattern round-trips SIZE_MAX through -1 and any clamped value
        // (the largest, `(2^64/MiB - 1) MiB`, reads as -1 MiB). Any other value came through
        // PyTorch's parser as whole MiB no smaller than the large segment size
        // (`max_split_size_mb too small, must be >= 20`); a snapshot saying 0 or 1 byte was
        // not written by PyTorch, and replaying it as a 1-byte split limit would answer
        // for an allocator that cannot exist. It is refused, naming the rule.
        c.max_split_size = match s.max_split_size {
            -1 => u64::MAX,
            v => {
                let bytes = v as u64;
                if !bytes.is_multiple_of(MIB) || bytes < c.large_segment_size {
                    return Err(ConfigError::InvalidSetting {
                        field: "max_split_size".into(),
                        value: format!(
                            "{v} (PyTorch's max_split_size is -1 for unlimited or whole MiB of at least the large segment size, {} bytes; max_split_size_mb too small, must be >= {})",
                            c.large_segment_size,
                            c.large_segment_size / MIB
                        ),
                    });
                }
                bytes
            }
        };
        let gc = s.garbage_collection_threshold;
        if !(0.0..1.0).contains(&gc) {
            return Err(bad("garbage_collection_threshold", gc.to_string()));
        }
        c.garbage_collection_threshold = gc;
        c.expandable_segments = s.expandable_segments;
        let threads = s.pinned_num_register_threads;
        if threads < 1
            || !(threads as u64).is_power_of_two()
            || threads as u64 > PINNED_MAX_REGISTER_THREADS
        {
            return Err(bad("pinned_num_register_threads", threads.to_string()));
        }
        c.pinned_num_register_threads = threads as u64;
        c.release_lock_on_cudamalloc = s.release_lock_on_cudamalloc;
        c.pinned_use_cuda_host_register = s.pinned_use_cuda_host_register;
        c.graph_capture_record_stream_reuse = s.graph_capture_record_stream_reuse;
        for (k, &v) in &s.roundup_power2_divisions {
            let field = format!("{KEY_ROUNDUP}[{k:?}]");
            let idx = k
                .parse::<u64>()
                .ok()
                .filter(|b| b.is_power_of_two() && b.ilog2() < INTERVALS as u32)
                .map(|b| b.ilog2() as usize)
                .ok_or_else(|| bad(&field, v.to_string()))?;
            if v < 0 || (v != 0 && !(v as u64).is_power_of_two()) {
                return Err(bad(&field, v.to_string()));
            }
            c.roundup_power2_divisions[idx] = v as u64;
        }
        Ok(c)
    }

    /// What this config is, as a conf string a user can read and pass back: the string it
    /// was parsed from (`last_conf`) when that string still says exactly what is in force,
    /// else the canonical string of what is in force ([`fmt::Display`]). The two differ for
    /// a config read from a snapshot whose settings fields say more than its string (a
    /// runtime `_set_allocator_settings`, or a hand-edited `max_split_size`), and for a
    /// string PyTorch's lenient parser took but ours does not. `""` for all defaults.
    pub fn conf_string(&self) -> String {
        let mut in_force = self.clone();
        in_force.last_conf.clear();
        if let Ok(mut parsed) = Self::parse(&self.last_conf) {
            parsed.last_conf.clear();
            if parsed == in_force {
                return self.last_conf.clone();
            }
        }
        in_force.to_string()
    }

    fn fmt_roundup(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.roundup_power2_divisions;
        if t.iter().all(|&v| v == t[0]) {
            return write!(f, "{KEY_ROUNDUP}:{}", t[0]);
        }
        // Shortest list the parser rebuilds exactly: the first pair covers the leading run
        // (first-pair-fills-below), `>` the trailing run, explicit pairs everything between.
        let p = t.iter().take_while(|&&v| v == t[0]).count() - 1;
        let q = INTERVALS
            - t.iter()
                .rev()
                .take_while(|&&v| v == t[INTERVALS - 1])
                .count();
        write!(f, "{KEY_ROUNDUP}:[")?;
        for (i, v) in t.iter().enumerate().take(q).skip(p) {
            write!(f, "{}:{v},", 1u64 << i)?;
        }
        write!(f, ">:{}]", t[INTERVALS - 1])
    }
}

impl FromStr for AllocatorConfig {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        AllocatorConfig::parse(s)
    }
}

/// A canonical conf string: only the keys that differ from their defaults, in a fixed
/// order. Parsing it yields a config equal to `self` except for `last_conf` (which then
/// holds this string), for every config a parse can produce (sizes in whole MiB, valid
/// values). `max_non_split_rounding_mb` is printed when it differs from the large segment
/// size, since that is what a parse resets it to.
impl fmt::Display for AllocatorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = AllocatorConfig::default();
        let mut sep = "";
        let mut item = |f: &mut fmt::Formatter<'_>,
                        body: &dyn Fn(&mut fmt::Formatter<'_>) -> fmt::Result|
         -> fmt::Result {
            f.write_str(sep)?;
            sep = ",";
            body(f)
        };
        let tf = |b: bool| if b { "True" } else { "False" };
        if self.backend != d.backend {
            item(f, &|f| write!(f, "backend:{}", self.backend))?;
        }
        if self.large_segment_size != d.large_segment_size {
            item(f, &|f| {
                write!(f, "large_segment_size_mb:{}", self.large_segment_size / MIB)
            })?;
        }
        if self.max_split_size != d.max_split_size {
            item(f, &|f| {
                write!(f, "max_split_size_mb:{}", self.max_split_size / MIB)
            })?;
        }
        if self.max_non_split_rounding_size != self.large_segment_size {
            item(f, &|f| {
                write!(
                    f,
                    "max_non_split_rounding_mb:{}",
                    self.max_non_split_rounding_size / MIB
                )
            })?;
        }
        if self.garbage_collection_threshold != d.garbage_collection_threshold {
            // Debug is Rust's shortest round-trip form and switches to exponents for
            // extreme magnitudes, which the float reader accepts.
            item(f, &|f| {
                write!(
                    f,
                    "garbage_collection_threshold:{:?}",
                    self.garbage_collection_threshold
                )
            })?;
        }
        if self.roundup_power2_divisions != d.roundup_power2_divisions {
            item(f, &|f| self.fmt_roundup(f))?;
        }
        let bools = [
            ("expandable_segments", self.expandable_segments),
            (
                "pinned_use_background_threads",
                self.pinned_use_background_threads,
            ),
            (
                "release_lock_on_cudamalloc",
                self.release_lock_on_cudamalloc,
            ),
            (
                "pinned_use_cuda_host_register",
                self.pinned_use_cuda_host_register,
            ),
        ];
        for (k, v) in bools {
            if v {
                item(f, &|f| write!(f, "{k}:{}", tf(v)))?;
            }
        }
        if self.pinned_num_register_threads != d.pinned_num_register_threads {
            item(f, &|f| {
                write!(
                    f,
                    "pinned_num_register_threads:{}",
                    self.pinned_num_register_threads
                )
            })?;
        }
        if self.pinned_reserve_segment_size_mb != d.pinned_reserve_segment_size_mb {
            item(f, &|f| {
                write!(
                    f,
                    "pinned_reserve_segment_size_mb:{}",
                    self.pinned_reserve_segment_size_mb
                )
            })?;
        }
        if self.graph_capture_record_stream_reuse {
            item(f, &|f| write!(f, "graph_capture_record_stream_reuse:True"))?;
        }
        if self.per_process_memory_fraction != d.per_process_memory_fraction {
            item(f, &|f| {
                write!(
                    f,
                    "per_process_memory_fraction:{:?}",
                    self.per_process_memory_fraction
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::ffi::OsString;

    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/spec/golden/");

    fn probe() -> serde_json::Value {
        let path = format!("{GOLDEN}probe.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("golden file {path}: {e}"));
        serde_json::from_str(&text).expect("probe.json")
    }

    fn ok(s: &str) -> AllocatorConfig {
        AllocatorConfig::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn err(s: &str) -> ConfigError {
        match AllocatorConfig::parse(s) {
            Ok(c) => panic!("{s:?} parsed to {c:?}"),
            Err(e) => e,
        }
    }

    fn upd_err(s: &str) -> ConfigError {
        let mut c = AllocatorConfig::default();
        match c.update(s) {
            Ok(()) => panic!("{s:?} was accepted"),
            Err(e) => e,
        }
    }

    fn table(pairs: &[(usize, u64)]) -> [u64; 16] {
        let mut t = [0; 16];
        for &(i, v) in pairs {
            t[i] = v;
        }
        t
    }

    // ---- defaults, tokenizer ----

    #[test]
    fn empty_string_is_defaults() {
        assert_eq!(ok(""), AllocatorConfig::default());
        assert_eq!(ok(" \t\n"), AllocatorConfig::default().with_conf(" \t\n"));
        assert_eq!(AllocatorConfig::default().max_split_size_stat(), -1);
        assert_eq!(AllocatorConfig::default().to_string(), "");
    }

    impl AllocatorConfig {
        fn with_conf(mut self, s: &str) -> Self {
            self.last_conf = s.to_string();
            self
        }
    }

    #[test]
    fn tokenizer_splits_delimiters_and_drops_whitespace() {
        assert_eq!(
            tokenize(" a : 1 2 ,b:[ 1:2 ,>:4 ]\x0B\x0C\r"),
            ["a", ":", "12", ",", "b", ":", "[", "1", ":", "2", ",", ">", ":", "4", "]"]
        );
    }

    #[test]
    fn whitespace_anywhere_is_dropped() {
        let c = ok(" max_split_size_mb : 1 28 ,\texpandable_segments:\nTr ue\r\n");
        assert_eq!(c.max_split_size, 128 << 20);
        assert!(c.expandable_segments);
        assert_eq!(
            ok("roundup_power2_divisions : [ 25 6 : 1 , > : 8 ]").roundup_power2_divisions,
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 8, 8, 8, 8, 8, 8, 8]
        );
    }

    // ---- every key ----

    #[test]
    fn max_split_size_mb() {
        let c = ok("max_split_size_mb:128");
        assert_eq!(c.max_split_size, 128 << 20);
        assert_eq!(c.max_split_size_stat(), 134_217_728);
        assert_eq!(ok("max_split_size_mb:20").max_split_size, 20 << 20);
        let e = err("max_split_size_mb:19");
        assert_eq!(
            e,
            ConfigError::MaxSplitTooSmall {
                value: "19".into(),
                min: 20
            }
        );
        assert_eq!(
            e.pytorch_message(),
            "CachingAllocator option max_split_size_mb too small, must be >= 20"
        );
        assert!(e.to_string().contains("'19'"));
        // PyTorch clamps to SIZE_MAX / 1 MiB before multiplying
        let huge = ok("max_split_size_mb:18446744073709551615");
        assert_eq!(huge.max_split_size, (u64::MAX >> 20) << 20);
        assert_eq!(huge.max_split_size_stat(), -(1 << 20));
    }

    #[test]
    fn max_non_split_rounding_mb() {
        let c = ok("max_non_split_rounding_mb:64");
        assert_eq!(c.max_non_split_rounding_size, 64 << 20);
        let e = err("max_non_split_rounding_mb:10");
        assert_eq!(
            e.pytorch_message(),
            "CachingAllocator option max_non_split_rounding_mb too small, must be >= 20"
        );
        assert!(e.to_string().contains("max_non_split_rounding_mb"));
    }

    #[test]
    fn large_segment_size_mb_is_parsed_first() {
        let c = ok("large_segment_size_mb:64");
        assert_eq!(c.large_segment_size, 64 << 20);
        assert_eq!(c.max_non_split_rounding_size, 64 << 20);
        assert_eq!(ok("large_segment_size_mb:11").large_segment_size, 11 << 20);
        let e = err("large_segment_size_mb:10");
        assert_eq!(
            e.pytorch_message(),
            "CachingAllocator option large_segment_size_mb must be > 10 MB"
        );
        // the minimums follow the large segment size wherever it appears in the string
        assert_eq!(
            err("max_split_size_mb:24,large_segment_size_mb:32"),
            ConfigError::MaxSplitTooSmall {
                value: "24".into(),
                min: 32
            }
        );
        assert!(matches!(
            err("max_non_split_rounding_mb:24,large_segment_size_mb:32"),
            ConfigError::MaxNonSplitRoundingTooSmall { min: 32, .. }
        ));
        let c = ok("max_split_size_mb:12,large_segment_size_mb:12");
        assert_eq!(c.max_split_size, 12 << 20);
        // a smaller large segment also lowers the minimum below 20
        assert_eq!(
            ok("large_segment_size_mb:12,max_non_split_rounding_mb:12").max_non_split_rounding_size,
            12 << 20
        );
        // the last occurrence wins
        assert_eq!(
            ok("large_segment_size_mb:12,large_segment_size_mb:40").large_segment_size,
            40 << 20
        );
    }

    #[test]
    fn garbage_collection_threshold() {
        assert_eq!(
            ok("garbage_collection_threshold:0.7").garbage_collection_threshold,
            0.7
        );
        assert_eq!(
            ok("garbage_collection_threshold:1e-3").garbage_collection_threshold,
            0.001
        );
        for bad in ["1.5", "0", "1", "1.0", "-0.5", "nan", "inf"] {
            let e = err(&format!("garbage_collection_threshold:{bad}"));
            assert_eq!(
                e.pytorch_message(),
                "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
                "{bad}"
            );
            assert!(e.to_string().contains(bad));
        }
        assert_eq!(
            err("garbage_collection_threshold:0.5abc"),
            ConfigError::InvalidFloat {
                key: "garbage_collection_threshold".into(),
                value: "0.5abc".into()
            }
        );
    }

    #[test]
    fn roundup_single_value() {
        assert_eq!(
            ok("roundup_power2_divisions:4").roundup_power2_divisions,
            [4; 16]
        );
        assert_eq!(
            ok("roundup_power2_divisions:1").roundup_power2_divisions,
            [1; 16]
        );
        for bad in ["3", "0", "6"] {
            let e = err(&format!("roundup_power2_divisions:{bad}"));
            assert_eq!(
                e.pytorch_message(),
                "For roundups, the divisions has to be power of 2 "
            );
            assert!(e.to_string().contains(bad));
        }
    }

    #[test]
    fn roundup_list_measured_table() {
        let c = ok("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
        assert_eq!(
            c.roundup_power2_divisions,
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8]
        );
        // entry B governs [B, 2B) MiB (spec 3.2, measured on 2.11)
        assert_eq!(c.divisions_for(600 << 20), 2);
        assert_eq!(c.divisions_for(1_395_864_371), 4); // 1.3 GiB
        assert_eq!(c.divisions_for(2_254_857_830), 8); // 2.1 GiB
        assert_eq!(c.divisions_for(511 << 20), 1);
        assert_eq!(c.divisions_for(512 << 20), 2);
        assert_eq!(c.divisions_for(1023 << 20), 2);
        assert_eq!(c.divisions_for(716_800), 1);
        assert_eq!(c.divisions_for(100 << 30), 8);
        // the probe's reported settings
        let p = probe();
        let want = &p["roundup"]["roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"]["settings"];
        let got = serde_json::to_value(c.to_settings().roundup_power2_divisions).unwrap();
        assert_eq!(&got, want);
        let want4 = &p["roundup"]["roundup_power2_divisions:4"]["settings"];
        let got4 = serde_json::to_value(
            ok("roundup_power2_divisions:4")
                .to_settings()
                .roundup_power2_divisions,
        )
        .unwrap();
        assert_eq!(&got4, want4);
    }

    #[test]
    fn roundup_list_first_pair_fills_below() {
        // 64 MiB is index 6: entries 0..=6 get 8; 256 MiB (index 8) gets 4; 7 stays 0
        assert_eq!(
            ok("roundup_power2_divisions:[64:8,256:4]").roundup_power2_divisions,
            table(&[
                (0, 8),
                (1, 8),
                (2, 8),
                (3, 8),
                (4, 8),
                (5, 8),
                (6, 8),
                (8, 4)
            ])
        );
        // only the first pair fills below, even if a later one has a lower interval
        assert_eq!(
            ok("roundup_power2_divisions:[256:4,1:2]").roundup_power2_divisions,
            table(&[
                (0, 2),
                (1, 4),
                (2, 4),
                (3, 4),
                (4, 4),
                (5, 4),
                (6, 4),
                (7, 4),
                (8, 4)
            ])
        );
        // the AllocatorConfig.h example
        assert_eq!(
            ok("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]").roundup_power2_divisions,
            [8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 4, 1, 1, 1, 1, 1]
        );
    }

    #[test]
    fn roundup_list_edges() {
        // `>` fills after the last explicit entry; with none yet, after entry 0
        assert_eq!(
            ok("roundup_power2_divisions:[>:8]").roundup_power2_divisions,
            [0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]
        );
        assert_eq!(
            ok("roundup_power2_divisions:[1:2,>:4]").roundup_power2_divisions,
            [2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]
        );
        // intervals beyond 32768 MiB clamp to the last entry
        assert_eq!(
            ok("roundup_power2_divisions:[65536:2]").roundup_power2_divisions,
            [2; 16]
        );
        // zero disables an interval; an empty list leaves everything off
        assert_eq!(
            ok("roundup_power2_divisions:[256:0,>:4]").roundup_power2_divisions,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4]
        );
        assert_eq!(
            ok("roundup_power2_divisions:[]").roundup_power2_divisions,
            [0; 16]
        );
        // trailing comma inside the list, as PyTorch's loop allows
        assert_eq!(
            ok("roundup_power2_divisions:[1:2,]").roundup_power2_divisions,
            [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        // a second occurrence applies over the first
        assert_eq!(
            ok("roundup_power2_divisions:4,roundup_power2_divisions:[>:8]")
                .roundup_power2_divisions,
            [4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]
        );
    }

    #[test]
    fn roundup_list_errors() {
        let e = err("roundup_power2_divisions:[256:3]");
        assert_eq!(
            e.pytorch_message(),
            "For roundups, the divisions has to be power of 2 or 0 to disable roundup "
        );
        assert!(e.to_string().contains("256:3"));
        for bad in ["[3:2]", "[0:2]", "[100:2]"] {
            let e = err(&format!("roundup_power2_divisions:{bad}"));
            assert_eq!(
                e.pytorch_message(),
                "For roundups, the intervals have to be power of 2 ",
                "{bad}"
            );
        }
        assert!(matches!(
            err("roundup_power2_divisions:[256MB:2]"),
            ConfigError::InvalidInteger { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[256:1"),
            ConfigError::UnclosedList { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[256:1,"),
            ConfigError::UnclosedList { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:["),
            ConfigError::UnclosedList { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[256]"),
            ConfigError::ExpectedToken { expected: ':', .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[256:]"),
            ConfigError::MissingValue { .. }
        ));
        // whitespace is dropped, so this reads `[256:1512:2]`
        assert!(matches!(
            err("roundup_power2_divisions:[256:1 512:2]"),
            ConfigError::ExpectedToken { expected: ',', .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[256:1:2]"),
            ConfigError::ExpectedToken { expected: ',', .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[,]"),
            ConfigError::ExpectedToken { expected: ']', .. }
        ));
    }

    #[test]
    fn boolean_keys() {
        let c = ok(
            "expandable_segments:True,pinned_use_background_threads:True,\
                    release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,\
                    graph_capture_record_stream_reuse:True",
        );
        assert!(c.expandable_segments);
        assert!(c.pinned_use_background_threads);
        assert!(c.release_lock_on_cudamalloc);
        assert!(c.pinned_use_cuda_host_register);
        assert!(c.graph_capture_record_stream_reuse);
        let c = ok("expandable_segments:False");
        assert!(!c.expandable_segments);
        // ROCm aliases
        assert!(ok("release_lock_on_hipmalloc:True").release_lock_on_cudamalloc);
        assert!(ok("pinned_use_hip_host_register:True").pinned_use_cuda_host_register);
        for key in [
            "expandable_segments",
            "pinned_use_background_threads",
            "release_lock_on_cudamalloc",
            "release_lock_on_hipmalloc",
            "pinned_use_cuda_host_register",
            "pinned_use_hip_host_register",
            "graph_capture_record_stream_reuse",
        ] {
            for bad in ["true", "1", "FALSE", "yes"] {
                let e = err(&format!("{key}:{bad}"));
                assert_eq!(
                    e,
                    ConfigError::InvalidBool {
                        key: key.into(),
                        value: bad.into(),
                        index: 2
                    }
                );
                assert!(e.to_string().contains(key));
            }
        }
        assert_eq!(
            err("expandable_segments:true").pytorch_message(),
            "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'"
        );
        assert!(matches!(
            err("max_split_size_mb:64,expandable_segments:true"),
            ConfigError::InvalidBool { index: 6, .. }
        ));
    }

    #[test]
    fn backend_key() {
        assert_eq!(ok("backend:native").backend, Backend::Native);
        assert_eq!(
            ok("backend:cudaMallocAsync").backend,
            Backend::CudaMallocAsync
        );
        // warns (the CUDA-specific key), still parses
        let c = ok("backend:cudaMallocAsync,release_lock_on_cudamalloc:True");
        assert!(c.release_lock_on_cudamalloc);
        let e = err("backend:hipMallocAsync");
        assert_eq!(
            e.pytorch_message(),
            "Unknown allocator backend, options are native and cudaMallocAsync"
        );
        assert!(e.to_string().contains("hipMallocAsync"));
        // cannot change at runtime
        let e = upd_err("backend:cudaMallocAsync");
        assert_eq!(
            e.to_string(),
            "Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native"
        );
        let mut c = AllocatorConfig::default();
        c.update("backend:native").unwrap();
        let mut a = ok("backend:cudaMallocAsync");
        a.update("backend:cudaMallocAsync").unwrap();
        assert!(a.update("backend:native").is_err());
    }

    #[test]
    fn pinned_num_register_threads() {
        assert_eq!(
            ok("pinned_num_register_threads:8").pinned_num_register_threads,
            8
        );
        assert_eq!(
            ok("pinned_num_register_threads:128").pinned_num_register_threads,
            128
        );
        let e = err("pinned_num_register_threads:3");
        assert_eq!(
            e.pytorch_message(),
            "Number of register threads has to be power of 2, got 3"
        );
        assert!(matches!(
            err("pinned_num_register_threads:0"),
            ConfigError::RegisterThreadsNotPowerOfTwo { .. }
        ));
        let e = err("pinned_num_register_threads:256");
        assert_eq!(
            e.pytorch_message(),
            "Number of register threads should be less than or equal to 128, got 256"
        );
    }

    #[test]
    fn pinned_reserve_segment_size_mb() {
        assert_eq!(
            ok("pinned_reserve_segment_size_mb:64").pinned_reserve_segment_size_mb,
            64
        );
        let e = err("pinned_reserve_segment_size_mb:0");
        assert_eq!(
            e.pytorch_message(),
            "Pinned reserve segment size has to be greater than 0"
        );
        assert!(e.to_string().contains("pinned_reserve_segment_size_mb:0"));
    }

    #[test]
    fn per_process_memory_fraction() {
        assert_eq!(
            ok("per_process_memory_fraction:0.5").per_process_memory_fraction,
            0.5
        );
        assert_eq!(
            ok("per_process_memory_fraction:0").per_process_memory_fraction,
            0.0
        );
        assert_eq!(
            ok("per_process_memory_fraction:1").per_process_memory_fraction,
            1.0
        );
        for bad in ["1.5", "-0.1", "nan"] {
            let e = err(&format!("per_process_memory_fraction:{bad}"));
            assert_eq!(
                e.pytorch_message(),
                "per_process_memory_fraction is invalid, set it in [0.0, 1.0]"
            );
        }
        assert!(matches!(
            err("per_process_memory_fraction:half"),
            ConfigError::InvalidFloat { .. }
        ));
    }

    #[test]
    fn all_keys_together() {
        let c = ok(
            "backend:native,large_segment_size_mb:32,max_split_size_mb:256,\
                    max_non_split_rounding_mb:64,garbage_collection_threshold:0.6,\
                    roundup_power2_divisions:[256:1,>:4],expandable_segments:True,\
                    pinned_use_background_threads:True,release_lock_on_cudamalloc:True,\
                    pinned_use_cuda_host_register:True,pinned_num_register_threads:16,\
                    pinned_reserve_segment_size_mb:128,graph_capture_record_stream_reuse:True,\
                    per_process_memory_fraction:0.25",
        );
        assert_eq!(c.large_segment_size, 32 << 20);
        assert_eq!(c.max_split_size, 256 << 20);
        assert_eq!(c.max_non_split_rounding_size, 64 << 20);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert_eq!(
            c.roundup_power2_divisions,
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4]
        );
        assert!(c.expandable_segments && c.pinned_use_background_threads);
        assert!(c.release_lock_on_cudamalloc && c.pinned_use_cuda_host_register);
        assert!(c.graph_capture_record_stream_reuse);
        assert_eq!(c.pinned_num_register_threads, 16);
        assert_eq!(c.pinned_reserve_segment_size_mb, 128);
        assert_eq!(c.per_process_memory_fraction, 0.25);
        assert_eq!(ok(&c.to_string()), c.clone().with_conf(&c.to_string()));
    }

    // ---- unknown keys and syntax ----

    #[test]
    fn unknown_keys_name_the_parser() {
        let e = err("bogus:1");
        assert_eq!(
            e.to_string(),
            "Unrecognized key 'bogus' in CUDA allocator config."
        );
        let e = upd_err("bogus_key:1");
        assert_eq!(
            e.to_string(),
            "Unrecognized key 'bogus_key' in Accelerator allocator config."
        );
        // newer-main keys do not exist in 2.11
        for k in [
            "throw_on_cudamalloc_oom:True",
            "pinned_free_catch_all:True",
            "expandable_segments_reserve:0.5",
        ] {
            assert!(matches!(err(k), ConfigError::UnrecognizedKey { .. }), "{k}");
        }
        // booleans are case-sensitive, so are keys
        assert!(matches!(
            err("Expandable_Segments:True"),
            ConfigError::UnrecognizedKey { .. }
        ));
        assert_eq!(
            err("max_split_size_mb=128"),
            ConfigError::UnrecognizedKey {
                key: "max_split_size_mb=128".into(),
                scope: ConfigScope::Cuda
            }
        );
        // an unknown key with a list value is still just unknown
        assert!(matches!(
            err("bogus:[1:2]"),
            ConfigError::UnrecognizedKey { .. }
        ));
    }

    #[test]
    fn error_precedence_follows_pytorch_passes() {
        // generic keys are checked before CUDA keys at init, wherever they appear
        assert!(matches!(
            err("pinned_num_register_threads:3,max_split_size_mb:1"),
            ConfigError::MaxSplitTooSmall { .. }
        ));
        // at init an unknown key is reported by the CUDA pass, after generic-key errors
        assert!(matches!(
            err("bogus:1,max_split_size_mb:1"),
            ConfigError::MaxSplitTooSmall { .. }
        ));
        // at runtime the generic pass rejects it first, in order
        assert!(matches!(
            upd_err("bogus:1,max_split_size_mb:1"),
            ConfigError::UnrecognizedKey { .. }
        ));
        // large_segment_size_mb before everything
        assert!(matches!(
            err("max_split_size_mb:1,large_segment_size_mb:5"),
            ConfigError::LargeSegmentTooSmall { .. }
        ));
    }

    #[test]
    fn syntax_errors() {
        assert!(matches!(
            err("max_split_size_mb"),
            ConfigError::ExpectedToken { expected: ':', .. }
        ));
        assert_eq!(
            err("max_split_size_mb:"),
            ConfigError::MissingValue {
                key: "max_split_size_mb".into()
            }
        );
        assert_eq!(
            err("max_split_size_mb:"),
            ConfigError::MissingValue {
                key: "max_split_size_mb".into()
            }
        );
        assert!(matches!(
            err("max_split_size_mb:,expandable_segments:True"),
            ConfigError::MissingValue { .. }
        ));
        // PyTorch ignores its separator checks and would accept these two
        assert!(matches!(
            err("expandable_segments,True"),
            ConfigError::ExpectedToken { expected: ':', .. }
        ));
        let e = err("expandable_segments:True:max_split_size_mb:128");
        assert!(matches!(
            e,
            ConfigError::ExpectedToken { expected: ',', .. }
        ));
        assert!(e.to_string().contains("'True'"), "{e}");
        assert!(matches!(
            err(",expandable_segments:True"),
            ConfigError::UnexpectedToken { .. }
        ));
        assert!(matches!(
            err("expandable_segments:True,,max_split_size_mb:128"),
            ConfigError::UnexpectedToken { index: 4, .. }
        ));
        assert!(matches!(
            err("expandable_segments:[True]"),
            ConfigError::ListNotAllowed { .. }
        ));
        assert!(matches!(
            err("max_split_size_mb:[1:2]"),
            ConfigError::ListNotAllowed { .. }
        ));
        assert!(matches!(
            err("roundup_power2_divisions:[1:2]x"),
            ConfigError::ExpectedToken { expected: ',', .. }
        ));
        // a trailing comma is fine, as in PyTorch
        assert!(ok("expandable_segments:True,").expandable_segments);
    }

    #[test]
    fn integers_are_stricter_than_stoull() {
        for bad in ["12abc", "-1", "+128", "0x80", "1.5", "128MB"] {
            assert_eq!(
                err(&format!("max_split_size_mb:{bad}")),
                ConfigError::InvalidInteger {
                    key: "max_split_size_mb".into(),
                    value: bad.into()
                },
                "{bad}"
            );
        }
        assert!(matches!(
            err("max_split_size_mb:99999999999999999999999"),
            ConfigError::IntegerOutOfRange { .. }
        ));
        assert!(matches!(
            err("pinned_reserve_segment_size_mb:abc"),
            ConfigError::InvalidInteger { .. }
        ));
        assert!(matches!(
            err("large_segment_size_mb:big"),
            ConfigError::InvalidInteger { .. }
        ));
        assert_eq!(ok("max_split_size_mb:0128").max_split_size, 128 << 20);
    }

    #[test]
    fn probe_bad_settings_messages() {
        // `_set_allocator_settings` errors measured on 2.11
        let p = probe();
        let bad = p["bad_settings"].as_object().expect("bad_settings");
        assert_eq!(bad.len(), 6);
        for (conf, repr) in bad {
            let repr = repr.as_str().expect("repr string");
            let e = upd_err(conf);
            assert!(
                repr.contains(&e.pytorch_message()),
                "{conf}: {repr} vs {}",
                e.pytorch_message()
            );
        }
    }

    // ---- runtime update ----

    #[test]
    fn update_resets_four_settings_and_keeps_the_rest() {
        let mut c = ok("max_split_size_mb:128,garbage_collection_threshold:0.5,\
                        roundup_power2_divisions:4,expandable_segments:True,\
                        large_segment_size_mb:32,max_non_split_rounding_mb:64,\
                        pinned_num_register_threads:8,per_process_memory_fraction:0.5");
        c.update("release_lock_on_cudamalloc:True").unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.garbage_collection_threshold, 0.0);
        assert_eq!(c.roundup_power2_divisions, [0; 16]);
        assert_eq!(c.max_non_split_rounding_size, 32 << 20); // = large segment size
        assert!(c.expandable_segments);
        assert_eq!(c.large_segment_size, 32 << 20);
        assert_eq!(c.pinned_num_register_threads, 8);
        assert_eq!(c.per_process_memory_fraction, 0.5);
        assert!(c.release_lock_on_cudamalloc);
        assert_eq!(c.last_conf, "release_lock_on_cudamalloc:True");
        // the empty string is a valid update that records "" and resets the four
        c.update("max_split_size_mb:64").unwrap();
        assert_eq!(c.max_split_size, 64 << 20);
        c.update("").unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.last_conf, "");
        assert!(c.expandable_segments);
    }

    #[test]
    fn failed_update_changes_nothing() {
        let mut c = ok("max_split_size_mb:128,expandable_segments:True");
        let before = c.clone();
        for bad in [
            "expandable_segments:False,max_split_size_mb:1",
            "roundup_power2_divisions:4,bogus:1",
            "large_segment_size_mb:64,garbage_collection_threshold:2",
            "backend:cudaMallocAsync",
            "expandable_segments:False,pinned_num_register_threads:3",
        ] {
            assert!(c.update(bad).is_err(), "{bad}");
            assert_eq!(c, before, "{bad}");
        }
    }

    // ---- environment ----

    fn env(vars: &[(&str, &str)]) -> Result<AllocatorConfig, ConfigError> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        AllocatorConfig::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn env_precedence() {
        assert_eq!(env(&[]).unwrap(), AllocatorConfig::default());
        let c = env(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:128")]).unwrap();
        assert_eq!(c.max_split_size, 128 << 20);
        // probe env_both: the CUDA variable wins
        let c = env(&[
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:128"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512"),
        ])
        .unwrap();
        assert_eq!(c.max_split_size, 512 << 20);
        assert_eq!(c.last_conf, "max_split_size_mb:512");
        let c = env(&[
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:128"),
            ("PYTORCH_HIP_ALLOC_CONF", "max_split_size_mb:256"),
        ])
        .unwrap();
        assert_eq!(c.max_split_size, 256 << 20);
        // present but empty still shadows the later names
        let c = env(&[
            ("PYTORCH_CUDA_ALLOC_CONF", ""),
            ("PYTORCH_ALLOC_CONF", "max_split_size_mb:128"),
        ])
        .unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        // probe env_bad
        assert_eq!(
            env(&[("PYTORCH_CUDA_ALLOC_CONF", "bogus:1")])
                .unwrap_err()
                .to_string(),
            "Unrecognized key 'bogus' in CUDA allocator config."
        );
    }

    #[cfg(unix)]
    #[test]
    fn env_not_unicode() {
        use std::os::unix::ffi::OsStringExt;
        let r = AllocatorConfig::from_lookup(|k| {
            (k == "PYTORCH_ALLOC_CONF").then(|| OsString::from_vec(vec![0xff, b':']))
        });
        assert_eq!(
            r,
            Err(ConfigError::EnvNotUnicode {
                var: "PYTORCH_ALLOC_CONF".into()
            })
        );
    }

    #[test]
    fn from_env_reads_the_process_environment() {
        // Only asserts consistency with whatever the test process has set, so it cannot race
        // other tests that might set variables.
        let direct = AllocatorConfig::from_lookup(|k| std::env::var_os(k));
        assert_eq!(AllocatorConfig::from_env(), direct);
    }

    // ---- snapshots ----

    #[test]
    fn settings_match_the_probe() {
        let p = probe();
        for case in ["env_cuda", "env_alloc", "env_both", "env_large_seg"] {
            let r = &p["subprocesses"][case]["result"];
            let want = &r["settings"];
            let conf = want["PYTORCH_CUDA_ALLOC_CONF"].as_str().expect("conf");
            let c = ok(conf);
            let got = serde_json::to_value(c.to_settings()).unwrap();
            assert_eq!(&got, want, "{case}");
            assert_eq!(Some(c.max_split_size_stat()), r["max_split_stat"].as_i64());
            // and back
            let settings: AllocatorSettings = serde_json::from_value(want.clone()).unwrap();
            assert_eq!(
                AllocatorConfig::from_settings(&settings).unwrap(),
                c,
                "{case}"
            );
        }
        let hist = &p["history"]["allocator_settings"];
        let got = serde_json::to_value(ok("expandable_segments:False").to_settings()).unwrap();
        assert_eq!(&got, hist);
    }

    #[test]
    fn from_settings_max_split_size_is_what_pytorch_could_have_written() {
        let with = |v: i64| {
            AllocatorConfig::from_settings(&AllocatorSettings {
                max_split_size: v,
                ..AllocatorSettings::default()
            })
        };
        // -1 is unlimited; the clamped maximum (-1 MiB as int64) is a legal value too
        assert_eq!(with(-1).unwrap().max_split_size, u64::MAX);
        assert_eq!(
            with(-(1 << 20)).unwrap().max_split_size,
            (u64::MAX >> 20) << 20
        );
        let c = with(128 << 20).unwrap();
        assert_eq!(c.max_split_size, 128 << 20);
        // the label says what is in force, not the (empty) string
        assert_eq!(c.conf_string(), "max_split_size_mb:128");
        assert_eq!(
            with(20 << 20).unwrap().conf_string(),
            "max_split_size_mb:20"
        );
        // below the large segment size, not whole MiB, or another negative: refused
        for bad in [0, 1, 512, (19 << 20), (20 << 20) + 1, -2, -5 << 20 | 7] {
            let e = with(bad).unwrap_err();
            assert!(
                matches!(&e, ConfigError::InvalidSetting { field, .. } if field == "max_split_size"),
                "{bad}: {e:?}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&bad.to_string()) && msg.contains(">= 20"),
                "{msg}"
            );
        }
        // the minimum follows the large segment size of the conf string
        let s = AllocatorSettings {
            pytorch_cuda_alloc_conf: "large_segment_size_mb:64".into(),
            max_split_size: 32 << 20,
            ..AllocatorSettings::default()
        };
        assert!(AllocatorConfig::from_settings(&s).is_err());
    }

    #[test]
    fn conf_string_is_the_string_when_it_says_what_is_in_force() {
        assert_eq!(AllocatorConfig::default().conf_string(), "");
        let c = ok("expandable_segments:True, max_split_size_mb:128");
        assert_eq!(
            c.conf_string(),
            "expandable_segments:True, max_split_size_mb:128"
        );
        // a lenient PyTorch string with fields laid over it: the canonical form
        let c = AllocatorConfig::from_settings(&AllocatorSettings {
            pytorch_cuda_alloc_conf: "max_split_size_mb:128MB".into(),
            max_split_size: 128 << 20,
            ..AllocatorSettings::default()
        })
        .unwrap();
        assert_eq!(c.conf_string(), "max_split_size_mb:128");
    }

    #[test]
    fn from_settings_prefers_fields_over_a_partial_string() {
        let mut c = ok("large_segment_size_mb:32,expandable_segments:True");
        c.update("max_split_size_mb:64").unwrap();
        let back = AllocatorConfig::from_settings(&c.to_settings()).unwrap();
        // the string alone has no large segment size; the rest comes from the fields
        assert!(back.expandable_segments);
        assert_eq!(back.max_split_size, 64 << 20);
        assert_eq!(back.last_conf, "max_split_size_mb:64");
        // a string we cannot parse (PyTorch's stoull took "128MB") falls back to fields
        let s = AllocatorSettings {
            pytorch_cuda_alloc_conf: "max_split_size_mb:128MB".into(),
            max_split_size: 128 << 20,
            ..AllocatorSettings::default()
        };
        let c = AllocatorConfig::from_settings(&s).unwrap();
        assert_eq!(c.max_split_size, 128 << 20);
        assert_eq!(c.last_conf, "max_split_size_mb:128MB");
        // invalid fields are errors
        for s in [
            AllocatorSettings {
                garbage_collection_threshold: 1.5,
                ..AllocatorSettings::default()
            },
            AllocatorSettings {
                pinned_num_register_threads: 3,
                ..AllocatorSettings::default()
            },
            AllocatorSettings {
                roundup_power2_divisions: [("3".to_string(), 2)].into_iter().collect(),
                ..AllocatorSettings::default()
            },
            AllocatorSettings {
                roundup_power2_divisions: [("256".to_string(), 3)].into_iter().collect(),
                ..AllocatorSettings::default()
            },
        ] {
            assert!(matches!(
                AllocatorConfig::from_settings(&s),
                Err(ConfigError::InvalidSetting { .. })
            ));
        }
        assert_eq!(
            AllocatorConfig::from_settings(&AllocatorSettings::default()).unwrap(),
            AllocatorConfig::default()
        );
    }

    // ---- divisions lookup ----

    #[test]
    fn divisions_for_clamps_both_ends() {
        let c = AllocatorConfig {
            roundup_power2_divisions: std::array::from_fn(|i| 1 << i),
            ..AllocatorConfig::default()
        };
        assert_eq!(c.divisions_for(0), 1);
        assert_eq!(c.divisions_for(700), 1);
        assert_eq!(c.divisions_for((1 << 20) - 1), 1);
        assert_eq!(c.divisions_for(1 << 20), 1);
        assert_eq!(c.divisions_for(2 << 20), 2);
        assert_eq!(c.divisions_for((4 << 20) - 1), 2);
        assert_eq!(c.divisions_for(32 << 30), 1 << 15);
        assert_eq!(c.divisions_for((32 << 30) - 1), 1 << 14);
        assert_eq!(c.divisions_for(u64::MAX), 1 << 15);
        // roundup_power2_divisions:4 (spec 3.2 vectors): every size uses 4
        let four = ok("roundup_power2_divisions:4");
        for n in [700, 1_228_801, (3 << 20) + 1, 5 << 20, 33 << 20] {
            assert_eq!(four.divisions_for(n), 4);
        }
    }

    // ---- Display ----

    #[test]
    fn display_is_canonical() {
        assert_eq!(
            ok("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").to_string(),
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"
        );
        assert_eq!(
            ok(" expandable_segments : True , max_split_size_mb : 128 ").to_string(),
            "max_split_size_mb:128,expandable_segments:True"
        );
        assert_eq!(
            ok("roundup_power2_divisions:[1:4,>:4]").to_string(),
            "roundup_power2_divisions:4"
        );
        assert_eq!(
            ok("large_segment_size_mb:32").to_string(),
            "large_segment_size_mb:32"
        );
        assert_eq!(
            ok("garbage_collection_threshold:0.7,per_process_memory_fraction:0").to_string(),
            "garbage_collection_threshold:0.7,per_process_memory_fraction:0.0"
        );
        assert_eq!(
            "backend:cudaMallocAsync"
                .parse::<AllocatorConfig>()
                .unwrap()
                .to_string(),
            "backend:cudaMallocAsync"
        );
    }

    fn pow2_or_zero() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0u64), (0u32..8).prop_map(|k| 1u64 << k)]
    }

    prop_compose! {
        fn valid_config()(
            large in prop::option::of(11u64..200),
            split in prop::option::of(0u64..100_000),
            nonsplit in prop::option::of(0u64..100_000),
            gc in prop::option::of(1u32..u32::MAX),
            table in prop_oneof![
                Just([0u64; 16]),
                (0u32..8).prop_map(|k| [1u64 << k; 16]),
                prop::array::uniform16(pow2_or_zero()),
            ],
            bools in prop::array::uniform5(any::<bool>()),
            async_backend in any::<bool>(),
            threads in 0u32..8,
            reserve in prop::option::of(1u64..1_000_000),
            fraction in prop::option::of(0.0f64..=1.0),
        ) -> AllocatorConfig {
            let mut c = AllocatorConfig::default();
            if let Some(l) = large {
                c.large_segment_size = l << 20;
                c.max_non_split_rounding_size = l << 20;
            }
            let min = c.large_segment_size >> 20;
            if let Some(s) = split {
                c.max_split_size = (min + s) << 20;
            }
            if let Some(n) = nonsplit {
                c.max_non_split_rounding_size = (min + n) << 20;
            }
            if let Some(g) = gc {
                c.garbage_collection_threshold = g as f64 / u32::MAX as f64;
            }
            c.roundup_power2_divisions = table;
            c.expandable_segments = bools[0];
            c.pinned_use_background_threads = bools[1];
            c.release_lock_on_cudamalloc = bools[2];
            c.pinned_use_cuda_host_register = bools[3];
            c.graph_capture_record_stream_reuse = bools[4];
            if async_backend {
                c.backend = Backend::CudaMallocAsync;
            }
            c.pinned_num_register_threads = 1 << threads;
            if let Some(r) = reserve {
                c.pinned_reserve_segment_size_mb = r;
            }
            if let Some(f) = fraction {
                c.per_process_memory_fraction = f;
            }
            c
        }
    }

    /// Token soup that reaches deep into the parser.
    fn conf_like() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just(",".to_string()),
            Just(":".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(">".to_string()),
            Just(" ".to_string()),
            prop::sample::select(COMMON_KEYS.to_vec()).prop_map(str::to_string),
            prop::sample::select(CUDA_KEYS.to_vec()).prop_map(str::to_string),
            prop::sample::select(vec![
                "True",
                "False",
                "native",
                "cudaMallocAsync",
                "nan",
                "-1"
            ])
            .prop_map(str::to_string),
            any::<u64>().prop_map(|n| n.to_string()),
            (0u32..64).prop_map(|k| (1u64 << k).to_string()),
            any::<f64>().prop_map(|f| f.to_string()),
            // around u64::MAX / MiB and u64::MAX, where MiB values overflow bytes
            (0u64..4).prop_map(|d| ((u64::MAX >> 20) - 1 + d).to_string()),
            "[0-9]{15,25}",
            "[a-z_]{1,8}",
        ];
        prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn display_parse_round_trip(c in valid_config()) {
            let s = c.to_string();
            let back = AllocatorConfig::parse(&s);
            prop_assert_eq!(back, Ok(c.clone().with_conf(&s)), "{}", s);
            // and Display is a fixed point
            prop_assert_eq!(ok(&s).to_string(), s);
        }

        #[test]
        fn settings_round_trip(c in valid_config()) {
            let c = ok(&c.to_string());
            prop_assert_eq!(AllocatorConfig::from_settings(&c.to_settings()), Ok(c));
        }

        /// Whatever parses has byte quantities that agree with each other: whole MiB,
        /// above their minimums, nothing wrapped around to a small number.
        #[test]
        fn parsed_byte_quantities_are_consistent(s in conf_like()) {
            if let Ok(c) = AllocatorConfig::parse(&s) {
                prop_assert!(c.large_segment_size > MIN_LARGE_SEGMENT_MB * MIB, "{}", s);
                prop_assert_eq!(c.large_segment_size % MIB, 0);
                prop_assert!(c.max_non_split_rounding_size >= c.large_segment_size, "{}", s);
                prop_assert_eq!(c.max_non_split_rounding_size % MIB, 0);
                prop_assert!(
                    c.max_split_size == u64::MAX
                        || (c.max_split_size >= c.large_segment_size && c.max_split_size % MIB == 0),
                    "{}", s
                );
                for d in c.roundup_power2_divisions {
                    prop_assert!(d == 0 || d.is_power_of_two());
                }
                prop_assert!((0.0..1.0).contains(&c.garbage_collection_threshold));
                prop_assert!((0.0..=1.0).contains(&c.per_process_memory_fraction));
                // and the settings dict of it reads back as the same config
                prop_assert_eq!(AllocatorConfig::from_settings(&c.to_settings()), Ok(c.clone()));
                prop_assert!(AllocatorConfig::parse(&c.conf_string()).is_ok());
            }
        }

        /// MiB values saturate at `u64::MAX / MiB` MiB, as PyTorch clamps them: a larger
        /// value never gives fewer bytes than a smaller one (no wrap-around).
        #[test]
        fn mib_values_saturate_and_never_wrap(a in any::<u64>(), b in any::<u64>(), small in 0u64..1_000_000) {
            for key in ["large_segment_size_mb", "max_split_size_mb", "max_non_split_rounding_mb"] {
                let bytes = |v: u64| -> Option<u64> {
                    let c = AllocatorConfig::parse(&format!("{key}:{v}")).ok()?;
                    Some(match key {
                        "large_segment_size_mb" => c.large_segment_size,
                        "max_split_size_mb" => c.max_split_size,
                        _ => c.max_non_split_rounding_size,
                    })
                };
                for v in [a, b, small] {
                    if let Some(x) = bytes(v) {
                        prop_assert_eq!(x, v.min(u64::MAX / MIB) * MIB, "{}:{}", key, v);
                    } else {
                        // refused only for being below the key's minimum
                        prop_assert!(v <= 20, "{}:{} refused", key, v);
                    }
                }
                let (lo, hi) = (a.min(b), a.max(b));
                if let (Some(x), Some(y)) = (bytes(lo), bytes(hi)) {
                    prop_assert!(x <= y, "{}: {} -> {} but {} -> {}", key, lo, x, hi, y);
                }
            }
        }

        #[test]
        fn parse_never_panics(s in ".{0,64}") {
            let _ = AllocatorConfig::parse(&s);
            let mut c = AllocatorConfig::default();
            let before = c.clone();
            if c.update(&s).is_err() {
                prop_assert_eq!(c, before);
            }
        }

        #[test]
        fn parse_never_panics_on_conf_like_strings(s in conf_like()) {
            if let Ok(c) = AllocatorConfig::parse(&s) {
                // whatever parses has a Display that parses to the same config
                let d = c.to_string();
                prop_assert_eq!(AllocatorConfig::parse(&d), Ok(c.with_conf(&d)), "{} -> {}", s, d);
            }
            let mut c = ok("expandable_segments:True,large_segment_size_mb:40");
            let before = c.clone();
            if c.update(&s).is_err() {
                prop_assert_eq!(c, before);
            }
        }
    }
}
