//! Pipelined requests behind an upstream that sends 1xx heads (100, 103,
//! 102) before its answers: every request is answered, in order, on both
//! client-facing HTTP/1.1 connections (hyper's and the gateway's own),
//! with the upstream connection that carried the 1xx reused for the next
//! request. A hostile review reported the second answer missing with
//! hyper's connection; it did not reproduce (a client that half-closes
//! after its requests loses the pipelined ones with hyper's connection
//! whenever the first answer is slow, 1xx or not, on main as here): this
//! guards the case.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TestGateway, proxy_toml};
use gateway::config::Http1Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const INTERIMS: [&str; 3] = [
    "HTTP/1.1 100 Continue\r\n\r\n",
    "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n",
    "HTTP/1.1 102 Processing\r\n\r\n",
];

/// Which upstream connection (by number) carried each request target.
type Carried = Arc<Mutex<Vec<(usize, String)>>>;

/// An upstream that answers each request on a connection in turn, with
/// the 1xx heads first when the target asks for them: `/i` in one write
/// with the answer, `/s` each in a write of its own.
async fn upstream() -> (std::net::SocketAddr, Carried) {
    let carried: Carried = Arc::default();
    let (noted, conns) = (carried.clone(), Arc::new(AtomicUsize::new(0)));
    let addr = common::raw_upstream(move |mut s: TcpStream| {
        let (noted, conn) = (noted.clone(), conns.fetch_add(1, Ordering::SeqCst));
        async move {
            s.set_nodelay(true).unwrap();
            while let Some(head) = common::read_head(&mut s).await {
                let target = common::request_line(&head).split(' ').nth(1).unwrap_or_default().to_owned();
                noted.lock().unwrap().push((conn, target.clone()));
                let body = target.rsplit('/').next().unwrap_or_default().to_owned();
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                let mut out = String::new();
                if target.starts_with("/d/s/") {
                    for interim in INTERIMS {
                        let _ = s.write_all(interim.as_bytes()).await;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                } else if target.starts_with("/d/i/") {
                    out = INTERIMS.concat();
                }
                out.push_str(&answer);
                let _ = s.write_all(out.as_bytes()).await;
            }
        }
    })
    .await;
    (addr, carried)
}

/// Reads from `s` until `bodies` all arrived (or a bound on a hang
/// passes); the status lines seen, and the text.
async fn read_answers(s: &mut TcpStream, bodies: &[&str]) -> (Vec<String>, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if bodies.iter().all(|b| text.contains(&format!("\r\n\r\n{b}"))) || text.matches("\r\n\r\n").count() > 16 {
            break;
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    // A status line may follow a body on the same line: found by its start.
    let statuses = text.match_indices("HTTP/1.").map(|(at, _)| text[at + 9..at + 12].to_owned()).collect();
    (statuses, text)
}

#[tokio::test]
async fn pipelined_requests_are_all_answered_after_upstream_1xx() {
    let (up, carried) = upstream().await;
    for http1 in [Http1Server::Hyper, Http1Server::Gateway] {
        let mut config = common::config(&proxy_toml(up, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
        config.server.http1 = http1;
        let gw = TestGateway::start(config).await;
        // 1xx on the first answer only, on both, on the second only; in
        // one upstream write with the answer or each in its own.
        let pairs = [("i", "p"), ("i", "i"), ("p", "i"), ("s", "p"), ("s", "s")];
        for (case, (first, second)) in pairs.into_iter().enumerate() {
            for version in ["1.1", "1.0"] {
                let keep = if version == "1.0" { "Connection: keep-alive\r\n" } else { "" };
                let (a, b) = (format!("{first}{case}a{version}"), format!("{second}{case}b{version}"));
                let request =
                    |kind: &str, body: &str| format!("GET /d/{kind}/{body} HTTP/{version}\r\nHost: x\r\n{keep}\r\n");
                let mut s = TcpStream::connect(gw.addr).await.unwrap();
                s.write_all((request(first, &a) + &request(second, &b)).as_bytes()).await.unwrap();
                let (statuses, text) = read_answers(&mut s, &[&a, &b]).await;
                let forwarded = |kind: &str| match (http1, version, kind) {
                    (Http1Server::Gateway, "1.1", "i" | "s") => vec!["103", "102", "200"],
                    _ => vec!["200"],
                };
                let want = [forwarded(first), forwarded(second)].concat();
                let what = format!("{http1:?} HTTP/{version} {first}/{second}");
                assert_eq!(statuses, want, "{what}: {text:?}");
                let (ia, ib) = (text.find(&format!("\r\n\r\n{a}")), text.find(&format!("\r\n\r\n{b}")));
                assert!(ia.is_some() && ia < ib, "{what}: both answers, in order: {text:?}");
                let carried = carried.lock().unwrap();
                let conn = |body: &str| carried.iter().find(|(_, t)| t.ends_with(body)).map(|(c, _)| *c);
                assert_eq!(conn(&a), conn(&b), "{what}: one upstream connection carried both: {carried:?}");
            }
        }
    }
}
