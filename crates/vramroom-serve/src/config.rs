//! The server's configuration and the parsers for its user-facing values.
//!
//! Design note: everything a user types is parsed and checked here, before a model is
//! built or a socket bound, so a bad flag is one clear line and exit 2, never a half-started
//! server. Sizes use vramroom's size syntax (`512MiB`, `1.5GB`, bytes), durations
//! vramroom-load's (`5ms`, `2s`), the allocator config `PYTORCH_CUDA_ALLOC_CONF`'s.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use vramroom_alloc::AllocatorConfig;
use vramroom_workload::{ModelSpec, ZooModel};

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

/// `--device`: one replica per entry (`cuda:0,cuda:1`, `cpu,cpu`, `cuda`).
///
/// Each entry gets its own model copy, caching allocator, meta twin and scheduler. A GPU
/// may appear once (two replicas on one card would each believe they own its memory); cpu
/// may repeat, each entry a separate simulated device of `--capacity`, which is what tests
/// and CI balance across. Mixing cpu and cuda is refused: `--capacity` means a simulated
/// device on one and a cap on the card on the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceList(Vec<ServeDevice>);

impl DeviceList {
    /// A list of at least one device, checked as [`FromStr`] checks it.
    pub fn new(devices: Vec<ServeDevice>) -> Result<DeviceList, ServeError> {
        if devices.is_empty() {
            return Err(ServeError::Config("the device list is empty".into()));
        }
        for (i, d) in devices.iter().enumerate() {
            if matches!(d, ServeDevice::Cuda(_)) && devices[..i].contains(d) {
                return Err(ServeError::Config(format!(
                    "{d} is listed twice (one replica per GPU)"
                )));
            }
        }
        let cpus = devices.iter().filter(|d| **d == ServeDevice::Cpu).count();
        if cpus > 0 && cpus < devices.len() {
            return Err(ServeError::Config(
                "the list mixes cpu and cuda; list devices of one kind".into(),
            ));
        }
        Ok(DeviceList(devices))
    }
    pub fn devices(&self) -> &[ServeDevice] {
        &self.0
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Any entry is a GPU.
    pub fn has_cuda(&self) -> bool {
        self.0.iter().any(|d| matches!(d, ServeDevice::Cuda(_)))
    }
    /// The replicas' names, unique: a GPU's own (`cuda:1`); cpu alone is `cpu`, several cpu
    /// entries are `cpu:0`, `cpu:1`, ... in list order (the `device` label of `/metrics`).
    pub fn names(&self) -> Vec<String> {
        let several_cpus = self.0.iter().filter(|d| **d == ServeDevice::Cpu).count() > 1;
        let mut cpu_i = 0;
        self.0
            .iter()
            .map(|d| match d {
                ServeDevice::Cpu if several_cpus => {
                    cpu_i += 1;
                    format!("cpu:{}", cpu_i - 1)
                }
                d => d.to_string(),
            })
            .collect()
    }
}

impl From<ServeDevice> for DeviceList {
    fn from(d: ServeDevice) -> DeviceList {
        DeviceList(vec![d])
    }
}

impl fmt::Display for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.0.iter().map(ServeDevice::to_string).collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for DeviceList {
    type Err = ServeError;
    /// `cpu`, `cuda`, `cuda:0,cuda:1`, `cpu,cpu`; an empty entry names its position.
    fn from_str(s: &str) -> Result<Self, ServeError> {
        let mut v = Vec::new();
        for (i, part) in s.split(',').enumerate() {
            if part.trim().is_empty() {
                return Err(ServeError::Config(format!(
                    "an empty entry (entry {}) in the device list",
                    i + 1
                )));
            }
            v.push(part.parse::<ServeDevice>()?);
        }
        DeviceList::new(v)
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
    /// What admission may commit on a device of `capacity` bytes: capacity − margin.
    pub fn limit(&self, capacity: u64) -> u64 {
        capacity.saturating_sub(self.bytes(capacity))
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
        vramroom_alloc::size::parse_size(t)
            .map(Margin::Bytes)
            .map_err(|e| ServeError::Config(format!("margin {s:?}: {e} (or a percentage, 10%)")))
    }
}

impl fmt::Display for Margin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Margin::Bytes(b) => write!(f, "{}", vramroom_alloc::size::human_bytes(*b)),
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
    vramroom_workload::parse_duration(t).map_err(|e| ServeError::Config(e.to_string()))
}

/// Everything `vramroom serve` takes.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub model: ModelSpec,
    /// A Hugging Face decoder's answer: `--new N` tokens, `use_cache`.
    pub generation: crate::model::Generation,
    /// One replica per entry.
    pub devices: DeviceList,
    /// Each replica's device capacity in bytes (on cpu: the simulated GPU the caching
    /// allocator manages; on cuda: a cap on the card, clamped to its total).
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

/// Default capacity: the same small simulated GPU `vramroom loadtest` uses.
pub const DEFAULT_CAPACITY: u64 = vramroom_workload::device::DEFAULT_CAPACITY;
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            model: ModelSpec::Zoo(ZooModel::Gpt2(ModelSpec::zoo_gpt_small_config())),
            generation: crate::model::Generation::default(),
            devices: DeviceList::from(ServeDevice::Cpu),
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
                vramroom_alloc::size::human_bytes(self.capacity)
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
    /// capacity − margin, of each replica (before a GPU's capacity is clamped to its card).
    pub fn limit_bytes(&self) -> u64 {
        self.margin.limit(self.capacity)
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
        let l: DeviceList = "cuda:0, cuda:1".parse().unwrap();
        assert_eq!(l.devices(), &[ServeDevice::Cuda(0), ServeDevice::Cuda(1)]);
        assert_eq!(l.names(), ["cuda:0", "cuda:1"]);
        let l: DeviceList = "cpu,cpu".parse().unwrap();
        assert_eq!(l.names(), ["cpu:0", "cpu:1"]);
        assert_eq!("cpu".parse::<DeviceList>().unwrap().names(), ["cpu"]);
        assert_eq!("cuda".parse::<DeviceList>().unwrap().to_string(), "cuda:0");
        for (bad, says) in [
            ("cuda:x", "\"cuda:x\""),
            ("cuda:0,,cuda:1", "empty entry (entry 2)"),
            ("", "empty entry (entry 1)"),
            ("cpu,", "empty entry (entry 2)"),
            ("cpu,tpu", "\"tpu\""),
            ("cuda:1,cuda:1", "cuda:1 is listed twice"),
            ("cuda,cuda:0", "cuda:0 is listed twice"),
            ("cpu,cuda:0", "mixes cpu and cuda"),
        ] {
            let e = bad.parse::<DeviceList>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
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
