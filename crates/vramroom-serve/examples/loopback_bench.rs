//! Loopback load against an in-process `vramroom serve`: the unloaded latency, then a ramp
//! of closed-loop clients to a multiple of the safe concurrency, with what was admitted,
//! what was shed, the latency of admitted requests and the batches that formed.
//!
//! "Safe concurrency" is memory's: the capacity is set so that exactly `--safe` single
//! requests of the chosen shape fit under capacity − margin next to the model.
//!
//! ```sh
//! cargo run --release -p vramroom-serve --example loopback_bench -- \
//!     --model zoo-gpt-tiny --seq 16 --safe 8 --stages 1,8,16,32 --per-client 50 \
//!     [--max-wait 5ms] [--max-latency auto] [--max-batch 8] [--workers 1] [--http-threads 2]
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use vramroom_alloc::AllocatorConfig;
use vramroom_serve::{
    open_device, parse_duration, start, BatchKey, Family, LatencyTarget, Margin, Predictor,
    ServeConfig, ServeDevice, ServedModel,
};
use vramroom_workload::ModelSpec;

struct Args {
    model: String,
    seq: usize,
    safe: f64,
    stages: Vec<usize>,
    per_client: usize,
    max_wait: Duration,
    max_latency: LatencyTarget,
    workers: usize,
    max_batch: usize,
    http_threads: usize,
}

fn args() -> Args {
    let mut a = Args {
        model: "zoo-gpt-tiny".into(),
        seq: 16,
        safe: 8.0,
        stages: vec![1, 8, 16, 32],
        per_client: 50,
        max_wait: Duration::from_millis(5),
        max_latency: LatencyTarget::Auto,
        workers: 1,
        max_batch: 8,
        http_threads: 2,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    for w in v.chunks(2) {
        let val = w.get(1).cloned().unwrap_or_default();
        match w[0].as_str() {
            "--model" => a.model = val,
            "--seq" => a.seq = val.parse().expect("--seq"),
            "--safe" => a.safe = val.parse().expect("--safe"),
            "--stages" => {
                a.stages = val
                    .split(',')
                    .map(|s| s.parse().expect("--stages"))
                    .collect()
            }
            "--per-client" => a.per_client = val.parse().expect("--per-client"),
            "--max-wait" => a.max_wait = parse_duration(&val).expect("--max-wait"),
            "--max-latency" => a.max_latency = val.parse().expect("--max-latency"),
            "--workers" => a.workers = val.parse().expect("--workers"),
            "--max-batch" => a.max_batch = val.parse().expect("--max-batch"),
            "--http-threads" => a.http_threads = val.parse().expect("--http-threads"),
            o => panic!("unknown flag {o}"),
        }
    }
    a
}

fn body(family: Family, seq: usize, i: usize) -> Vec<u8> {
    let v = match family {
        Family::Lm { vocab, .. } => serde_json::json!({
            "inputs": (0..seq).map(|j| (i * 31 + j * 7) % vocab).collect::<Vec<_>>()
        }),
        Family::Mlp { features, .. } => serde_json::json!({
            "inputs": (0..features).map(|j| ((i + j) % 17) as f32 / 17.0).collect::<Vec<_>>()
        }),
        Family::Image { .. } => serde_json::json!({
            "inputs": {"shape": [3, seq, seq], "data": vec![0.5f32; 3 * seq * seq]}
        }),
    };
    serde_json::to_vec(&v).expect("json")
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

#[derive(Default)]
struct StageOut {
    ok: Vec<f64>,
    shed: usize,
    other: usize,
    batch_sizes: Vec<u64>,
    /// queue_ms + compute_ms as the server saw them.
    server_ms: Vec<f64>,
}

async fn client_loop(
    addr: SocketAddr,
    family: Family,
    seq: usize,
    n: usize,
    seed: usize,
) -> StageOut {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let url: hyper::Uri = format!("http://{addr}/v1/infer").parse().expect("uri");
    let mut out = StageOut::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..n {
        if Instant::now() > deadline {
            break;
        }
        let req = hyper::Request::post(url.clone())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body(family, seq, seed * 1000 + i))))
            .expect("request");
        let t = Instant::now();
        let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(30), client.request(req)).await
        else {
            out.other += 1;
            continue;
        };
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.map(|c| c.to_bytes());
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match (status, bytes) {
            (200, Ok(b)) => {
                out.ok.push(ms);
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b) {
                    out.batch_sizes.push(v["batch_size"].as_u64().unwrap_or(0));
                    out.server_ms.push(
                        v["queue_ms"].as_f64().unwrap_or(0.0)
                            + v["compute_ms"].as_f64().unwrap_or(0.0),
                    );
                }
            }
            (503, _) => out.shed += 1,
            _ => out.other += 1,
        }
    }
    out
}

fn main() {
    let a = args();
    let spec: ModelSpec = a.model.parse().expect("--model");
    let family = Family::of(&spec);
    let key = match family {
        Family::Lm { n_positions, .. } => BatchKey::Tokens {
            len: vramroom_serve::model::bucket(a.seq, n_positions),
        },
        Family::Image { .. } => BatchKey::Image { h: a.seq, w: a.seq },
        Family::Mlp { .. } => BatchKey::Rows,
    };
    let (base, p1) = {
        let d = open_device(ServeDevice::Cpu, 1 << 34, &AllocatorConfig::default()).unwrap();
        let m = ServedModel::load(&spec, &d.run.device).unwrap();
        let p = Predictor::new(&spec, &d.twin).unwrap();
        (m.device().memory_allocated(), p.predict(key, 1).unwrap())
    };
    let limit = base + (a.safe * p1 as f64) as u64;
    let capacity = (limit + (64 << 20)).next_multiple_of(2 << 20);
    let cfg = ServeConfig {
        model: spec,
        addr: "127.0.0.1:0".parse().unwrap(),
        capacity,
        margin: Margin::Bytes(capacity - limit),
        max_wait: a.max_wait,
        max_batch: a.max_batch,
        latency: a.max_latency,
        workers: a.workers,
        ..ServeConfig::default()
    };
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.http_threads)
        .enable_all()
        .build()
        .unwrap();
    let server = server_rt.block_on(start(cfg)).expect("server");
    let addr = server.local_addr();
    println!(
        "model {} key {key}: base {base} B, one request {p1} B, limit {limit} B (safe concurrency {}), capacity {capacity} B, max_wait {:?}, max_batch {}, latency {:?}",
        a.model, a.safe, a.max_wait, a.max_batch, a.max_latency
    );
    println!(
        "{:>5} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>10} {:>9} {:>12}",
        "conc",
        "sent",
        "ok",
        "503",
        "p50 ms",
        "p99 ms",
        "max ms",
        "mean batch",
        "max batch",
        "server p99"
    );
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut unloaded_p99 = f64::NAN;
    for &c in &a.stages {
        let outs: Vec<StageOut> = client_rt.block_on(async {
            let tasks: Vec<_> = (0..c)
                .map(|k| tokio::spawn(client_loop(addr, family, a.seq, a.per_client, k)))
                .collect();
            let mut v = Vec::new();
            for t in tasks {
                v.push(t.await.unwrap());
            }
            v
        });
        let mut ok: Vec<f64> = outs.iter().flat_map(|o| o.ok.iter().copied()).collect();
        ok.sort_by(f64::total_cmp);
        let shed: usize = outs.iter().map(|o| o.shed).sum();
        let other: usize = outs.iter().map(|o| o.other).sum();
        let bs: Vec<u64> = outs
            .iter()
            .flat_map(|o| o.batch_sizes.iter().copied())
            .collect();
        let mean_b = bs.iter().sum::<u64>() as f64 / bs.len().max(1) as f64;
        let mut srv: Vec<f64> = outs
            .iter()
            .flat_map(|o| o.server_ms.iter().copied())
            .collect();
        srv.sort_by(f64::total_cmp);
        let p99 = pct(&ok, 99.0);
        if c == a.stages[0] {
            unloaded_p99 = p99;
        }
        println!(
            "{:>5} {:>6} {:>6} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>9} {:>12.2}{}{}",
            c,
            ok.len() + shed + other,
            ok.len(),
            shed,
            pct(&ok, 50.0),
            p99,
            ok.last().copied().unwrap_or(f64::NAN),
            mean_b,
            bs.iter().max().copied().unwrap_or(0),
            pct(&srv, 99.0),
            if other > 0 {
                format!("  ({other} other)")
            } else {
                String::new()
            },
            if c != a.stages[0] {
                format!("  p99/unloaded {:.2}", p99 / unloaded_p99)
            } else {
                String::new()
            }
        );
    }
    let m = server.app().render_metrics();
    for name in [
        "vramroom_max_memory_allocated_bytes",
        "vramroom_memory_capacity_bytes",
        "vramroom_num_ooms_total",
    ] {
        if let Some(l) = m.lines().find(|l| l.starts_with(&format!("{name} "))) {
            println!("{l}");
        }
    }
    for l in m
        .lines()
        .filter(|l| l.starts_with("vramroom_admission_rejections_total"))
    {
        println!("{l}");
    }
    server_rt.block_on(server.shutdown());
}
