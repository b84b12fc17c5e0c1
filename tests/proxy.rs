//! End-to-end proxy behaviour on real sockets: rewrite, streaming, header
//! rules, errors and timeouts, connection pooling and the stale-connection
//! retry.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn proxy_config(upstream: std::net::SocketAddr, route: &str, extra: &str) -> String {
    format!(
        r#"
[upstreams.{route}]
url = "http://{upstream}"
pool_idle_timeout = "5s"

[[routes]]
name = "{route}"
prefix = "/{route}"
upstream = "{route}"
{extra}
"#
    )
}

/// An upstream that answers with what it saw: method, path and query, and headers.
async fn echo_upstream() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let mut text = format!("{} {}\n", req.method(), req.uri());
        for (k, v) in req.headers() {
            text.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
        }
        Response::builder()
            .header("connection", "x-upstream-private")
            .header("x-upstream-private", "secret")
            .header("keep-alive", "timeout=5")
            .header("x-upstream-public", "visible")
            .body(full(text))
            .unwrap()
    })
    .await
}

#[tokio::test]
async fn round_trip_rewrites_prefix_and_keeps_query() {
    let up = echo_upstream().await;
    let gw = TestGateway::from_toml(&proxy_config(up.addr, "rt", "rewrite = \"/a\"")).await;
    let (parts, body) = get(&gw.url("/rt/x/y?q=1&r=two")).await;
    assert_eq!(parts.status, 200);
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(body.starts_with("GET /a/x/y?q=1&r=two\n"), "{body}");
    let (_, body) = get(&gw.url("/rt")).await;
    assert!(body.starts_with(b"GET /a\n"), "{body:?}");
    // Segment-aware: /rtx is not under /rt.
    let (parts, _) = get(&gw.url("/rtx")).await;
    assert_eq!(parts.status, 404);
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_and_forwarding_headers_set() {
    let up = echo_upstream().await;
    let gw = TestGateway::from_toml(&proxy_config(up.addr, "hops", "")).await;
    let req = Request::get(gw.url("/hops/h"))
        .header("host", "public.example:8443")
        .header("connection", "keep-alive, x-client-private")
        .header("x-client-private", "1")
        .header("keep-alive", "timeout=3")
        .header("te", "deflate, trailers")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-end-to-end", "kept")
        .body(full(Bytes::new()))
        .unwrap();
    let (parts, body) = send(req).await;
    let seen = String::from_utf8(body.to_vec()).unwrap().to_lowercase();
    for gone in ["x-client-private", "keep-alive:", "proxy-authorization", "connection:", "deflate"] {
        assert!(!seen.contains(gone), "upstream saw {gone:?}:\n{seen}");
    }
    // TE is hop-by-hop, but that the client accepts trailers is passed on.
    assert!(seen.contains("\nte: trailers\n"), "{seen}");
    assert!(seen.contains("x-end-to-end: kept"), "{seen}");
    assert!(seen.contains("x-forwarded-for: 203.0.113.9, 127.0.0.1\n"), "{seen}");
    assert!(seen.contains("x-forwarded-proto: http\n"), "{seen}");
    assert!(seen.contains("x-forwarded-host: public.example:8443\n"), "{seen}");
    assert!(seen.contains("host: public.example:8443\n"), "host is preserved by default:\n{seen}");
    // The gateway's name in Via: a random one per process by default.
    let via = gateway::headers::Via::default();
    assert!(seen.contains(&format!("via: 1.1 {}\n", via.name())), "{seen}");
    // And on the way back.
    assert!(parts.headers.get("x-upstream-private").is_none());
    assert!(parts.headers.get("keep-alive").is_none());
    assert_eq!(parts.headers["x-upstream-public"], "visible");
    assert_eq!(parts.headers["via"], format!("1.1 {}", via.name()));
}

fn forwarded_request(url: &str) -> Request<TestBody> {
    Request::get(url)
        .header("host", "app.example")
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "public.example")
        .header("forwarded", "for=198.51.100.7;proto=https;host=public.example")
        .header("x-forwarded-for", "198.51.100.7")
        .header("x-real-ip", "198.51.100.7")
        .header("x-forwarded-port", "443")
        .header("x_forwarded_ssl", "on")
        .header("x-forwarded-prefix", "/app")
        .body(full(Bytes::new()))
        .unwrap()
}

/// The fields of [`forwarded_request`] that only a proxy may send, as the
/// upstream echoes them.
const PROXY_ONLY: [&str; 4] =
    ["x-real-ip: 198.51.100.7\n", "x-forwarded-port: 443\n", "x_forwarded_ssl: on\n", "x-forwarded-prefix: /app\n"];

#[tokio::test]
async fn forwarding_headers_from_a_trusted_proxy_are_kept() {
    let up = echo_upstream().await;
    let toml = format!(
        "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"127.0.0.0/8\"]\n{}",
        proxy_config(up.addr, "trusted", "")
    );
    let gw = TestGateway::from_toml(&toml).await;
    let seen = String::from_utf8(send(forwarded_request(&gw.url("/trusted"))).await.1.to_vec()).unwrap();
    assert!(seen.contains("x-forwarded-proto: https\n"), "{seen}");
    assert!(seen.contains("x-forwarded-host: public.example\n"), "{seen}");
    assert!(
        seen.contains(
            "forwarded: for=198.51.100.7;proto=https;host=public.example, for=127.0.0.1;proto=http;host=app.example\n"
        ),
        "{seen}"
    );
    assert!(seen.contains("x-forwarded-for: 198.51.100.7, 127.0.0.1\n"), "{seen}");
    for field in PROXY_ONLY {
        assert!(seen.contains(field), "{field:?} from a trusted proxy is kept: {seen}");
    }
}

#[tokio::test]
async fn forwarding_headers_from_an_untrusted_peer_are_replaced() {
    let up = echo_upstream().await;
    let toml = format!(
        "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"::1/128\"]\n{}",
        proxy_config(up.addr, "untrusted", "")
    );
    let gw = TestGateway::from_toml(&toml).await;
    let seen = String::from_utf8(send(forwarded_request(&gw.url("/untrusted"))).await.1.to_vec()).unwrap();
    assert!(seen.contains("x-forwarded-proto: http\n"), "{seen}");
    assert!(seen.contains("x-forwarded-host: app.example\n"), "{seen}");
    // Its Forwarded goes before routing, as a request's without one.
    assert!(!seen.contains("\nforwarded:"), "{seen}");
    // X-Forwarded-For is appended to either way, as nginx's $proxy_add_x_forwarded_for.
    assert!(seen.contains("x-forwarded-for: 198.51.100.7, 127.0.0.1\n"), "{seen}");
    // What only a proxy in front may say goes, in any spelling.
    for field in PROXY_ONLY {
        let name = field.split(':').next().unwrap();
        assert!(!seen.contains(name), "{name} from an untrusted peer reached the upstream: {seen}");
    }
}

#[tokio::test]
async fn a_proxy_only_field_a_route_rule_sets_reaches_the_upstream() {
    // Dropped from the client before the route's rules run, not after.
    let up = echo_upstream().await;
    let rule = "request_headers = { set = { \"X-Forwarded-Prefix\" = \"/api\" } }\n";
    let gw = TestGateway::from_toml(&proxy_config(up.addr, "prefixed", rule)).await;
    let seen = String::from_utf8(send(forwarded_request(&gw.url("/prefixed"))).await.1.to_vec()).unwrap();
    assert!(seen.contains("x-forwarded-prefix: /api\n"), "{seen}");
    assert!(!seen.contains("x-real-ip") && !seen.contains("/app"), "{seen}");
}

#[tokio::test]
async fn trust_is_decided_on_the_plain_ipv4_address_on_a_dual_stack_listener() {
    let up = echo_upstream().await;
    let toml = format!("[server]\ntrusted_proxies = [\"127.0.0.1\"]\n{}", proxy_config(up.addr, "dual", ""));
    let mut c = config(&toml, std::path::Path::new("."));
    c.server.listen = "[::]:0".parse().unwrap();
    let gw = TestGateway::start(c).await;
    let url = format!("http://127.0.0.1:{}/dual", gw.addr.port());
    let seen = String::from_utf8(send(forwarded_request(&url)).await.1.to_vec()).unwrap();
    assert!(seen.contains("x-forwarded-proto: https\n"), "127.0.0.1 is trusted, even as ::ffff:127.0.0.1: {seen}");
    assert!(seen.contains("x-forwarded-for: 198.51.100.7, 127.0.0.1\n"), "{seen}");
}

#[tokio::test]
async fn underscore_spellings_of_forwarding_headers_are_dropped() {
    // CGI-style stacks read X_Forwarded_Proto as X-Forwarded-Proto.
    let up = echo_upstream().await;
    let gw = TestGateway::from_toml(&proxy_config(up.addr, "underscore", "")).await;
    let req = Request::get(gw.url("/underscore"))
        .header("x_forwarded_proto", "https")
        .header("X_Forwarded_Host", "evil.example")
        .header("x_forwarded_for", "6.6.6.6")
        .header("x_custom_header", "kept")
        .body(full(Bytes::new()))
        .unwrap();
    let seen = String::from_utf8(send(req).await.1.to_vec()).unwrap();
    assert!(!seen.contains("x_forwarded"), "{seen}");
    assert!(seen.contains("x_custom_header: kept\n"), "other underscore headers pass: {seen}");
}

#[tokio::test]
async fn host_upstream_mode_sends_the_upstream_authority() {
    let up = echo_upstream().await;
    let gw = TestGateway::from_toml(&proxy_config(up.addr, "hostup", "host = \"upstream\"")).await;
    let req = Request::get(gw.url("/hostup")).header("host", "public.example").body(full(Bytes::new())).unwrap();
    let (_, body) = send(req).await;
    let seen = String::from_utf8(body.to_vec()).unwrap();
    assert!(seen.contains(&format!("host: {}\n", up.addr)), "{seen}");
    assert!(seen.contains("x-forwarded-host: public.example\n"), "{seen}");
}

const BIG: usize = 32 * 1024 * 1024;

/// A checksum that notices reordering and loss.
fn fletcher(data: &[u8], state: &mut (u64, u64)) {
    for &b in data {
        state.0 = (state.0 + b as u64) % 65521;
        state.1 = (state.1 + state.0) % 65521;
    }
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 13)) as u8
}

#[tokio::test]
async fn large_bodies_stream_both_ways() {
    // The upstream streams the request body back as it arrives.
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        Response::new(req.into_body().map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>).boxed())
    })
    .await;
    let gw = TestGateway::from_toml(&proxy_config(up.addr, "stream", "timeout = \"60s\"\nmax_body = \"64MiB\"")).await;

    // A chunked upload fed by hand: never a whole-body buffer here.
    type Item = Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>;
    let (tx, rx) = tokio::sync::mpsc::channel::<Item>(2);
    let upload = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let chunk = |c: usize| Bytes::from((c * 65536..(c + 1) * 65536).map(pattern).collect::<Vec<u8>>());
    let chunks = BIG / 65536;
    let mut expected = (1, 0);
    for c in 0..chunks {
        fletcher(&chunk(c), &mut expected);
    }
    // Half the upload, then nothing more until the echo has started to come
    // back: a gateway that buffered either body would wait for the end.
    let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        for c in 0..chunks / 2 {
            tx.send(Ok(Frame::data(chunk(c)))).await.unwrap();
        }
        if go_rx.await.is_ok() {
            for c in chunks / 2..chunks {
                tx.send(Ok(Frame::data(chunk(c)))).await.unwrap();
            }
        }
    });
    let resp = client().request(Request::post(gw.url("/stream")).body(StreamBody::new(upload).boxed()).unwrap());
    let resp = tokio::time::timeout(Duration::from_secs(10), resp).await.expect("the response head arrives").unwrap();
    assert_eq!(resp.status(), 200);
    let (first, first_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        let mut body = resp.into_body();
        let (mut got, mut len) = ((1, 0), 0usize);
        let mut first = Some(first);
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                len += data.len();
                fletcher(&data, &mut got);
                if let Some(f) = first.take() {
                    let _ = f.send(());
                }
            }
        }
        (len, got)
    });
    tokio::time::timeout(Duration::from_secs(10), first_rx)
        .await
        .expect("the echo must arrive while the upload is half sent: the gateway buffered a body")
        .unwrap();
    go.send(()).unwrap();
    let (len, got) = reader.await.unwrap();
    assert_eq!(len, BIG);
    assert_eq!(got, expected);
}

#[tokio::test]
async fn refused_upstream_is_502_and_counted() {
    let addr = refused_addr().await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.refuser]\nurl = \"http://{addr}\"\n[[routes]]\nname = \"refused\"\nprefix = \"/refused\"\nupstream = \"refuser\"\n"
    ))
    .await;
    let (parts, body) = get(&gw.url("/refused")).await;
    assert_eq!(parts.status, StatusCode::BAD_GATEWAY);
    assert!(body.starts_with(b"bad gateway"), "{body:?}");
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_errors_total", &[("upstream", "refuser"), ("kind", "connect")]), Some(1.0));
    assert_eq!(
        sample(&m, "http_server_requests_total", &[("route", "refused"), ("method", "GET"), ("status", "502")]),
        Some(1.0)
    );
}

#[tokio::test]
async fn hung_upstream_is_504_at_the_route_timeout() {
    // Accepts, never answers.
    let addr = raw_upstream(|s| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(s);
    })
    .await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.hung]\nurl = \"http://{addr}\"\n[[routes]]\nname = \"hung\"\nprefix = \"/hung\"\nupstream = \"hung\"\ntimeout = \"300ms\"\n"
    ))
    .await;
    let started = Instant::now();
    let (parts, body) = get(&gw.url("/hung")).await;
    let elapsed = started.elapsed();
    assert_eq!(parts.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(body.starts_with(b"gateway timeout"), "{body:?}");
    assert!(elapsed >= Duration::from_millis(300), "answered before the timeout: {elapsed:?}");
    assert!(elapsed < Duration::from_millis(300 + 1500), "took {elapsed:?}");
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_errors_total", &[("upstream", "hung"), ("kind", "timeout")]), Some(1.0));
}

#[tokio::test]
async fn garbage_from_upstream_is_502_protocol() {
    let addr = raw_upstream(|mut s| async move {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\nthis is not http\r\n\r\n").await;
    })
    .await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.garbage]\nurl = \"http://{addr}\"\n[[routes]]\nname = \"garbage\"\nprefix = \"/garbage\"\nupstream = \"garbage\"\n"
    ))
    .await;
    let (parts, _) = get(&gw.url("/garbage")).await;
    assert_eq!(parts.status, StatusCode::BAD_GATEWAY);
    let m = metrics_text(gw.addr).await;
    assert_eq!(
        sample(&m, "gateway_upstream_errors_total", &[("upstream", "garbage"), ("kind", "protocol")]),
        Some(1.0)
    );
}

#[tokio::test]
async fn sequential_requests_reuse_one_pooled_connection() {
    let up = TestUpstream::start(|_req| async { Response::new(full("ok")) }).await;
    let gw = TestGateway::from_toml(&proxy_config(up.addr, "pooled", "")).await;
    for _ in 0..100 {
        let (parts, body) = get(&gw.url("/pooled")).await;
        assert_eq!(parts.status, 200);
        assert_eq!(&body[..], b"ok");
    }
    assert!(up.connections() <= 2, "100 requests opened {} upstream connections", up.connections());
    let m = metrics_text(gw.addr).await;
    let opened = sample(&m, "gateway_upstream_connections_opened_total", &[("upstream", "pooled")]).unwrap();
    assert_eq!(opened as usize, up.connections());
}

#[tokio::test]
async fn pool_idle_timeout_closes_idle_connections() {
    // The upstream records when each of its connections is closed by the peer.
    let closed = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let (c, a) = (closed.clone(), accepted.clone());
    let addr = raw_upstream(move |mut s| {
        a.fetch_add(1, Ordering::SeqCst);
        let c = c.clone();
        async move {
            let mut buf = vec![0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        c.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    Ok(_) => {
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
                    }
                }
            }
        }
    })
    .await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.idle]\nurl = \"http://{addr}\"\npool_idle_timeout = \"200ms\"\n[[routes]]\nname = \"idle\"\nprefix = \"/idle\"\nupstream = \"idle\"\n"
    ))
    .await;
    assert_eq!(get(&gw.url("/idle")).await.0.status, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    while closed.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(closed.load(Ordering::SeqCst), 1, "the idle pooled connection was never closed");
    assert_eq!(get(&gw.url("/idle")).await.0.status, 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// An upstream that answers the first request on each connection, then
/// reads the next one and closes without a word: what a keep-alive timeout
/// racing a new request looks like.
async fn one_shot_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    let addr = raw_upstream(move |mut s| {
        a.fetch_add(1, Ordering::SeqCst);
        async move {
            // Read one request head (and any small body) and answer it.
            if read_head(&mut s).await.is_none() {
                return;
            }
            let mut buf = vec![0u8; 65536];
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
            // The next request on this connection gets the door shut.
            let _ = s.read(&mut buf).await;
        }
    })
    .await;
    (addr, accepted)
}

#[tokio::test]
async fn stale_pooled_connection_is_retried_once_for_get_only() {
    let (addr, accepted) = one_shot_upstream().await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.stale]\nurl = \"http://{addr}\"\n[[routes]]\nname = \"stale\"\nprefix = \"/stale\"\nupstream = \"stale\"\n"
    ))
    .await;
    // Fill the pool with several connections, each of which will shut on its
    // next request: a retry that went back to the pool would hit another.
    let warm: Vec<_> = (0..6).map(|_| tokio::spawn(get_status(gw.url("/stale")))).collect();
    for w in warm {
        assert_eq!(w.await.unwrap(), 200);
    }
    for i in 0..5 {
        let (parts, _) = get(&gw.url("/stale")).await;
        assert_eq!(parts.status, 200, "GET {i} should have been retried on a fresh connection");
    }
    assert!(accepted.load(Ordering::SeqCst) >= 5);
    let m = metrics_text(gw.addr).await;
    assert!(sample(&m, "gateway_upstream_retries_total", &[("upstream", "stale")]).unwrap() >= 4.0);

    // A POST with a body is never sent twice: the client sees the failure.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let req = Request::post(gw.url("/stale")).body(full("payload")).unwrap();
        statuses.push(send(req).await.0.status.as_u16());
    }
    assert!(statuses.contains(&502), "a POST on a stale connection must not be retried: {statuses:?}");
}

async fn get_status(url: String) -> u16 {
    get(&url).await.0.status.as_u16()
}

#[tokio::test]
async fn methods_restriction_gives_405_with_allow() {
    let up = TestUpstream::start(|_req| async { Response::new(full("ok")) }).await;
    let gw = TestGateway::from_toml(&proxy_config(up.addr, "ro", "methods = [\"GET\", \"HEAD\"]")).await;
    let (parts, _) = send(Request::delete(gw.url("/ro")).body(full(Bytes::new())).unwrap()).await;
    assert_eq!(parts.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(parts.headers["allow"], "GET, HEAD");
    assert_eq!(get(&gw.url("/ro")).await.0.status, 200);
    assert_eq!(up.connections(), 1, "the DELETE must not reach the upstream");
}

#[tokio::test]
async fn upstream_reset_mid_body_cuts_the_client_response() {
    let addr = raw_upstream(|mut s| async move {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n").await;
        let _ = s.write_all(&[b'x'; 1000]).await;
    })
    .await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.cut]\nurl = \"http://{addr}\"\n[[routes]]\nname = \"cut\"\nprefix = \"/cut\"\nupstream = \"cut\"\n"
    ))
    .await;
    let resp = client().request(Request::get(gw.url("/cut")).body(full(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.into_body().collect().await.is_err(), "a cut body must not look complete");
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_errors_total", &[("upstream", "cut"), ("kind", "body")]), Some(1.0));
}

#[tokio::test]
async fn a_connection_still_sending_an_early_answered_body_is_not_reused() {
    // The upstream answers each request head at once, without waiting for
    // its body, and keeps the connection open reading whatever comes (as a
    // server that discards an unwanted body does).
    let addr = raw_upstream(|mut s| async move {
        let mut buf = vec![0u8; 65536];
        let mut seen = Vec::new();
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
            while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                seen.drain(..end + 4);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nearly").await;
            }
        }
    })
    .await;
    // Streamed, not read ahead: the upstream answers before the body is in.
    let gw = TestGateway::from_toml(&proxy_config(addr, "early", "timeout = \"5s\"\nrequest_buffer = \"0\"")).await;
    // Client A declares a body, sends a little of it, and stalls.
    let mut a = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    a.write_all(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nsome").await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(3), a.read(&mut buf)).await.expect("A is answered").unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    // Client B must not wait behind A's unfinished upload.
    let started = Instant::now();
    let (parts, body) = get(&gw.url("/early")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"early"[..]));
    assert!(started.elapsed() < Duration::from_secs(2), "B waited {:?}", started.elapsed());
    drop(a);
}
