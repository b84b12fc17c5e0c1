//! The connection watchdog when the connection's task has spent its
//! cooperative budget before polling it. (A file of its own: its header
//! timeouts, counted in the process's metrics, would show in other tests'
//! counts.)

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A head trickled in behind a burst of pipelined requests the gateway
/// answers itself is still cut off at the header read timeout. The burst
/// spends the connection task's cooperative budget (a socket read or write
/// each) before the task first polls its watchdog: that poll of the
/// watchdog's timer is refused, and the watchdog must poll it again, else
/// the connection keeps no timeout at all. Several connections: whether
/// the watchdog was polled before the burst (beside the protocol sniff)
/// is up to `select!`'s random order.
#[tokio::test]
async fn slowloris_behind_a_pipelined_burst_is_still_cut_off() {
    let (up, seen) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(
        up.addr,
        "burst",
        "",
        "header_read_timeout = \"300ms\"\nidle_timeout = \"300ms\"",
    ))
    .await;
    let burst = b"GET /alive HTTP/1.1\r\nHost: x\r\n\r\n".repeat(300);
    let mut hung = 0;
    for _ in 0..6 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(&[&burst[..], b"GET /alive HTTP/1.1\r\nHost: x\r\nX-Trickle: a"].concat()).await.unwrap();
        let started = Instant::now();
        let r = read_for(&mut s, Duration::from_secs(3)).await;
        assert_eq!(r.text.matches("HTTP/1.1 200").count(), 300, "every pipelined request answered");
        if !r.closed || started.elapsed() > Duration::from_millis(300 + 2000) {
            hung += 1;
        }
    }
    assert_eq!(hung, 0, "connections never cut off at the header read timeout: {hung} of 6");
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    still_serving(&gw).await;
}
