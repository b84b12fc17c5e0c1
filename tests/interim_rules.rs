//! A route's `response_headers` rules hold for the upstream's 1xx heads
//! too: a field the rules remove, or set on the answer, reaches no client
//! in a 103 or 102, on the gateway's own HTTP/1.1 and HTTP/2 connections
//! (hyper's forward no 1xx). A hostile review found the 103 passing
//! `X-Secret`, `Server` and `Set-Cookie` that the route removed from the
//! final answer.

mod common;

use std::path::Path;

use common::{TestGateway, bounded, proxy_toml};
use gateway::config::{Http1Server, Http2Server};
use http::Request;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The upstream's 1xx heads and answer, each with the fields the route
/// keeps from clients (`X_Secret` in an underscore spelling).
const ANSWER: &[u8] = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nX-Secret: internal-token\r\n\
    Server: backend/1.2\r\nSet-Cookie: sid=1\r\nX_Secret: internal-token\r\n\r\n\
    HTTP/1.1 102 Processing\r\nset-cookie: sid=2\r\nX-Kept: 1\r\n\r\n\
    HTTP/1.1 200 OK\r\nX-Secret: internal-token\r\nServer: backend/1.2\r\nSet-Cookie: sid=1\r\ncontent-length: 2\r\n\r\nok";

const RULES: &str = "response_headers = { remove = [\"x-secret\", \"set-cookie\"], set = { server = \"gateway\" } }";

async fn gateway(http1: Http1Server, http2: Http2Server) -> TestGateway {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let _ = s.write_all(ANSWER).await;
        }
    })
    .await;
    let mut config = common::config(&proxy_toml(up, "d", RULES, ""), Path::new(env!("CARGO_MANIFEST_DIR")));
    (config.server.http1, config.server.http2) = (http1, http2);
    TestGateway::start(config).await
}

/// What must not reach a client, in any 1xx or the answer.
fn leaked(text: &str) -> Vec<&'static str> {
    let lower = text.to_ascii_lowercase();
    ["internal-token", "backend/1.2", "sid=1", "sid=2", "x_secret"].into_iter().filter(|s| lower.contains(s)).collect()
}

#[tokio::test]
async fn the_own_http11_connection_passes_no_field_the_rules_keep_back() {
    let gw = gateway(Http1Server::Gateway, Http2Server::Hyper).await;
    let got = common::raw(
        gw.addr,
        b"GET /d/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        std::time::Duration::from_secs(5),
    )
    .await
    .text;
    let answer = got.find("HTTP/1.1 200 OK\r\n").expect("the answer");
    let (interims, final_head) = got.split_at(answer);
    assert!(interims.starts_with("HTTP/1.1 103 Early Hints\r\n"), "{got}");
    assert!(interims.contains("link: </a.css>; rel=preload\r\n"), "{got}");
    assert!(interims.contains("HTTP/1.1 102 Processing\r\nx-kept: 1\r\n"), "{got}");
    assert_eq!(leaked(&got), Vec::<&str>::new(), "{got}");
    assert!(!interims.to_ascii_lowercase().contains("server:"), "a 1xx gets no field the rules set: {got}");
    assert!(final_head.contains("server: gateway\r\n"), "{got}");
}

#[tokio::test]
async fn the_own_http2_connection_passes_no_field_the_rules_keep_back() {
    let gw = gateway(Http1Server::Gateway, Http2Server::Gateway).await;
    let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
    let req = Request::get(format!("http://{}/d/x", gw.addr)).body(()).unwrap();
    let (mut answer, _) = client.send_request(req, true).unwrap();
    let mut interims = Vec::new();
    while let Some(interim) = bounded(std::future::poll_fn(|cx| answer.poll_informational(cx))).await {
        interims.push(interim.unwrap());
    }
    let answer = bounded(answer).await.unwrap();
    let statuses: Vec<u16> = interims.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, [103, 102]);
    assert_eq!(interims[0].headers().get("link").unwrap(), "</a.css>; rel=preload");
    assert_eq!(interims[1].headers().get("x-kept").unwrap(), "1");
    let all = format!("{:?} {:?}", interims.iter().map(|r| r.headers()).collect::<Vec<_>>(), answer.headers());
    assert_eq!(leaked(&all), Vec::<&str>::new(), "{all}");
    assert!(interims.iter().all(|r| r.headers().get("server").is_none()), "{all}");
    assert_eq!(answer.headers().get("server").unwrap(), "gateway");
}
