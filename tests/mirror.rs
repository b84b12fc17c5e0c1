//! A route's `mirror` (docs/routing.md#shadow-traffic), end to end: copies
//! marked and carrying the request ID, bounded in flight, bodies copied up
//! to `request_buffer` and longer ones skipped, and the client's answer
//! untouched by a shadow that hangs, fails or is slow; copies carry the
//! fields the route's upstream is sent, a shadow's answer is never held
//! whole, and an h2c shadow is spoken to in HTTP/2; a copy's share of
//! `request_buffer_total` is given back once its body is written.

mod common;

use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::counting::{Counting, LIVE};
use common::{
    TestGateway, assert_refused_at_load, counting_upstream, full, metrics_text, raw_upstream, read_head, sample, send,
};
use http::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[global_allocator]
static ALLOC: Counting = Counting;

/// What a shadow answering [`Shadow::Huge`] has written.
static HUGE_WRITTEN: AtomicUsize = AtomicUsize::new(0);
/// How much a shadow answering [`Shadow::Huge`] sends.
const HUGE: usize = 256 << 20;

/// How a shadow upstream treats each copy.
#[derive(Clone, Copy)]
enum Shadow {
    /// Reads the head and never answers.
    Hangs,
    /// Reads the head and closes without a word.
    Fails,
    /// Answers 200 after a pause.
    Slow,
    /// Answers 200 at once.
    Quick,
    /// Answers 200 with a body of [`HUGE`] bytes, counted into
    /// [`HUGE_WRITTEN`] as they are written.
    Huge,
}

/// A shadow upstream that keeps every request it reads: its head (lower
/// case) and its body (by `content-length`; copies are never chunked).
async fn shadow(how: Shadow) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    let addr = raw_upstream(move |mut s| {
        let seen = seen.clone();
        async move {
            let mut rest = Vec::new();
            while let Some(got) = next_request(&mut s, &mut rest).await {
                seen.lock().unwrap().push(got);
                match how {
                    Shadow::Hangs => tokio::time::sleep(Duration::from_secs(3600)).await,
                    Shadow::Fails => return,
                    Shadow::Slow | Shadow::Quick => {
                        if matches!(how, Shadow::Slow) {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nno").await;
                    }
                    Shadow::Huge => {
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {HUGE}\r\n\r\n");
                        let _ = s.write_all(head.as_bytes()).await;
                        let chunk = vec![b'x'; 1 << 20];
                        for _ in 0..HUGE / chunk.len() {
                            if s.write_all(&chunk).await.is_err() {
                                return;
                            }
                            HUGE_WRITTEN.fetch_add(chunk.len(), Ordering::SeqCst);
                        }
                    }
                }
            }
        }
    })
    .await;
    (addr, heads)
}

/// The next request on `s`, its head lower-cased and its body after it;
/// `rest` keeps what was read past it.
async fn next_request(s: &mut tokio::net::TcpStream, rest: &mut Vec<u8>) -> Option<String> {
    let mut buf = std::mem::take(rest);
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        buf.extend(read_head(s).await?);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().expect("a length"));
    let mut chunk = [0u8; 4096];
    while buf.len() < end + length {
        let n = s.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    *rest = buf.split_off(end + length);
    Some(format!("{head}{}", String::from_utf8_lossy(&buf[end..])))
}

/// A route `name` on `/api` to `main`, mirrored to `shadow` (metrics are
/// the process's: each test has a route name of its own).
fn mirrored_toml(name: &str, main: std::net::SocketAddr, shadow: std::net::SocketAddr, percent: u32) -> String {
    format!(
        "[upstreams.main]\nurl = \"http://{main}\"\n[upstreams.shadow]\nurl = \"http://{shadow}\"\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/api\"\nupstream = \"main\"\ntimeout = \"20s\"\n\
         request_buffer = \"1KiB\"\nmirror = {{ upstream = \"shadow\", percent = {percent} }}\n"
    )
}

fn mirror_count(text: &str, route: &str, result: &str) -> f64 {
    sample(text, "gateway_mirror_total", &[("route", route), ("result", result)]).unwrap_or(0.0)
}

#[tokio::test]
async fn the_client_answer_is_untouched_whatever_the_shadow_does() {
    for how in [Shadow::Hangs, Shadow::Fails, Shadow::Slow] {
        let (main, seen) = counting_upstream().await;
        let (shadow_addr, heads) = shadow(how).await;
        let gw = TestGateway::from_toml(&mirrored_toml("untouched", main.addr, shadow_addr, 100)).await;
        // Every other request has a body, copied with it.
        for i in 0..20 {
            let url = gw.url(&format!("/api/x?i={i}"));
            let (req, want) = match i % 2 {
                0 => (Request::get(url).body(full(Bytes::new())).unwrap(), "ok".to_owned()),
                _ => (Request::post(url).body(full(format!("body {i}"))).unwrap(), format!("body {i}")),
            };
            let (parts, body) = common::bounded(send(req)).await;
            assert_eq!((parts.status.as_u16(), &body[..]), (200, want.as_bytes()), "the main upstream's answer");
            assert!(parts.headers.get("x-gateway-mirror").is_none());
        }
        assert_eq!(common::cached::seen(&seen), 20);
        // The copies arrive on their own time.
        for _ in 0..100 {
            if heads.lock().unwrap().len() >= 20 || matches!(how, Shadow::Fails) && !heads.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let heads = heads.lock().unwrap().clone();
        assert!(!heads.is_empty(), "copies reach the shadow");
        for head in &heads {
            assert!(head.starts_with("get /api/x?i=") || head.starts_with("post /api/x?i="), "{head}");
            if head.starts_with("post") {
                let i = head["post /api/x?i=".len()..].split(' ').next().unwrap();
                assert!(head.ends_with(&format!("\r\n\r\nbody {i}")), "{head}");
            }
            assert!(head.contains("x-gateway-mirror: 1\r\n"), "{head}");
            assert!(head.contains("x-request-id: "), "{head}");
        }
    }
}

#[tokio::test]
async fn copies_carry_the_clients_request_id() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, heads) = shadow(Shadow::Slow).await;
    let gw = TestGateway::from_toml(&mirrored_toml("ids", main.addr, shadow_addr, 100)).await;
    let req = Request::get(gw.url("/api/id")).header("x-request-id", "mirror-test-1").body(full(Bytes::new())).unwrap();
    assert_eq!(send(req).await.0.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].contains("x-request-id: mirror-test-1\r\n"), "{}", heads[0]);
    let text = metrics_text(gw.addr).await;
    assert_eq!(mirror_count(&text, "ids", "sent"), 1.0);
    assert_eq!(mirror_count(&text, "ids", "answered"), 1.0);
}

/// A request body of unknown length (sent chunked), in two pieces.
fn chunked(a: &'static str, b: String) -> common::TestBody {
    let frames = [
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(http_body::Frame::data(Bytes::from(a))),
        Ok(http_body::Frame::data(Bytes::from(b))),
    ];
    http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(futures_util::stream::iter(frames)))
}

#[tokio::test]
async fn bodies_are_copied_up_to_request_buffer_and_longer_ones_skipped() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, heads) = shadow(Shadow::Slow).await;
    let gw = TestGateway::from_toml(&mirrored_toml("bodies", main.addr, shadow_addr, 100)).await;
    let long = "x".repeat(4096);
    let cases: Vec<(common::TestBody, String, bool)> = vec![
        (full("a body"), "a body".to_owned(), true),
        (chunked("in ", "pieces".to_owned()), "in pieces".to_owned(), true),
        // Longer than request_buffer (1 KiB): announced, or found out.
        (full(long.clone()), long.clone(), false),
        (chunked("long: ", long.clone()), format!("long: {long}"), false),
    ];
    for (i, (body, want, _)) in cases.into_iter().enumerate() {
        let req = Request::post(gw.url(&format!("/api/body{i}"))).body(body).unwrap();
        let (parts, answer) = common::bounded(send(req)).await;
        assert_eq!((parts.status.as_u16(), &answer[..]), (200, want.as_bytes()), "case {i}: the client's answer");
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(heads[0].starts_with("post /api/body0 ") && heads[0].ends_with("\r\n\r\na body"), "{}", heads[0]);
    assert!(heads[0].contains("content-length: 6\r\n"), "{}", heads[0]);
    assert!(heads[1].starts_with("post /api/body1 ") && heads[1].ends_with("\r\n\r\nin pieces"), "{}", heads[1]);
    assert!(!heads[1].contains("transfer-encoding"), "{}", heads[1]);
    let text = metrics_text(gw.addr).await;
    assert_eq!(mirror_count(&text, "bodies", "sent"), 2.0, "{text}");
    assert_eq!(mirror_count(&text, "bodies", "skipped_body"), 2.0);
    assert_eq!(mirror_count(&text, "bodies", "answered"), 2.0);
}

/// A copy's body counts against `server.request_buffer_total` until it
/// has been written to the shadow, not until the shadow answers: a shadow
/// that reads a copy and never answers holds none of the bound, so the
/// next request's body is read ahead and copied as the first was.
#[tokio::test]
async fn a_copy_gives_its_share_of_the_buffer_back_once_written() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, heads) = shadow(Shadow::Hangs).await;
    // Room for one body read ahead and its copy (700 + 700), not for a
    // second body and copy beside a first copy still counted (2,100).
    let toml =
        format!("[server]\nrequest_buffer_total = \"2KiB\"\n{}", mirrored_toml("written", main.addr, shadow_addr, 100));
    let gw = TestGateway::from_toml(&toml).await;
    let body = "y".repeat(700);
    for i in 1..=2 {
        let req = Request::post(gw.url("/api/w")).body(full(body.clone())).unwrap();
        let (parts, answer) = common::bounded(send(req)).await;
        assert_eq!((parts.status.as_u16(), answer.len()), (200, 700));
        // The shadow has read copy i's body whole (and will never answer).
        for _ in 0..250 {
            if heads.lock().unwrap().len() >= i {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(heads.lock().unwrap().len(), i, "copy {i} reached the shadow");
        assert!(heads.lock().unwrap()[i - 1].ends_with(&body), "copy {i} carries its body");
    }
    let text = metrics_text(gw.addr).await;
    assert_eq!(mirror_count(&text, "written", "sent"), 2.0, "{text}");
    assert_eq!(mirror_count(&text, "written", "skipped_body"), 0.0);
}

#[tokio::test]
async fn copies_in_flight_are_bounded_and_the_rest_skipped() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, heads) = shadow(Shadow::Hangs).await;
    let gw = TestGateway::from_toml(&mirrored_toml("bounded", main.addr, shadow_addr, 100)).await;
    for _ in 0..150 {
        let req = Request::get(gw.url("/api/x")).body(full(Bytes::new())).unwrap();
        assert_eq!(common::bounded(send(req)).await.0.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = metrics_text(gw.addr).await;
    assert_eq!(mirror_count(&text, "bounded", "sent"), 100.0, "{text}");
    assert_eq!(mirror_count(&text, "bounded", "skipped_in_flight"), 50.0);
    assert!(heads.lock().unwrap().len() <= 100);
}

#[tokio::test]
async fn a_percent_copies_about_that_share() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, _) = shadow(Shadow::Slow).await;
    let gw = TestGateway::from_toml(&mirrored_toml("share", main.addr, shadow_addr, 10)).await;
    for _ in 0..1000 {
        let req = Request::get(gw.url("/api/x")).body(full(Bytes::new())).unwrap();
        assert_eq!(send(req).await.0.status, 200);
    }
    let sent = mirror_count(&metrics_text(gw.addr).await, "share", "sent");
    assert!((50.0..=150.0).contains(&sent), "about 10% of 1000: {sent}");
}

#[test]
fn a_mirror_is_checked_at_load() {
    let base = "[upstreams.main]\nurl = \"http://127.0.0.1:1\"\n[upstreams.tls]\nurl = \"https://127.0.0.1:2\"\n";
    for (mirror, key) in [
        ("{ upstream = \"ghost\" }", "routes[0].mirror.upstream"),
        ("{ upstream = \"main\", percent = 0 }", "routes[0].mirror.percent"),
        ("{ upstream = \"main\", percent = 101 }", "routes[0].mirror.percent"),
        ("{ upstream = \"tls\" }", "routes[0].mirror.upstream"),
    ] {
        let toml = format!("{base}[[routes]]\nname = \"r\"\nprefix = \"/\"\nupstream = \"main\"\nmirror = {mirror}\n");
        assert_refused_at_load(&toml, key);
    }
}

/// A field's values in a recorded head (lower-cased), in order.
fn values<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name}: ");
    head.lines().filter_map(|l| l.strip_prefix(prefix.as_str())).collect()
}

/// A copy is sent the fields the route's upstream is: the forwarding
/// fields the gateway sets (not the client's spoofed ones), no `_`
/// spelling the server drops, the same `Host`; the client's own
/// `X-Gateway-Mirror` reaches neither, the gateway's marks the copy alone.
#[tokio::test]
async fn copies_carry_the_fields_the_upstream_is_sent() {
    let (main_addr, main_heads) = shadow(Shadow::Quick).await;
    let (shadow_addr, heads) = shadow(Shadow::Quick).await;
    let toml =
        format!("[server]\ndrop_underscore_headers = true\n{}", mirrored_toml("fields", main_addr, shadow_addr, 100));
    let gw = TestGateway::from_toml(&toml).await;
    let req = Request::get(gw.url("/api/f"))
        .header("host", "app.example")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-host", "evil.example")
        .header("x-forwarded-proto", "https")
        .header("forwarded", "for=6.6.6.6;host=evil.example")
        .header("x_internal_user", "admin")
        .header("x-gateway-mirror", "1")
        .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        .body(full(Bytes::new()))
        .unwrap();
    assert_eq!(common::bounded(send(req)).await.0.status, 200);
    for _ in 0..100 {
        if !heads.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (main, copy) = (main_heads.lock().unwrap()[0].clone(), heads.lock().unwrap()[0].clone());
    for name in ["host", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "forwarded", "via", "traceparent"]
    {
        assert_eq!(values(&copy, name), values(&main, name), "{name}\nmain: {main}\ncopy: {copy}");
    }
    assert_eq!(values(&main, "x-forwarded-host"), ["app.example"], "{main}");
    assert_eq!(values(&main, "x-forwarded-proto"), ["http"], "{main}");
    assert!(!values(&main, "traceparent")[0].contains("b7ad6b7169203331"), "this hop's span is the parent: {main}");
    assert!(values(&main, "x_internal_user").is_empty() && values(&copy, "x_internal_user").is_empty(), "{copy}");
    assert!(values(&main, "x-gateway-mirror").is_empty(), "the client's mark reaches the upstream: {main}");
    assert_eq!(values(&copy, "x-gateway-mirror"), ["1"], "{copy}");
}

/// A shadow's answer is read and dropped a frame at a time: the heap does
/// not grow by what the shadow sends.
#[tokio::test]
async fn a_shadows_answer_is_never_held_whole() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, _) = shadow(Shadow::Huge).await;
    let gw = TestGateway::from_toml(&mirrored_toml("huge", main.addr, shadow_addr, 100)).await;
    let before = LIVE.load(Ordering::SeqCst);
    let peak = Arc::new(AtomicIsize::new(0));
    let watch = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(LIVE.load(Ordering::SeqCst) - before, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let req = Request::get(gw.url("/api/big")).body(full(Bytes::new())).unwrap();
    assert_eq!(common::bounded(send(req)).await.0.status, 200);
    for _ in 0..1000 {
        if HUGE_WRITTEN.load(Ordering::SeqCst) >= HUGE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    watch.abort();
    let (written, peak) = (HUGE_WRITTEN.load(Ordering::SeqCst), peak.load(Ordering::SeqCst));
    assert!(written >= HUGE / 2, "the shadow could send {written} bytes");
    assert!(peak < 32 << 20, "the heap grew by {peak} bytes while the shadow sent {written}");
}

/// An upstream of `protocol = "h2c"` gets its copies in HTTP/2, as its
/// routes' requests, naming the shadow's address as `:authority` and no
/// `Host` beside it (RFC 9113 §8.3.1: they must not differ).
#[tokio::test]
async fn an_h2c_shadow_is_sent_http2() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let (main, _) = counting_upstream().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shadow_addr = listener.local_addr().unwrap();
    let versions = Arc::new(Mutex::new(Vec::new()));
    let seen = versions.clone();
    let named = Arc::new(Mutex::new(Vec::new()));
    let names = named.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (seen, names) = (seen.clone(), names.clone());
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                seen.lock().unwrap().push(req.version());
                let authority = req.uri().authority().map(|a| a.to_string());
                names.lock().unwrap().push((authority, req.headers().get("host").cloned()));
                async { Ok::<_, std::convert::Infallible>(http::Response::new(full("h2"))) }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    let toml =
        mirrored_toml("h2c", main.addr, shadow_addr, 100).replace("[[routes]]", "protocol = \"h2c\"\n[[routes]]");
    let gw = TestGateway::from_toml(&toml).await;
    let req = Request::get(gw.url("/api/h2")).header("host", "shop.example").body(full(Bytes::new())).unwrap();
    assert_eq!(common::bounded(send(req)).await.0.status, 200);
    for _ in 0..100 {
        if !versions.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*versions.lock().unwrap(), [http::Version::HTTP_2]);
    assert_eq!(*named.lock().unwrap(), [(Some(shadow_addr.to_string()), None)]);
    let text = metrics_text(gw.addr).await;
    assert_eq!(mirror_count(&text, "h2c", "answered"), 1.0, "{text}");
}
