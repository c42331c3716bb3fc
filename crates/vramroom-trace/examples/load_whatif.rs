//! `cargo run --release -p vramroom-trace --example load_whatif SNAPSHOT [LIMIT_BYTES]`:
//! cut a trace into requests and predict the concurrency at which it runs out.
use vramroom_trace::concurrency::{
    attribution, predict_concurrency, simulate_at, split_requests, LoadWhatIf,
};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let snap = vramroom_trace::read_snapshot_file(std::path::Path::new(&a[1])).expect("read");
    let w = split_requests(&snap.device_traces[0]);
    println!(
        "base ends at {}, {} requests (tagged: {})",
        w.base_end,
        w.requests.len(),
        w.tagged
    );
    let at = attribution(&w);
    println!("{at:?}");
    let limit = a.get(2).and_then(|s| s.parse().ok());
    let t = std::time::Instant::now();
    let p = predict_concurrency(
        &snap,
        0,
        &w,
        &LoadWhatIf {
            memory_limit: limit,
            ..Default::default()
        },
    )
    .expect("predict");
    println!("{:?} in {:?}", (p.first_oom, p.safe), t.elapsed());
    for pt in &p.points {
        println!("{pt:?}");
    }
    if let Some(conf) = a.get(3) {
        let o = LoadWhatIf {
            config: vramroom_alloc::AllocatorConfig::parse(conf).expect("conf"),
            memory_limit: limit,
            requests_per_worker: w.requests.len() / 2,
            ..Default::default()
        };
        println!("{conf} at 2: {:?}", simulate_at(&snap, 0, &w, 2, &o));
        let o = LoadWhatIf {
            config: vramroom_alloc::AllocatorConfig::default(),
            ..o
        };
        println!("default at 2: {:?}", simulate_at(&snap, 0, &w, 2, &o));
    }
}
