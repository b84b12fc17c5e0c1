//! The resend after a stale pooled connection when the resend itself
//! cannot connect: the head kept for it is made a request again and
//! retried on another endpoint.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::Request;
use tokio::io::AsyncWriteExt;

/// An upstream that answers `ok` on kept-alive connections, and records
/// each request head, until it is stopped: then it no longer accepts
/// connections (a new one is refused), and resets an open one as soon as
/// it has read a head (a process going down).
struct Stoppable {
    addr: SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    heads: Arc<std::sync::Mutex<Vec<String>>>,
}

async fn stoppable_upstream() -> Stoppable {
    let listener = gateway::net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, heads) = (tokio_util::sync::CancellationToken::new(), Arc::new(std::sync::Mutex::new(Vec::new())));
    let (token, seen) = (stop.clone(), heads.clone());
    tokio::spawn(async move {
        loop {
            let mut s = tokio::select! {
                accepted = listener.accept() => match accepted { Ok((s, _)) => s, Err(_) => return },
                // The listener is dropped: connecting is refused.
                _ = token.cancelled() => return,
            };
            let (token, seen) = (token.clone(), seen.clone());
            tokio::spawn(async move {
                while let Some(head) = read_head(&mut s).await {
                    seen.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
                    if token.is_cancelled() {
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                        return;
                    }
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Stoppable { addr, stop, heads }
}

/// A request whose pooled connection turns out stale, and whose resend
/// cannot connect (the endpoint is gone), is retried on another endpoint
/// as it was: the head kept for the resend is made a request again.
#[tokio::test]
async fn a_stale_resend_that_cannot_connect_is_retried_elsewhere_whole() {
    let (a, b) = (stoppable_upstream().await, stoppable_upstream().await);
    let toml = endpoints_toml("gone", &[a.addr, b.addr], "balance = \"round_robin\"", "retries = 1");
    let gw = TestGateway::from_toml(&toml).await;
    // One idle pooled connection to each endpoint.
    for _ in 0..2 {
        assert_eq!(get(&gw.url("/gone/warm")).await.0.status, 200);
    }
    assert_eq!((a.heads.lock().unwrap().len(), b.heads.lock().unwrap().len()), (1, 1));
    a.stop.cancel();
    // Round robin: one of the two goes to A's pooled connection first.
    for i in 0..2 {
        let req = Request::get(gw.url(&format!("/gone/probe/{i}?q=1")))
            .header("x-probe", format!("p{i}"))
            .header("cookie", "c=1")
            .body(full(Bytes::new()))
            .unwrap();
        let (parts, body) = send(req).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"ok"[..]), "probe {i}");
    }
    let at_a: Vec<String> = a.heads.lock().unwrap().drain(1..).collect();
    assert_eq!(at_a.len(), 1, "one probe went to the stale connection: {at_a:?}");
    let probe = at_a[0].lines().next().unwrap().split(' ').nth(1).unwrap().to_owned();
    let at_b = b.heads.lock().unwrap();
    let again = at_b.iter().find(|h| h.contains(&probe)).expect("the probe A reset reached B");
    let header = |head: &str, name: &str| {
        head.lines()
            .find_map(|l| l.split_once(": ").filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.to_owned()))
    };
    for name in ["x-probe", "cookie", "x-request-id", "x-forwarded-for", "host"] {
        assert_eq!(header(again, name), header(&at_a[0], name), "{name} as first sent");
    }
    assert!(header(again, "x-probe").is_some());
}
