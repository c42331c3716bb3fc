//! The loopback server of `vramroom bench http` as a process of its own, for profiling a
//! client against it: `hello_server [THREADS] [SECONDS]` prints its URL and answers 200 "ok".
use std::time::Duration;

fn main() {
    let mut a = std::env::args().skip(1);
    let threads = a.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let secs = a.next().and_then(|s| s.parse().ok()).unwrap_or(60);
    let s = vramroom_load::http::server::TestServer::hello(threads).expect("start the server");
    println!("{}", s.url("/"));
    std::thread::sleep(Duration::from_secs(secs));
}
