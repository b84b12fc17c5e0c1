//! WebSocket load for `benches/protocols`: an echo server, and a client
//! that keeps N connections each sending a message and waiting for its echo
//! for a fixed time, then prints the round trips per second.
//!
//! ```sh
//! cargo run --release --example ws_bench -- server 127.0.0.1:9001
//! cargo run --release --example ws_bench -- client ws://127.0.0.1:9001/ws 50 10 64
//! ```
//!
//! (connections, seconds, message bytes). Output: one JSON line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    match args.first().map(String::as_str) {
        Some("server") => rt.block_on(server(&args[1])),
        Some("client") => {
            let n: usize = args[2].parse().expect("connections");
            let secs: u64 = args[3].parse().expect("seconds");
            let size: usize = args[4].parse().expect("message bytes");
            rt.block_on(client(&args[1], n, Duration::from_secs(secs), size));
        }
        _ => eprintln!("usage: ws_bench server ADDR | client URL CONNECTIONS SECONDS BYTES"),
    }
}

async fn server(addr: &str) {
    let listener = TcpListener::bind(addr).await.expect("bind");
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
            while let Some(Ok(msg)) = ws.next().await {
                if (msg.is_binary() || msg.is_text()) && ws.send(msg).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn client(url: &str, n: usize, run: Duration, size: usize) {
    let trips = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + run;
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (url, trips, errors) = (url.to_owned(), trips.clone(), errors.clone());
            tokio::spawn(async move {
                let Ok((mut ws, _)) = tokio_tungstenite::connect_async(&url).await else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let payload = vec![b'x'; size];
                while Instant::now() < until {
                    if ws.send(Message::binary(payload.clone())).await.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    match ws.next().await {
                        Some(Ok(m)) if m.len() == size => trips.fetch_add(1, Ordering::Relaxed),
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    };
                }
                let _ = ws.close(None).await;
            })
        })
        .collect();
    let started = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    let secs = started.elapsed().as_secs_f64();
    let trips = trips.load(Ordering::Relaxed);
    println!(
        "{{\"round_trips\": {trips}, \"seconds\": {secs:.3}, \"per_second\": {:.1}, \"errors\": {}}}",
        trips as f64 / secs,
        errors.load(Ordering::Relaxed)
    );
}
