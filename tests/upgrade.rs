//! HTTP/1.1 upgrades on proxy routes: a real WebSocket
//! client and server (tokio-tungstenite) talk through the gateway; refused
//! and forbidden upgrades; the idle timeout; shutdown.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request as WsRequest, Response as WsResponse};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// A WebSocket echo server; keeps the path and headers of each handshake.
async fn echo_server() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let addr = raw_upstream(move |stream| {
        let log = log.clone();
        async move {
            #[allow(clippy::result_large_err)] // tungstenite's callback signature
            let callback = |req: &WsRequest, resp: WsResponse| {
                let headers: Vec<String> =
                    req.headers().iter().map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?"))).collect();
                log.lock().unwrap().push(format!("{} {}", req.uri(), headers.join("; ")));
                Ok(resp)
            };
            let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else { return };
            while let Some(Ok(msg)) = ws.next().await {
                // tungstenite answers pings and the close itself.
                if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, seen)
}

fn ws_toml(up: SocketAddr, route: &str, extra_route: &str, extra_server: &str) -> String {
    proxy_toml(up, route, extra_route, extra_server)
}

async fn gauge(gw: &TestGateway, route: &str) -> f64 {
    let text = metrics_text(gw.addr).await;
    sample(&text, "gateway_upgraded_connections_active", &[("route", route)]).unwrap_or(0.0)
}

/// Waits (bounded) until the route's active-tunnels gauge reads `want`.
async fn gauge_becomes(gw: &TestGateway, route: &str, want: f64) {
    for _ in 0..100 {
        if gauge(gw, route).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("gateway_upgraded_connections_active{{route={route}}} never became {want}: {}", gauge(gw, route).await);
}

#[tokio::test]
async fn websocket_text_binary_and_close_pass_both_ways() {
    let (up, seen) = echo_server().await;
    // With request rules, which strip hop-by-hop headers before the proxy.
    let rules = "request_headers = { set = { \"x-env\" = \"test\" } }";
    let gw = TestGateway::from_toml(&ws_toml(up, "chat", rules, "")).await;
    let url = format!("ws://{}/chat/room?id=1", gw.addr);
    let (mut ws, response) = tokio_tungstenite::connect_async(&url).await.expect("handshake through the gateway");
    assert_eq!(response.status(), 101);
    assert!(response.headers().contains_key("sec-websocket-accept"), "{:?}", response.headers());
    assert!(response.headers().get("x-request-id").is_some(), "the 101 carries the request ID");

    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    let blob: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    ws.send(Message::binary(blob.clone())).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(blob));
    gauge_becomes(&gw, "chat", 1.0).await;

    ws.send(Message::Close(Some(CloseFrame { code: CloseCode::Away, reason: "bye".into() }))).await.unwrap();
    match ws.next().await {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(frame.code, CloseCode::Away),
        other => panic!("expected the server's close frame back, got {other:?}"),
    }
    assert!(ws.next().await.is_none(), "the stream ends after the close handshake");
    // The server closed its side; the tunnel ends once the client's closes.
    drop(ws);
    gauge_becomes(&gw, "chat", 0.0).await;

    let handshake = seen.lock().unwrap().join("\n");
    assert!(handshake.starts_with("/chat/room?id=1 "), "{handshake}");
    let lower = handshake.to_ascii_lowercase();
    assert!(lower.contains("connection: upgrade") && lower.contains("upgrade: websocket"), "{handshake}");
    assert!(lower.contains("x-forwarded-for: 127.0.0.1") && lower.contains("x-env: test"), "{handshake}");
    let text = metrics_text(gw.addr).await;
    assert_eq!(sample(&text, "http_server_requests_total", &[("route", "chat"), ("status", "101")]), Some(1.0));
}

/// A raw HTTP/1.1 upgrade request for `path`.
fn upgrade_request(path: &str, protocol: &str, connection: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: h\r\nConnection: {connection}\r\nUpgrade: {protocol}\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
    .into_bytes()
}

/// An upstream that answers 403 "no" and keeps the headers it saw.
async fn refusing_upstream() -> (TestUpstream, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let log = log.clone();
        async move {
            let h: Vec<String> =
                req.headers().iter().map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?"))).collect();
            log.lock().unwrap().push(h.join("; ").to_ascii_lowercase());
            let mut r = Response::new(full("no"));
            *r.status_mut() = http::StatusCode::FORBIDDEN;
            r
        }
    })
    .await;
    (up, seen)
}

#[tokio::test]
async fn an_upgrade_the_upstream_refuses_is_an_ordinary_response_on_a_kept_connection() {
    let (up, seen) = refusing_upstream().await;
    let gw = TestGateway::from_toml(&ws_toml(up.addr, "ws", "", "")).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(&upgrade_request("/ws/x", "websocket", "Upgrade, HTTP2-Settings")).await.unwrap();
    let first = one_response(&mut s).await;
    assert_eq!(first.status(), 403, "{}", first.text);
    assert!(first.text.ends_with("no") && !first.closed, "{}", first.text);
    // The connection still carries requests.
    s.write_all(b"GET /ws/y HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
    assert_eq!(one_response(&mut s).await.status(), 403);
    let first_seen = seen.lock().unwrap()[0].clone();
    assert!(first_seen.contains("connection: upgrade") && first_seen.contains("upgrade: websocket"), "{first_seen}");
    // Connection's other members stay hop-by-hop.
    assert!(!first_seen.contains("http2-settings"), "{first_seen}");
}

#[tokio::test]
async fn upgrade_false_strips_the_upgrade_headers() {
    let (up, seen) = refusing_upstream().await;
    let gw = TestGateway::from_toml(&ws_toml(up.addr, "ws", "upgrade = false", "")).await;
    let r = raw(gw.addr, &upgrade_request("/ws/x", "websocket", "Upgrade"), Duration::from_millis(500)).await;
    assert_eq!(r.status(), 403, "{}", r.text);
    let got = seen.lock().unwrap()[0].clone();
    assert!(!got.contains("upgrade"), "upstream saw upgrade headers on an upgrade = false route: {got}");
}

#[tokio::test]
async fn h2c_upgrades_and_upgrade_without_connection_are_never_passed_on() {
    let (up, seen) = refusing_upstream().await;
    let gw = TestGateway::from_toml(&ws_toml(up.addr, "ws", "", "")).await;
    for (protocol, connection) in [("h2c", "Upgrade, HTTP2-Settings"), ("websocket", "keep-alive")] {
        let r = raw(gw.addr, &upgrade_request("/ws/x", protocol, connection), Duration::from_millis(500)).await;
        assert_eq!(r.status(), 403, "{}", r.text);
        let got = seen.lock().unwrap().pop().unwrap();
        assert!(!got.contains("upgrade"), "Upgrade: {protocol} / Connection: {connection} reached the upstream: {got}");
    }
    // Beside another protocol, h2c is dropped and the other asked for.
    // (It was all dropped, and the upstream refused the plain request.)
    let r = raw(gw.addr, &upgrade_request("/ws/x", "websocket, h2c", "Upgrade"), Duration::from_millis(500)).await;
    assert_eq!(r.status(), 403, "{}", r.text);
    let got = seen.lock().unwrap().pop().unwrap().to_ascii_lowercase();
    assert!(got.contains("; upgrade: websocket;") && !got.contains("h2c"), "{got}");
}

/// An upstream that switches to "echo" with a bare 101 and then echoes
/// raw bytes: a tunnel that is not WebSocket.
async fn raw_switching_upstream() -> SocketAddr {
    switching_upstream(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n").await
}

/// Sends an upgrade to `echo` and reads the 101.
async fn open_echo_tunnel(gw: &TestGateway) -> TcpStream {
    open_echo_tunnel_at(gw, "/ws/t").await
}

/// Reads up to the end of a message head, byte by byte (so nothing after it
/// is taken); empty if the peer closed first.
async fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.unwrap_or(0) == 0 {
            return Vec::new();
        }
        head.push(b[0]);
    }
    head
}

async fn open_echo_tunnel_at(gw: &TestGateway, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let head = String::from_utf8_lossy(&read_head(&mut s).await).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101") && head.contains("upgrade: echo"), "{head}");
    s
}

async fn echo_once(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).await.unwrap();
    let mut buf = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut buf)).await.expect("echo in time").unwrap();
    assert_eq!(buf, msg);
}

#[tokio::test]
async fn a_silent_tunnel_closes_after_upgrade_idle_timeout_and_a_busy_one_does_not() {
    let up = raw_switching_upstream().await;
    let gw = TestGateway::from_toml(&ws_toml(up, "ws", "upgrade_idle_timeout = \"400ms\"", "")).await;
    // Busy: a byte every 150 ms, three times the idle timeout long.
    let mut busy = open_echo_tunnel(&gw).await;
    for i in 0..8u8 {
        echo_once(&mut busy, &[i]).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    echo_once(&mut busy, b"still open").await;
    // Silent: closed by the gateway (the busy one too, once silent).
    // Taken before the upgrade is asked: its tunnel's idle time starts later.
    let started = std::time::Instant::now();
    let mut silent = open_echo_tunnel(&gw).await;
    let r = read_for(&mut silent, Duration::from_secs(3)).await;
    assert!(r.closed && r.text.is_empty(), "a silent tunnel must be closed: {:?}", r.text);
    assert!(started.elapsed() >= Duration::from_millis(395), "closed before its idle timeout: {:?}", started.elapsed());
    assert!(read_for(&mut busy, Duration::from_secs(3)).await.closed);
}

#[tokio::test]
async fn shutdown_drains_tunnels_until_the_shutdown_timeout() {
    let up = raw_switching_upstream().await;
    let mut gw = TestGateway::from_toml(&ws_toml(up, "ws", "", "shutdown_timeout = \"1500ms\"")).await;
    let mut s = open_echo_tunnel(&gw).await;
    echo_once(&mut s, b"before").await;
    gw.shutdown();
    tokio::time::sleep(Duration::from_millis(500)).await;
    echo_once(&mut s, b"during the drain").await;
    let r = read_for(&mut s, Duration::from_secs(4)).await;
    assert!(r.closed, "the tunnel must be cut at the shutdown timeout");
    tokio::time::timeout(Duration::from_secs(3), &mut gw.task).await.expect("the gateway stops").unwrap();
}

#[tokio::test]
async fn http2_requests_never_upgrade() {
    let (up, seen) = refusing_upstream().await;
    let gw = TestGateway::from_toml(&ws_toml(up.addr, "ws", "", "")).await;
    // HTTP/2 forbids Connection and Upgrade; the gateway's h2 side refuses
    // the malformed request outright, and nothing reaches the upstream.
    let (mut h2, _ping) = raw_h2(gw.addr, 65_535).await;
    let req = Request::get(format!("http://{}/ws/x", gw.addr)).header("upgrade", "websocket").body(()).unwrap();
    let answered = match h2.send_request(req, true) {
        Ok((resp, _)) => resp.await.map(|r| r.status().as_u16()).ok(),
        Err(_) => None,
    };
    assert_ne!(answered, Some(101));
    assert!(seen.lock().unwrap().iter().all(|h| !h.contains("upgrade")), "{:?}", seen.lock().unwrap());
}

#[tokio::test]
async fn a_101_to_a_protocol_not_asked_for_is_502() {
    for head in [
        &b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"[..],
        &b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n"[..],
    ] {
        let up = switching_upstream(head).await;
        let gw = TestGateway::from_toml(&ws_toml(up, "ws", "", "")).await;
        let r = raw(
            gw.addr,
            b"GET /ws/t HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n",
            Duration::from_millis(500),
        )
        .await;
        assert_eq!(r.status(), 502, "{}", r.text);
    }
}

#[tokio::test]
async fn a_tunnel_whose_client_stops_reading_is_cut_at_send_timeout() {
    // After its 101 the upstream writes without end; the client reads
    // nothing but keeps sending a byte now and then, so the tunnel is never
    // idle.
    let up = raw_upstream(|mut s: TcpStream| async move {
        if read_head(&mut s).await.is_empty() {
            return;
        }
        let (mut rd, mut wr) = s.into_split();
        tokio::spawn(async move {
            let mut sink = [0u8; 64];
            while rd.read(&mut sink).await.unwrap_or(0) > 0 {}
        });
        let _ = wr.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n").await;
        let chunk = vec![b'x'; 64 * 1024];
        while wr.write_all(&chunk).await.is_ok() {}
    })
    .await;
    let gw = TestGateway::from_toml(&ws_toml(up, "flood", "", "send_timeout = \"500ms\"")).await;
    let mut s = open_echo_tunnel_at(&gw, "/flood/t").await;
    gauge_becomes(&gw, "flood", 1.0).await;
    let mut cut = false;
    for _ in 0..40 {
        if s.write_all(b".").await.is_err() || gauge(&gw, "flood").await == 0.0 {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cut, "the tunnel must be cut once the client has taken nothing for send_timeout");
}
