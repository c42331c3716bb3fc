//! HTTP bodies the client buffers stream in under a cap (issue 28): an endless metrics
//! body or probe snapshot is an error naming the cap within a bounded read, never a buffer
//! that grows until the process dies.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use hyper::Method;
use vramroom_load::http::{client, limits};

/// A server that answers every connection with a chunked body that never ends.
fn endless_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n",
                );
                let chunk = format!("{:x}\r\n{}\r\n", 65536, "#".repeat(65536));
                while s.write_all(chunk.as_bytes()).is_ok() {}
            });
        }
    });
    format!("http://{addr}/metrics")
}

#[test]
fn an_endless_body_stops_at_its_cap() {
    let url = endless_server();
    let t = client::resolve(&url).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    let e = rt
        .block_on(client::get(&t, Duration::from_secs(30), Method::GET))
        .unwrap_err();
    assert!(
        e.contains("larger than") && e.contains("metrics body"),
        "{e}"
    );
    assert!(start.elapsed() < Duration::from_secs(20));
    limits::set_snapshot_bytes(1 << 20);
    let e = rt
        .block_on(client::get_limited(
            &t,
            Duration::from_secs(30),
            Method::GET,
            limits::snapshot(),
        ))
        .unwrap_err();
    assert!(
        e.contains("1.00 MiB") && e.contains("--max-snapshot-size"),
        "{e}"
    );
}
