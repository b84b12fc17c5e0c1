//! A hostile review of the gateway's own client-facing HTTP/2 connection
//! (`server.http2 = "gateway"`) against hyper's on the same input: what a
//! client or an upstream can do to a stream the gateway serves.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{TestGateway, bounded, proxy_toml};
use gateway::config::Http2Server;
use http::Request;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A gateway with the given HTTP/2 connection in front of `up`.
async fn gateway(up: std::net::SocketAddr, http2: Http2Server) -> TestGateway {
    let mut config = common::config(&proxy_toml(up, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http2 = http2;
    TestGateway::start(config).await
}

fn req(gw: &TestGateway, method: &str, path: &str) -> Request<()> {
    Request::builder().method(method).uri(format!("http://{}{path}", gw.addr)).body(()).unwrap()
}

/// The interim answers before the final one, and the final status.
async fn interims_then_status(gw: &TestGateway) -> (Vec<http::Response<()>>, u16) {
    let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
    let (mut answer, _) = client.send_request(req(gw, "GET", "/d/x"), true).unwrap();
    let mut got = Vec::new();
    while let Some(interim) = std::future::poll_fn(|cx| answer.poll_informational(cx)).await {
        got.push(interim.unwrap());
    }
    (got, answer.await.unwrap().status().as_u16())
}

/// An upstream that answers a flood of 103s before its answer: the
/// number an HTTP/2 client is sent is bounded (h2 queues a HEADERS frame
/// for each, outside flow control, so an unbounded number held for a
/// client that does not read would grow the gateway without end).
#[tokio::test]
async fn a_flood_of_early_hints_reaches_the_client_bounded() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            // One at a time, each read before the next: none is lost to
            // the queue between the upstream and the client's stream.
            for _ in 0..100 {
                let _ = s.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n").await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await;
    let gw = gateway(up, Http2Server::Gateway).await;
    let (interims, status) = bounded(interims_then_status(&gw)).await;
    assert_eq!(status, 200);
    assert!(!interims.is_empty() && interims.len() <= 16, "{} interim answers forwarded", interims.len());
}

/// A 103's `Connection` field, `Keep-Alive` and the fields `Connection`
/// names are the upstream connection's own (RFC 9110 §7.6.1): none of
/// them reaches an HTTP/2 client, the `Link` fields do.
#[tokio::test]
async fn early_hints_lose_the_fields_their_connection_field_names() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let hints = b"HTTP/1.1 103 Early Hints\r\nConnection: X-Hint, keep-alive\r\nKeep-Alive: 5\r\n\
                          X-Hint: private\r\nLink: </a.css>; rel=preload\r\n\r\n";
            let _ = s.write_all(hints).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await;
    let gw = gateway(up, Http2Server::Gateway).await;
    let (interims, status) = bounded(interims_then_status(&gw)).await;
    assert_eq!((status, interims.len()), (200, 1));
    let fields = interims[0].headers();
    assert_eq!(fields.get("link").unwrap(), "</a.css>; rel=preload");
    for gone in ["connection", "keep-alive", "x-hint"] {
        assert!(fields.get(gone).is_none(), "{gone} forwarded: {fields:?}");
    }
}
