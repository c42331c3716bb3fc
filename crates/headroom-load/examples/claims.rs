//! Prints `headroom claims` as JSON: `cargo run --release -p headroom-load --example claims`.
fn main() {
    let t = std::time::Instant::now();
    let r = headroom_load::claims::run_claims();
    println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    eprintln!("{:.2}s", t.elapsed().as_secs_f64());
}
