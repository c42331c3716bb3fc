//! Prints `vramroom claims` as JSON: `cargo run --release -p vramroom-load --example claims`.
fn main() {
    let t = std::time::Instant::now();
    let r = vramroom_load::claims::run_claims();
    println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    eprintln!("{:.2}s", t.elapsed().as_secs_f64());
}
