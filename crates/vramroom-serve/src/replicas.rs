//! Replicas and the router between them: `--device cuda:0,cuda:1` serves one model copy
//! per device, and each request goes to the replica that admits it with the most memory
//! left.
//!
//! Design note. A replica is everything one device needs to serve on its own: the model
//! copy, its caching allocator (through the device), its meta twin ([`Predictor`]) and its
//! [`Scheduler`] (admission ledger, batch queue, compute threads), plus its own
//! [`Metrics`]. Replicas share nothing but the HTTP front, so an OOM or a slow batch on
//! one cannot spill into another's ledger; with one device there is one replica and the
//! server is exactly the single-device server.
//!
//! Routing: the request's peak is predicted on every replica's twin (each twin asks its
//! own device for workspaces, so two GPU models may differ; identical replicas share the
//! answer through their caches after the first request of a shape). Replicas are then
//! ranked by the memory they would have left after it (`limit − committed − peak`, the
//! same ledger admission reads), then by the requests waiting in their queue, then in
//! turn (a rotating start, so idle identical replicas share the load instead of all going
//! to the first), and the request is offered to each in that order. Admission is each
//! scheduler's own, atomic under its lock; the ranking is only a preference, read without
//! holding every lock, so a race makes a request fall through to the next replica, never
//! over-commit one. It is answered 503 + `Retry-After` only when every replica refuses,
//! with the soonest retry any of them offered. A refusal is counted once, on the replica
//! whose answer is given, so `vramroom_admission_rejections_total` summed over `device`
//! is still the number of 503s.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use vramroom_workload::AllocatorProbe;

use crate::config::{ServeConfig, ServeDevice};
use crate::device::open_device;
use crate::error::{ApiError, ServeError};
use crate::metrics::Metrics;
use crate::model::{BatchKey, Input, Predictor, ServedModel};
use crate::scheduler::{Admitted, SchedConfig, Scheduler};

/// One device's server: model copy, twin, scheduler, counters.
pub struct Replica {
    /// Unique among the replicas: `cuda:1`, `cpu`, or `cpu:0`, `cpu:1` when several (the
    /// `device` label of `/metrics`).
    pub name: String,
    pub device: ServeDevice,
    pub model: Arc<ServedModel>,
    pub predictor: Arc<Predictor>,
    pub sched: Arc<Scheduler>,
    pub metrics: Arc<Metrics>,
    pub probe: Arc<dyn AllocatorProbe>,
    /// Bytes the device holds (on a GPU: `--capacity` clamped to the card).
    pub capacity: u64,
    /// capacity − margin of this device.
    pub limit: u64,
    /// Requests the router placed here (admitted).
    routed: AtomicU64,
}

impl Replica {
    /// Requests the router placed on this replica since start.
    pub fn routed(&self) -> u64 {
        self.routed.load(Ordering::Relaxed)
    }

    /// Opens `device`, builds the model and its twin, checks the smallest request fits,
    /// calibrates the compute-time model and starts the compute threads.
    pub fn build(
        cfg: &ServeConfig,
        device: ServeDevice,
        name: String,
    ) -> Result<Replica, ServeError> {
        let r = Replica::open(cfg, device, name)?;
        r.sched.spawn_workers().map_err(ServeError::Thread)?;
        Ok(r)
    }

    /// [`Replica::build`] without the compute threads: nothing it admits runs (tests hold a
    /// replica full with it).
    pub fn open(
        cfg: &ServeConfig,
        device: ServeDevice,
        name: String,
    ) -> Result<Replica, ServeError> {
        let dev = open_device(device, cfg.capacity, &cfg.alloc_conf)?;
        let model_err = |source| ServeError::Model {
            model: cfg.model.name(),
            source,
        };
        let model = Arc::new(
            ServedModel::load_with(&cfg.model, &dev.run.device, cfg.generation)
                .map_err(model_err)?,
        );
        let predictor = Arc::new(
            Predictor::with_generation(&cfg.model, &dev.twin, cfg.generation).map_err(model_err)?,
        );
        let key = reference_key(model.family());
        // The device's own capacity: on a GPU, --capacity clamped to the card.
        let limit = cfg.margin.limit(dev.capacity);
        let base = model.device().memory_allocated();
        let mut fits = 0;
        for n in 1..=cfg.max_batch {
            let p = predictor.predict(key, n).map_err(model_err)?;
            if base + p <= limit {
                fits = n;
            }
        }
        if fits == 0 {
            let p = predictor.cached(key, 1).unwrap_or(0);
            return Err(ServeError::Config(format!(
                "model {} holds {base} bytes and its smallest request needs {p} more, over \
                 --capacity minus --margin ({limit} bytes){}",
                cfg.model.name(),
                if cfg.devices.len() > 1 {
                    format!(" on {name}")
                } else {
                    String::new()
                }
            )));
        }
        let metrics = Arc::new(Metrics::new());
        let sched = Scheduler::new(
            SchedConfig {
                max_batch: cfg.max_batch,
                max_wait: cfg.max_wait,
                max_queue: cfg.max_queue,
                latency: cfg.latency,
                limit_bytes: limit,
                workers: cfg.workers,
            },
            model.clone(),
            predictor.clone(),
            dev.run.probe.clone(),
            metrics.clone(),
        );
        sched.calibrate(key, fits.min(4)).map_err(model_err)?;
        Ok(Replica {
            name,
            device,
            model,
            predictor,
            sched,
            metrics,
            probe: dev.run.probe.clone(),
            capacity: dev.capacity,
            limit,
            routed: AtomicU64::new(0),
        })
    }

    /// Memory left after `pred` more: `limit − committed − pred` (negative: does not fit).
    fn vramroom_after(&self, pred: u64) -> i128 {
        let (committed, ..) = self.sched.ledger();
        self.limit as i128 - committed as i128 - pred as i128
    }
}

/// The batch key calibration and the start-up fit check use: the smallest input.
fn reference_key(f: crate::model::Family) -> BatchKey {
    use crate::model::Family;
    match f {
        Family::Lm {
            n_positions, pad, ..
        } => BatchKey::Tokens {
            len: if pad {
                crate::model::bucket(1, n_positions)
            } else {
                1
            },
        },
        Family::Image { .. } => BatchKey::Image {
            h: crate::model::MIN_IMAGE_SIDE,
            w: crate::model::MIN_IMAGE_SIDE,
        },
        Family::Mlp { .. } => BatchKey::Rows,
    }
}

/// Every replica, and the router's turn counter.
pub struct Replicas {
    list: Vec<Arc<Replica>>,
    turn: AtomicUsize,
}

impl Replicas {
    /// Builds one replica per entry of `cfg.devices`, in order (a failure names its device
    /// when there are several, and stops the ones already started).
    pub fn build(cfg: &ServeConfig) -> Result<Replicas, ServeError> {
        let mut list: Vec<Arc<Replica>> = Vec::new();
        let several = cfg.devices.len() > 1;
        for (d, name) in cfg.devices.devices().iter().zip(cfg.devices.names()) {
            match Replica::build(cfg, *d, name.clone()) {
                Ok(r) => list.push(Arc::new(r)),
                Err(e) => {
                    for r in &list {
                        r.sched.close_and_join();
                    }
                    return Err(match e {
                        ServeError::Model { model, source } if several => ServeError::Config(
                            format!("could not load model {model} on {name}: {source}"),
                        ),
                        e => e,
                    });
                }
            }
        }
        Ok(Replicas::new(list))
    }

    /// Replicas already built (at least one).
    pub fn new(list: Vec<Arc<Replica>>) -> Replicas {
        assert!(!list.is_empty(), "a server has at least one replica");
        Replicas {
            list,
            turn: AtomicUsize::new(0),
        }
    }

    pub fn list(&self) -> &[Arc<Replica>] {
        &self.list
    }
    pub fn len(&self) -> usize {
        self.list.len()
    }
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
    /// The first replica (the only one with one device).
    pub fn first(&self) -> &Arc<Replica> {
        &self.list[0]
    }

    /// The order the router offers a request whose peak is `preds[i]` on replica `i`: most
    /// memory left after it first, then the shortest queue, then in turn.
    pub fn order(&self, preds: &[u64]) -> Vec<usize> {
        let n = self.list.len();
        let start = if n > 1 {
            self.turn.fetch_add(1, Ordering::Relaxed) % n
        } else {
            0
        };
        let mut ranked: Vec<(i128, usize, usize, usize)> = self
            .list
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let pred = preds.get(i).copied().unwrap_or(0);
                let queued = r.sched.depth().0;
                (r.vramroom_after(pred), queued, (i + n - start) % n, i)
            })
            .collect();
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        ranked.into_iter().map(|r| r.3).collect()
    }

    /// Offers `input` to the replicas in [`Replicas::order`] until one admits it. Ok: the
    /// replica's index and its ticket. Err: the index of the replica whose refusal is the
    /// answer (a 503 with the soonest `Retry-After` before any 422: another replica may
    /// take it later), its rejection counted there.
    pub fn route(
        &self,
        id: u64,
        mut input: Input,
        preds: &[u64],
    ) -> Result<(usize, Admitted), (usize, ApiError)> {
        let mut refused: Vec<(usize, ApiError)> = Vec::new();
        for i in self.order(preds) {
            let r = &self.list[i];
            let pred = preds.get(i).copied().unwrap_or(0);
            match r.sched.try_submit(id, input, pred) {
                Ok(a) => {
                    r.routed.fetch_add(1, Ordering::Relaxed);
                    return Ok((i, a));
                }
                Err(r) => {
                    let r = *r;
                    refused.push((i, r.error));
                    input = r.input;
                }
            }
        }
        let best = refused
            .iter()
            .enumerate()
            .min_by_key(|(k, (_, e))| {
                let shed = e.status == StatusCode::SERVICE_UNAVAILABLE;
                (!shed, e.retry_after_s.unwrap_or(u64::MAX), *k)
            })
            .map(|(k, _)| k)
            .unwrap_or(0);
        let (i, e) = refused.swap_remove(best);
        if let Some(reason) = e.reject {
            self.list[i].metrics.reject(reason);
        }
        Err((i, e))
    }

    /// Predicted peaks of `samples` of `key` on every replica's twin, from the caches.
    pub fn cached_preds(&self, key: BatchKey, samples: usize) -> Option<Vec<u64>> {
        self.list
            .iter()
            .map(|r| r.predictor.cached(key, samples))
            .collect()
    }

    /// Stop admitting on every replica.
    pub fn drain(&self) {
        for r in &self.list {
            r.sched.drain();
        }
    }
    /// `(queued, running)` summed over the replicas.
    pub fn depth(&self) -> (usize, usize) {
        self.list.iter().fold((0, 0), |(q, run), r| {
            let (dq, _, dr) = r.sched.depth();
            (q + dq, run + dr)
        })
    }
    /// Answer every queued request 503, on every replica.
    pub fn abort_queued(&self) {
        for r in &self.list {
            r.sched.abort_queued();
        }
    }
    /// Joins every replica's compute threads.
    pub fn close_and_join(&self) {
        for r in &self.list {
            r.sched.close_and_join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Margin;
    use crate::error::Reject;
    use crate::model::Family;

    /// Two cpu replicas whose admitted work (no compute threads: it stays queued) has room
    /// for 2.5 requests of `body` each.
    fn two_held_replicas(body: &[u8]) -> (Replicas, u64, ServeConfig) {
        let mut cfg = ServeConfig {
            model: "zoo-gpt-tiny".parse().unwrap(),
            capacity: 64 << 20,
            latency: crate::scheduler::LatencyTarget::Off,
            ..ServeConfig::default()
        };
        let probe = Replica::open(&cfg, ServeDevice::Cpu, "probe".into()).unwrap();
        let input = probe.model.decode_json(body, cfg.max_batch).unwrap();
        let pred = probe.predictor.predict(input.key, input.samples).unwrap();
        let base = probe.sched.ledger().3;
        probe.sched.close_and_join();
        let limit = base + pred * 5 / 2;
        cfg.margin = Margin::Bytes(cfg.capacity - limit);
        let list = ["cpu:0", "cpu:1"]
            .iter()
            .map(|n| Arc::new(Replica::open(&cfg, ServeDevice::Cpu, n.to_string()).unwrap()))
            .collect();
        assert!(matches!(probe.model.family(), Family::Lm { .. }));
        (Replicas::new(list), pred, cfg)
    }

    #[test]
    fn a_full_replica_passes_the_request_to_the_other_and_503_only_when_both_are_full() {
        let body = br#"{"inputs": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}"#;
        let (reps, pred, cfg) = two_held_replicas(body);
        let input = || reps.first().model.decode_json(body, cfg.max_batch).unwrap();
        let preds = [pred, pred];
        let mut held = Vec::new();
        // Fill replica 0 straight through its scheduler: two fit, the third does not.
        for id in 0..2 {
            held.push(reps.list()[0].sched.submit(id, input(), pred).unwrap());
        }
        let e = reps.list()[0].sched.submit(2, input(), pred).err().unwrap();
        assert_eq!(e.reject, Some(Reject::Memory));
        // The router sends the next two to replica 1, whatever its turn says.
        for id in 10..12 {
            let (i, a) = reps.route(id, input(), &preds).ok().unwrap();
            assert_eq!(i, 1, "request {id} went to the full replica");
            held.push(a);
        }
        assert_eq!(reps.list()[1].routed(), 2);
        assert_eq!(reps.list()[0].routed(), 0);
        // Both full: 503 with Retry-After, counted once, on the replica that answered.
        let before: u64 = reps
            .list()
            .iter()
            .map(|r| r.metrics.rejections_total())
            .sum();
        let (i, e) = reps.route(20, input(), &preds).err().unwrap();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.reject, Some(Reject::Memory));
        assert!(e.retry_after_s.is_some_and(|s| s >= 1));
        let after: u64 = reps
            .list()
            .iter()
            .map(|r| r.metrics.rejections_total())
            .sum();
        assert_eq!(after, before + 1);
        assert_eq!(
            reps.list()[i].metrics.rejections(Reject::Memory),
            1 + (i == 0) as u64
        );
        // A request freed on replica 0 (its client left) makes room there again.
        drop(held.remove(0));
        let (i, a) = reps.route(21, input(), &preds).ok().unwrap();
        assert_eq!(i, 0);
        held.push(a);
        drop(held);
        reps.close_and_join();
    }

    #[test]
    fn idle_identical_replicas_take_turns_and_memory_left_comes_first() {
        let body = br#"{"inputs": [5, 6, 7]}"#;
        let (reps, pred, cfg) = two_held_replicas(body);
        let input = || reps.first().model.decode_json(body, cfg.max_batch).unwrap();
        let first: Vec<usize> = (0..4).map(|_| reps.order(&[pred, pred])[0]).collect();
        assert_eq!(first, [0, 1, 0, 1], "idle replicas alternate");
        // One request queued on replica 1: replica 0 has more memory left, whoever's turn.
        let _held = reps.list()[1].sched.submit(1, input(), pred).unwrap();
        for _ in 0..3 {
            assert_eq!(reps.order(&[pred, pred]), [0, 1]);
        }
        // A bigger prediction on replica 0 (another GPU's workspaces) can reverse that.
        assert_eq!(reps.order(&[pred * 3, pred]), [1, 0]);
        drop(_held);
        reps.close_and_join();
    }
}
