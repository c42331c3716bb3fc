//! The server's configuration and the parsers for its user-facing values.
//!
//! Design note: everything a user types is parsed and checked here, before a model is
//! built or a socket bound, so a bad flag is one clear line and exit 2, never a half-started
//! server. Sizes use headroom's size syntax (`512MiB`, `1.5GB`, bytes), durations
//! headroom-load's (`5ms`, `2s`), the allocator config `PYTORCH_CUDA_ALLOC_CONF`'s.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use headroom_alloc::AllocatorConfig;
use headroom_workload::ModelSpec;

use crate::error::ServeError;
use crate::scheduler::LatencyTarget;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeDevice {
    /// Real compute on the host, under the caching allocator with a simulated capacity.
    Cpu,
    /// CUDA device `N` (`cuda` is `cuda:0`).
    Cuda(u32),
}

impl fmt::Display for ServeDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeDevice::Cpu => f.write_str("cpu"),
            ServeDevice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for ServeDevice {
    type Err = ServeError;
    fn from_str(s: &str) -> Result<Self, ServeError> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(ServeDevice::Cpu),
            "cuda" => Ok(ServeDevice::Cuda(0)),
            _ => match t.strip_prefix("cuda:").map(str::parse::<u32>) {
                Some(Ok(i)) => Ok(ServeDevice::Cuda(i)),
                _ => Err(ServeError::Config(format!(
                    "unknown device {s:?} (expected cpu, cuda or cuda:N)"
                ))),
            },
        }
    }
}

/// Memory kept free below the capacity: bytes or a share of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Margin {
    Bytes(u64),
    /// 0.0 ..< 1.0
    Fraction(f64),
}

impl Margin {
    pub fn bytes(&self, capacity: u64) -> u64 {
        match *self {
            Margin::Bytes(b) => b,
            Margin::Fraction(f) => (capacity as f64 * f).round() as u64,
        }
    }
}

impl FromStr for Margin {
    type Err = ServeError;
    /// `10%`, `256MiB`, `0`.
    fn from_str(s: &str) -> Result<Self, ServeError> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| ServeError::Config(format!("margin {s:?}: {p:?} is not a number")))?;
            if !(0.0..100.0).contains(&v) {
                return Err(ServeError::Config(format!(
                    "margin {s:?}: a percentage must be in 0..100"
                )));
            }
            return Ok(Margin::Fraction(v / 100.0));
        }
        headroom_alloc::size::parse_size(t)
            .map(Margin::Bytes)
            .map_err(|e| ServeError::Config(format!("margin {s:?}: {e} (or a percentage, 10%)")))
    }
}

impl fmt::Display for Margin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Margin::Bytes(b) => write!(f, "{}", headroom_alloc::size::human_bytes(*b)),
            Margin::Fraction(x) => write!(f, "{}%", x * 100.0),
        }
    }
}

impl FromStr for LatencyTarget {
    type Err = ServeError;
    /// `auto`, `off`, or a duration (`20ms`).
    fn from_str(s: &str) -> Result<Self, ServeError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(LatencyTarget::Auto),
            "off" | "none" => Ok(LatencyTarget::Off),
            t => {
                let d = parse_duration(t)?;
                if d.is_zero() {
                    return Err(ServeError::Config(
                        "a latency target must be more than 0 (or off)".into(),
                    ));
                }
                Ok(LatencyTarget::Fixed(d))
            }
        }
    }
}

/// `5ms`, `2s`, `1m`, `250us`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, ServeError> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if let Some(us) = t.strip_suffix("us") {
        return us
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| Duration::from_secs_f64(v / 1e6))
            .ok_or_else(|| ServeError::Config(format!("bad duration {s:?}")));
    }
    headroom_workload::parse_duration(t).map_err(|e| ServeError::Config(e.to_string()))
}

/// Everything `headroom serve` takes.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub model: ModelSpec,
    /// A Hugging Face decoder's answer: `--new N` tokens, `use_cache`.
    pub generation: crate::model::Generation,
    pub device: ServeDevice,
    /// Device capacity in bytes (on cpu: the simulated GPU the caching allocator manages).
    pub capacity: u64,
    pub alloc_conf: AllocatorConfig,
    pub margin: Margin,
    /// Most samples per batch; also the most one request may carry.
    pub max_batch: usize,
    pub max_wait: Duration,
    pub max_queue: usize,
    pub latency: LatencyTarget,
    /// Largest request body, bytes.
    pub max_body: usize,
    /// Compute threads.
    pub workers: usize,
    pub addr: SocketAddr,
    /// How long a graceful shutdown waits for queued and running requests.
    pub drain_timeout: Duration,
    /// Connection limits: how many, head size and time, idle and body timeouts.
    pub limits: crate::conn::ConnLimits,
}

/// Default capacity: the same small simulated GPU `headroom loadtest` uses.
pub const DEFAULT_CAPACITY: u64 = headroom_workload::device::DEFAULT_CAPACITY;
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            model: ModelSpec::Gpt2(ModelSpec::gpt2_small_config()),
            generation: crate::model::Generation::default(),
            device: ServeDevice::Cpu,
            capacity: DEFAULT_CAPACITY,
            alloc_conf: AllocatorConfig::default(),
            margin: Margin::Fraction(0.10),
            max_batch: 8,
            max_wait: Duration::from_millis(5),
            max_queue: 128,
            latency: LatencyTarget::Auto,
            max_body: DEFAULT_MAX_BODY,
            workers: 1,
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            drain_timeout: Duration::from_secs(30),
            limits: crate::conn::ConnLimits::default(),
        }
    }
}

impl ServeConfig {
    /// Checks the values that do not need the model.
    pub fn validate(&self) -> Result<(), ServeError> {
        let bad = |m: String| Err(ServeError::Config(m));
        if self.capacity == 0 {
            return bad("--capacity must be more than 0 bytes".into());
        }
        if self.margin.bytes(self.capacity) >= self.capacity {
            return bad(format!(
                "--margin {} leaves nothing of --capacity {}",
                self.margin,
                headroom_alloc::size::human_bytes(self.capacity)
            ));
        }
        if self.max_batch == 0 {
            return bad("--max-batch must be at least 1".into());
        }
        if self.max_queue == 0 {
            return bad("--max-queue must be at least 1".into());
        }
        if self.max_body == 0 {
            return bad("--max-body must be more than 0 bytes".into());
        }
        if self.workers == 0 || self.workers > 256 {
            return bad("--workers must be in 1..=256".into());
        }
        if self.limits.max_connections == 0
            || self.limits.max_connections > crate::conn::MAX_CONNECTIONS_LIMIT
        {
            return bad(format!(
                "--max-connections must be in 1..={}",
                crate::conn::MAX_CONNECTIONS_LIMIT
            ));
        }
        Ok(())
    }
    /// capacity − margin.
    pub fn limit_bytes(&self) -> u64 {
        self.capacity
            .saturating_sub(self.margin.bytes(self.capacity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margins_parse_as_bytes_or_percent() {
        assert_eq!("10%".parse::<Margin>().unwrap(), Margin::Fraction(0.1));
        assert_eq!("1MiB".parse::<Margin>().unwrap(), Margin::Bytes(1 << 20));
        assert_eq!("0".parse::<Margin>().unwrap(), Margin::Bytes(0));
        assert_eq!(Margin::Fraction(0.25).bytes(1000), 250);
        for bad in ["100%", "-1%", "x%", "lots"] {
            assert!(bad.parse::<Margin>().is_err(), "{bad}");
        }
    }

    #[test]
    fn devices_and_targets_parse() {
        assert_eq!("cpu".parse::<ServeDevice>().unwrap(), ServeDevice::Cpu);
        assert_eq!("cuda".parse::<ServeDevice>().unwrap(), ServeDevice::Cuda(0));
        assert_eq!(
            "cuda:1".parse::<ServeDevice>().unwrap(),
            ServeDevice::Cuda(1)
        );
        assert!("tpu".parse::<ServeDevice>().is_err());
        assert_eq!(
            "auto".parse::<LatencyTarget>().unwrap(),
            LatencyTarget::Auto
        );
        assert_eq!(
            "20ms".parse::<LatencyTarget>().unwrap(),
            LatencyTarget::Fixed(Duration::from_millis(20))
        );
        assert!("0".parse::<LatencyTarget>().is_err());
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn validation_names_the_flag() {
        let c = ServeConfig {
            margin: Margin::Bytes(1 << 40),
            ..ServeConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("--margin"));
        let c = ServeConfig {
            max_batch: 0,
            ..ServeConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--max-batch"));
    }
}
