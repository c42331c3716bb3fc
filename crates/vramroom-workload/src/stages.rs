//! Stages and durations: the one parser of `--stages`, `-z` and every other duration.
//!
//! Design note: `vramroom loadtest`, `vramroom http` and `vramroom serve` all take durations
//! and k6-style stages, and a user moving between them must find one syntax with one set
//! of limits and one kind of message. A stage is a load (a worker count, or for the open
//! model a rate like `100/s`) held for a duration; what a command does not support (rates
//! in an in-process load test) it refuses after parsing, naming the stage.
//!
//! k6's ramping form is accepted beside ours: `DURATION:TARGET` (`30s:10,1m:10,20s:0`), the
//! load moving linearly from the previous target (0 at the start, as k6's ramping executors
//! start) to TARGET over DURATION. The runners hold each stage's load, so a ramp becomes
//! held steps: at most [`RAMP_STEPS`] equal steps a ramp, each at the load halfway through
//! its interval (rounded up for workers, so never 0), which is how k6 itself moves whole
//! VUs. A segment whose target equals the previous one is one held stage. The two forms are
//! told apart by the first field: a duration with a unit (`30s`, `1m`) that is not a rate.

use std::time::Duration;

use crate::error::{Result, WorkloadError};

/// Most stages a plan may have. Each stage is a row of the report and a band on its
/// plots; a thousand already makes both unreadable, and more is a script gone wrong.
pub const MAX_STAGES: usize = 1000;
/// Highest rate accepted (1/s).
pub const MAX_RATE: f64 = 10_000_000.0;
/// Held steps a k6 ramp (`30s:10`) becomes, at most.
pub const RAMP_STEPS: usize = 10;

/// The load of one stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StageLoad {
    /// Workers (closed model).
    Workers(usize),
    /// Requests per second (open model).
    Rate(f64),
}

/// One stage, k6's `stages` entry: a target load held for a duration. The one stage type
/// of `loadtest` (workers only) and `http` (workers or a rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stage {
    /// k6's `target`: workers (closed model) or requests per second (open model).
    pub target: StageLoad,
    /// `None`: until a count ends it (`http -n`, or `requests_per_worker`); the parser
    /// always sets it.
    pub duration: Option<Duration>,
    /// In-process only: the stage also ends once `requests_per_worker × workers` requests
    /// have completed, whichever comes first.
    pub requests_per_worker: Option<u64>,
}

impl Stage {
    /// `target` for `duration` (`None`: until a count ends it).
    pub fn held(target: StageLoad, duration: Option<Duration>) -> Stage {
        Stage {
            target,
            duration,
            requests_per_worker: None,
        }
    }
    /// `workers` for `duration`.
    pub fn timed(workers: usize, duration: Duration) -> Stage {
        Stage::held(StageLoad::Workers(workers), Some(duration))
    }
    /// `workers` until each has completed `requests_per_worker` requests.
    pub fn counted(workers: usize, requests_per_worker: u64) -> Stage {
        Stage {
            target: StageLoad::Workers(workers),
            duration: None,
            requests_per_worker: Some(requests_per_worker),
        }
    }
    /// The workers of a closed-model stage; 0 for a rate.
    pub fn workers(&self) -> usize {
        match self.target {
            StageLoad::Workers(n) => n,
            StageLoad::Rate(_) => 0,
        }
    }
}

/// Parses a duration: `10s`, `500ms`, `2m`, `1m30s`, `1.5s`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(v) = t.parse::<f64>() {
        return secs(v, t);
    }
    let mut total = 0.0;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return Err(format!(
                "{t:?} is not a duration (expected e.g. 10s, 500ms, 2m)"
            ));
        }
        let v: f64 = rest[..num_end]
            .parse()
            .map_err(|_| format!("{:?} is not a number", &rest[..num_end]))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => {
                return Err(format!(
                    "unknown time unit {u:?} in {t:?} (expected ms, s, m or h)"
                ))
            }
        };
        total += v * mult;
        rest = &rest[unit_end..];
    }
    secs(total, t)
}

fn secs(v: f64, t: &str) -> std::result::Result<Duration, String> {
    if !v.is_finite() || v <= 0.0 || v > 7.0 * 86400.0 {
        return Err(format!(
            "duration {t:?} must be more than 0 and at most 7 days"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// A rate: `100`, `100/s`, `100rps`, `6000/m`, `2.5/s`.
pub fn parse_rate(s: &str) -> std::result::Result<f64, String> {
    let t = s.trim();
    let (num, per) = if let Some(n) = t.strip_suffix("/s") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("rps") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("/m") {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix("/h") {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{t:?} is not a rate (expected e.g. 100, 100/s, 6000/m)"))?;
    let r = v / per;
    if !r.is_finite() || r <= 0.0 || r > MAX_RATE {
        return Err(format!(
            "rate {t:?} must be more than 0 and at most {MAX_RATE}/s"
        ));
    }
    Ok(r)
}

/// Whether a stage value is a rate (`100/s`, `100rps`, `6000/m`) rather than a count.
fn is_rate(s: &str) -> bool {
    let t = s.trim();
    t.ends_with("/s") || t.ends_with("rps") || t.ends_with("/m") || t.ends_with("/h")
}

/// k6-style stages `LOAD:DURATION,...`: `4:10s,16:20s` (workers) or `100/s:10s,400/s:20s`
/// (rates), at most `max_workers` workers a stage and [`MAX_STAGES`] stages.
pub fn parse_stages(s: &str, max_workers: usize) -> Result<Vec<Stage>> {
    let err = |msg: String| WorkloadError::Stages {
        // the message quotes the input: a long one is cut, so the error stays one line
        // a person can read
        input: if s.chars().count() > 60 {
            format!("{}…", s.chars().take(60).collect::<String>())
        } else {
            s.to_string()
        },
        msg,
    };
    let n = s.split(',').count();
    if n > MAX_STAGES {
        // refused before parsing any of them: the message is the same at any length
        return Err(err(format!("{n} stages; at most {MAX_STAGES} are allowed")));
    }
    let k6 = s.split(',').map(is_k6_stage).collect::<Vec<_>>();
    if k6.iter().any(|&k| k) {
        if let Some(i) = k6.iter().position(|&k| !k) {
            return Err(err(format!(
                "stage {} is not DURATION:TARGET like the others (k6's ramping form, e.g. 30s:10); \
                 use one form",
                i + 1
            )));
        }
        return parse_ramps(s, max_workers).map_err(err);
    }
    let mut out = Vec::new();
    for (i, part) in s.split(',').enumerate() {
        let part = part.trim();
        if part.is_empty() {
            return Err(err(format!("stage {} is empty", i + 1)));
        }
        let (w, d) = part.rsplit_once(':').ok_or_else(|| {
            err(format!(
                "stage {} {part:?} is not LOAD:DURATION (e.g. 4:20s or 100/s:20s)",
                i + 1
            ))
        })?;
        let load = if is_rate(w) {
            StageLoad::Rate(parse_rate(w).map_err(|m| err(format!("stage {}: {m}", i + 1)))?)
        } else {
            let workers: usize = w.trim().parse().map_err(|_| {
                err(format!(
                    "stage {}: {:?} is neither a worker count nor a rate like 100/s",
                    i + 1,
                    w.trim()
                ))
            })?;
            if workers == 0 {
                return Err(err(format!("stage {}: workers must be at least 1", i + 1)));
            }
            if workers > max_workers {
                return Err(err(format!(
                    "stage {}: {workers} workers; at most {max_workers} are allowed",
                    i + 1
                )));
            }
            StageLoad::Workers(workers)
        };
        let duration = parse_duration(d).map_err(|m| err(format!("stage {}: {m}", i + 1)))?;
        out.push(Stage::held(load, Some(duration)));
    }
    let rates = out
        .iter()
        .filter(|s| matches!(s.target, StageLoad::Rate(_)))
        .count();
    if rates != 0 && rates != out.len() {
        return Err(err(
            "stages mix worker counts and rates: use one model (4:10s,8:10s or 100/s:10s,200/s:10s)"
                .into(),
        ));
    }
    Ok(out)
}

/// Whether a stage is k6's `DURATION:TARGET`: its first field a duration with a time unit
/// that is not a rate (`100/s` ends in `s` too).
fn is_k6_stage(part: &str) -> bool {
    part.split_once(':').is_some_and(|(d, _)| {
        let d = d.trim();
        d.chars().any(|c| c.is_ascii_alphabetic()) && !is_rate(d) && parse_duration(d).is_ok()
    })
}

/// k6's ramping stages, as held steps (see the design note).
fn parse_ramps(s: &str, max_workers: usize) -> std::result::Result<Vec<Stage>, String> {
    let mut targets = Vec::new();
    for (i, part) in s.split(',').enumerate() {
        let (d, t) = part.trim().split_once(':').unwrap_or((part, ""));
        let duration = parse_duration(d).map_err(|m| format!("stage {}: {m}", i + 1))?;
        let t = t.trim();
        let target = if is_rate(t) {
            // A ramp may end at 0 (k6's ramp-down): only the held steps must be above 0.
            let zero = t.trim_end_matches(|c: char| !c.is_ascii_digit() && c != '.');
            if zero.parse::<f64>() == Ok(0.0) {
                StageLoad::Rate(0.0)
            } else {
                StageLoad::Rate(parse_rate(t).map_err(|m| format!("stage {}: {m}", i + 1))?)
            }
        } else {
            let n: usize = t.parse().map_err(|_| {
                format!(
                    "stage {}: target {t:?} is neither a worker count nor a rate like 100/s",
                    i + 1
                )
            })?;
            if n > max_workers {
                return Err(format!(
                    "stage {}: {n} workers; at most {max_workers} are allowed",
                    i + 1
                ));
            }
            StageLoad::Workers(n)
        };
        targets.push((duration, target));
    }
    let rates = targets
        .iter()
        .filter(|(_, t)| matches!(t, StageLoad::Rate(_)))
        .count();
    if rates != 0 && rates != targets.len() {
        return Err("stages mix worker counts and rates: use one model (30s:10,1m:10 or 30s:100/s,1m:100/s)".into());
    }
    let value = |l: StageLoad| match l {
        StageLoad::Workers(n) => n as f64,
        StageLoad::Rate(r) => r,
    };
    let mut out = Vec::new();
    let mut from = 0.0;
    for (i, &(duration, target)) in targets.iter().enumerate() {
        let to = value(target);
        if from == 0.0 && to == 0.0 {
            return Err(format!("stage {}: holds no load (0 to 0)", i + 1));
        }
        let steps = if from == to {
            1
        } else {
            let span = (to - from).abs();
            // Whole workers: no more steps than workers to add or remove.
            match target {
                StageLoad::Workers(_) => (span as usize).clamp(1, RAMP_STEPS),
                StageLoad::Rate(_) => RAMP_STEPS,
            }
        };
        let step = duration / steps as u32;
        for k in 0..steps {
            let mid = from + (to - from) * (k as f64 + 0.5) / steps as f64;
            let load = match target {
                StageLoad::Workers(_) => StageLoad::Workers(mid.ceil().max(1.0) as usize),
                StageLoad::Rate(_) => StageLoad::Rate(mid),
            };
            // The last step takes the rounding remainder, so the stages add up to DURATION.
            let d = if k + 1 == steps {
                duration - step * (steps as u32 - 1)
            } else {
                step
            };
            out.push(Stage::held(load, Some(d)));
        }
        from = to;
    }
    if out.len() > MAX_STAGES {
        return Err(format!(
            "{} held steps after ramping; at most {MAX_STAGES} are allowed",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_of_both_models() {
        let s = parse_stages("4:10s, 16:500ms", 64).unwrap();
        assert_eq!(s[0].target, StageLoad::Workers(4));
        assert_eq!(s[1].duration, Some(Duration::from_millis(500)));
        let s = parse_stages("100/s:2s,6000/m:1s,50rps:1s", 64).unwrap();
        assert_eq!(s[0].target, StageLoad::Rate(100.0));
        assert_eq!(s[1].target, StageLoad::Rate(100.0));
        assert_eq!(s[2].target, StageLoad::Rate(50.0));
        for bad in [
            "",
            "4",
            "0:1s",
            "4:1s,100/s:1s",
            "x:1s",
            "0/s:1s",
            "4:soon",
            "4:1s,",
            "65:1s",
        ] {
            let e = parse_stages(bad, 64).expect_err(bad).to_string();
            assert!(e.contains("invalid stages"), "{bad}: {e}");
        }
    }

    #[test]
    fn k6_ramping_stages_become_held_steps() {
        // 0 -> 10 workers over 10s: ten 1 s steps, 1..=10 workers.
        let s = parse_stages("10s:10", 64).unwrap();
        assert_eq!(s.len(), 10);
        let w: Vec<_> = s.iter().map(|x| x.target).collect();
        assert_eq!(w.first(), Some(&StageLoad::Workers(1)));
        assert_eq!(w.last(), Some(&StageLoad::Workers(10)));
        assert!(s.iter().all(|x| x.duration == Some(Duration::from_secs(1))));
        // A plateau is one held stage; a ramp down ends above 0; durations add up.
        let s = parse_stages("30s:4, 1m:4, 20s:0", 64).unwrap();
        let total: Duration = s.iter().filter_map(|x| x.duration).sum();
        assert_eq!(total, Duration::from_secs(110));
        assert!(s.contains(&Stage::timed(4, Duration::from_secs(60))));
        assert_eq!(s.last().unwrap().target, StageLoad::Workers(1));
        let mut prev = 0;
        for x in &s[..4] {
            let StageLoad::Workers(n) = x.target else {
                panic!()
            };
            assert!(n >= prev, "a ramp up never goes down");
            prev = n;
        }
        // Rates ramp in RAMP_STEPS steps, each at its interval's middle.
        let s = parse_stages("10s:100/s", 64).unwrap();
        assert_eq!(s.len(), RAMP_STEPS);
        assert_eq!(s[0].target, StageLoad::Rate(5.0));
        assert_eq!(s[RAMP_STEPS - 1].target, StageLoad::Rate(95.0));
        // The old form is unchanged, and the forms do not mix.
        assert_eq!(parse_stages("4:10s", 64).unwrap().len(), 1);
        for bad in [
            "10s:4,4:10s",
            "10s:0",
            "10s:lots",
            "10s:65",
            "10s:4,5s:100/s",
            "1m:",
        ] {
            let e = parse_stages(bad, 64).expect_err(bad).to_string();
            assert!(e.contains("invalid stages"), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_and_rates() {
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        for bad in ["", "0s", "-1s", "5x", "8d", "1e400"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_rate("250").unwrap(), 250.0);
        assert_eq!(parse_rate("120/m").unwrap(), 2.0);
        assert!(parse_rate("-1").is_err() && parse_rate("fast").is_err());
        assert!(parse_rate("1e12").is_err());
    }

    #[test]
    fn too_many_stages_are_refused_at_once() {
        let s = vec!["1:1ms"; MAX_STAGES + 1].join(",");
        let e = parse_stages(&s, 8).unwrap_err().to_string();
        assert!(e.contains("at most 1000"), "{e}");
    }
}
