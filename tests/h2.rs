//! HTTP/2 to upstreams: `protocol = "h2c"` multiplexes
//! requests on `max_connections` shared connections; trailers pass both
//! ways; health checks speak HTTP/2; the settings are checked at load.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, HeaderValue, Request, Response, Version};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// What the upstream saw of each request: version, URI, request trailers,
/// how many lines of each field in [`ADDED`].
type Seen = Arc<Mutex<Vec<String>>>;

/// The fields the gateway adds to a request on its way upstream.
const ADDED: [&str; 6] =
    ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "via", "x-request-id", "traceparent"];

/// An HTTP/2-only (prior knowledge) upstream: waits `delay`, then answers
/// `h2 ok` with a `grpc-status` trailer, echoing the request's `x-sum`
/// trailer as `x-got`. At most `streams` concurrent streams per connection.
async fn h2_upstream(delay: Duration, streams: u32) -> (SocketAddr, Arc<AtomicUsize>, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen: Seen = Arc::default();
    let (count, log) = (connections.clone(), seen.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let log = log.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let (version, uri) = (req.version(), req.uri().clone());
                        let added = ADDED.map(|name| (name, req.headers().get_all(name).iter().count()));
                        let collected = req.into_body().collect().await.unwrap();
                        let sum = collected.trailers().and_then(|t| t.get("x-sum")).cloned();
                        log.lock().unwrap().push(format!("{version:?} {uri} trailer={sum:?} added={added:?}"));
                        tokio::time::sleep(delay).await;
                        if uri.path().ends_with("/big") {
                            let big = Bytes::from(vec![b'b'; 3 << 20]);
                            let frames = vec![Ok::<_, Infallible>(Frame::data(big))];
                            return Ok::<_, Infallible>(Response::new(StreamBody::new(futures_util::stream::iter(
                                frames,
                            ))));
                        }
                        let mut trailers = HeaderMap::new();
                        trailers.insert("grpc-status", HeaderValue::from_static("0"));
                        if let Some(sum) = sum {
                            trailers.insert("x-got", sum);
                        }
                        let frames = vec![
                            Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"h2 ok"))),
                            Ok(Frame::trailers(trailers)),
                        ];
                        let body = StreamBody::new(futures_util::stream::iter(frames));
                        Ok::<_, Infallible>(Response::new(body))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(streams)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, connections, seen)
}

fn h2_toml(up: SocketAddr, extra: &str) -> String {
    format!(
        "[server]\n[upstreams.grpc]\nurl = \"http://{up}\"\nprotocol = \"h2c\"\n{extra}\n\
         [[routes]]\nname = \"grpc\"\nprefix = \"/svc\"\nupstream = \"grpc\"\n"
    )
}

#[tokio::test]
async fn h2c_multiplexes_concurrent_requests_on_one_connection() {
    let (up, connections, seen) = h2_upstream(Duration::from_millis(200), 100).await;
    let gw = TestGateway::from_toml(&h2_toml(up, "")).await;
    let started = std::time::Instant::now();
    let requests: Vec<_> = (0..20).map(|i| tokio::spawn(get_owned(gw.url(&format!("/svc/m?i={i}"))))).collect();
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!((status, &body[..]), (200, &b"h2 ok"[..]));
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1, "one HTTP/2 connection carries them all");
    // At once, not one after another (20 x 200 ms would be 4 s).
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let seen = seen.lock().unwrap();
    let first = seen.iter().find(|l| l.contains("i=0")).unwrap();
    assert!(first.starts_with("HTTP/2.0 http://") && first.contains(&format!("{}/svc/m?i=0", gw.addr)), "{first}");
}

async fn get_owned(url: String) -> (u16, Bytes) {
    let (parts, body) = get(&url).await;
    (parts.status.as_u16(), body)
}

#[tokio::test]
async fn max_connections_spreads_requests_over_that_many_connections() {
    let (up, connections, _) = h2_upstream(Duration::from_millis(50), 100).await;
    let gw = TestGateway::from_toml(&h2_toml(up, "max_connections = 2")).await;
    for round in 0..3 {
        let requests: Vec<_> =
            (0..4).map(|i| tokio::spawn(get_owned(gw.url(&format!("/svc/m?r={round}&i={i}"))))).collect();
        for r in requests {
            assert_eq!(r.await.unwrap().0, 200);
        }
    }
    assert_eq!(connections.load(Ordering::SeqCst), 2, "exactly max_connections, kept and reused");
}

#[tokio::test]
async fn trailers_pass_both_ways_between_http2_client_and_upstream() {
    let (up, _, seen) = h2_upstream(Duration::ZERO, 100).await;
    let gw = TestGateway::from_toml(&h2_toml(up, "")).await;
    let (mut client, _conn) = h2_client(gw.addr).await;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", HeaderValue::from_static("abc123"));
    let frames = vec![
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(Bytes::from_static(b"payload"))),
        Ok(Frame::trailers(trailers)),
    ];
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let req = Request::post(format!("http://{}/svc/echo", gw.addr))
        .version(Version::HTTP_2)
        .header("te", "trailers")
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap();
    let response = client.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let got = collected.trailers().cloned().expect("response trailers reach the client");
    assert_eq!(got.get("grpc-status").unwrap(), "0");
    assert_eq!(got.get("x-got").unwrap(), "abc123", "the request's trailer reached the upstream");
    assert_eq!(&collected.to_bytes()[..], b"h2 ok");
    assert!(seen.lock().unwrap()[0].contains("trailer=Some(\"abc123\")"));
}

/// An HTTP/2 upstream gets each field the gateway adds once, from an
/// HTTP/1.1 client and an HTTP/2 one alike, whether the client sent it or
/// not (those it did not are kept beside the request until it is sent, see
/// `headers::stamp`), on the first request of a connection and on later ones.
#[tokio::test]
async fn an_http2_upstream_gets_each_added_field_once() {
    let (up, _, seen) = h2_upstream(Duration::ZERO, 100).await;
    let gw = TestGateway::from_toml(&h2_toml(up, "")).await;
    let once = format!("added={:?}", ADDED.map(|name| (name, 1)));
    for i in 0..2 {
        assert_eq!(get(&gw.url(&format!("/svc/h1/{i}"))).await.0.status, 200);
        let req = Request::get(gw.url(&format!("/svc/carried/{i}")))
            .header("x-forwarded-for", "1.2.3.4")
            .header("via", "1.1 edge")
            .header("x-request-id", "given-1")
            .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .body(full(Bytes::new()))
            .unwrap();
        assert_eq!(send(req).await.0.status, 200);
    }
    let (mut client, _conn) = h2_client(gw.addr).await;
    let req =
        Request::get(format!("http://{}/svc/h2", gw.addr)).version(Version::HTTP_2).body(full(Bytes::new())).unwrap();
    assert_eq!(client.send_request(req).await.unwrap().status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 5);
    for line in seen.iter() {
        assert!(line.ends_with(&once), "{line}");
    }
}

#[tokio::test]
async fn health_checks_speak_http2_to_an_h2c_upstream() {
    let (up, _, seen) = h2_upstream(Duration::ZERO, 100).await;
    let health = "[upstreams.grpc.health]\npath = \"/healthz\"\ninterval = \"100ms\"";
    let gw = TestGateway::from_toml(&h2_toml(up, health)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get(&gw.url("/readyz")).await.0.status, 200, "an HTTP/1.1 probe would fail on an h2-only upstream");
    assert!(seen.lock().unwrap().iter().any(|l| l.starts_with("HTTP/2.0") && l.contains("/healthz")));
}

#[test]
fn http2_settings_are_checked_at_load() {
    let load = |toml: &str| {
        let source = gateway::config::Source::Inline { text: toml.to_owned(), base_dir: std::env::temp_dir() };
        gateway::config::load(&source).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let up = |extra: &str| format!("[upstreams.u]\nurl = \"http://127.0.0.1:1\"\n{extra}\n");
    let cases = [
        (up("protocol = \"h3\""), "upstreams.u.protocol", "use \"http1\", \"h2c\" or \"auto\""),
        (up("protocol = \"auto\""), "upstreams.u.protocol", "every endpoint must be https://"),
        (up("max_connections = 4"), "upstreams.u.max_connections", "only for HTTP/2"),
        (up("protocol = \"h2c\"\nmax_connections = 0"), "upstreams.u.max_connections", "at least 1"),
    ];
    for (toml, key, want) in &cases {
        let err = load(toml);
        assert!(err.contains(key) && err.contains(want), "want {key}: …{want}…, got {err:?}");
    }
}

/// RFC 9113 §8.3.1: over HTTP/2 a `Host` beside `:authority` must name the
/// same host, and two are as ambiguous as in HTTP/1.1. Either is 400, and
/// never reaches the upstream (which would otherwise be sent the `Host`).
#[tokio::test]
async fn an_http2_host_that_contradicts_the_authority_is_400() {
    let (up, _, seen) = h2_upstream(Duration::ZERO, 100).await;
    let gw = TestGateway::from_toml(&h2_toml(up, "")).await;
    let authority = gw.addr.to_string();
    let cases: &[(&[&str], u16)] = &[
        (&[], 200),
        (&[authority.as_str()], 200),
        (&["evil.example"], 400),
        (&[authority.as_str(), "evil.example"], 400),
    ];
    for (hosts, want) in cases {
        let (mut client, _ping) = raw_h2(gw.addr, 65535).await;
        let mut req = Request::get(gw.url("/svc/m")).body(()).unwrap();
        for host in *hosts {
            req.headers_mut().append(http::header::HOST, HeaderValue::from_str(host).unwrap());
        }
        let before = seen.lock().unwrap().len();
        let (resp, _) = client.send_request(req, true).unwrap();
        let status = resp.await.unwrap().status().as_u16();
        assert_eq!(status, *want, "Host {hosts:?}");
        assert_eq!(seen.lock().unwrap().len() - before, usize::from(*want == 200), "Host {hosts:?}");
    }
}

#[tokio::test]
async fn a_bad_host_is_400_and_never_ejects_the_upstream() {
    let (up, _, _) = h2_upstream(Duration::ZERO, 100).await;
    let outlier = "[upstreams.grpc.outlier]\nconsecutive_failures = 3";
    let gw = TestGateway::from_toml(&h2_toml(up, outlier)).await;
    for _ in 0..5 {
        let r = raw(gw.addr, b"GET /svc/m HTTP/1.1\r\nHost: a b\r\n\r\n", Duration::from_millis(500)).await;
        assert_eq!(r.status(), 400, "{}", r.text);
    }
    assert_eq!(get(&gw.url("/svc/m")).await.0.status, 200, "the upstream was not ejected");
}

#[tokio::test]
async fn a_client_body_over_the_limit_is_413_over_http2_and_never_ejects() {
    let (up, _, _) = h2_upstream(Duration::ZERO, 100).await;
    let toml = h2_toml(up, "[upstreams.grpc.outlier]\nconsecutive_failures = 3")
        .replace("upstream = \"grpc\"\n", "upstream = \"grpc\"\nmax_body = \"1KiB\"\n");
    let gw = TestGateway::from_toml(&toml).await;
    let chunked = format!(
        "POST /svc/up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n{}\r\n0\r\n\r\n",
        "x".repeat(4096)
    );
    for _ in 0..5 {
        let r = raw(gw.addr, chunked.as_bytes(), Duration::from_millis(1000)).await;
        assert_eq!(r.status(), 413, "{}", r.text);
    }
    assert_eq!(get(&gw.url("/svc/m")).await.0.status, 200, "the client's body is no fault of the upstream");
}

#[tokio::test]
async fn clients_that_stop_reading_do_not_stall_the_shared_connection() {
    let (up, _, _) = h2_upstream(Duration::ZERO, 100).await;
    let toml = h2_toml(up, "").replace("upstream = \"grpc\"\n", "upstream = \"grpc\"\nbody_timeout = \"2s\"\n");
    let gw = TestGateway::from_toml(&toml).await;
    // Three HTTP/2 clients ask for 3 MiB each and never read past their
    // first window.
    let mut stuck = Vec::new();
    for _ in 0..3 {
        let (mut h2, ping) = raw_h2(gw.addr, 65_535).await;
        let req = Request::get(format!("http://{}/svc/big", gw.addr)).body(()).unwrap();
        let (resp, _) = h2.send_request(req, true).unwrap();
        stuck.push((h2, ping, resp));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let (parts, body) = get(&gw.url("/svc/big")).await;
    assert_eq!((parts.status.as_u16(), body.len()), (200, 3 << 20), "a reading client gets all of it");
    assert!(started.elapsed() < Duration::from_secs(2), "not held up: {:?}", started.elapsed());
    drop(stuck);
}

#[tokio::test]
async fn requests_waiting_for_a_failed_connect_share_its_failure() {
    // A listener whose accept queue is full: connects to it hang until
    // the connect timeout.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let _filled: Vec<_> =
        (0..4).filter_map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).ok()).collect();
    let toml = h2_toml(addr, "connect_timeout = \"400ms\"")
        .replace("upstream = \"grpc\"\n", "upstream = \"grpc\"\ntimeout = \"1s\"\n");
    let gw = TestGateway::from_toml(&toml).await;
    let requests: Vec<_> = (0..6).map(|i| tokio::spawn(get_owned(gw.url(&format!("/svc/m?i={i}"))))).collect();
    let mut statuses = Vec::new();
    for r in requests {
        statuses.push(r.await.unwrap().0);
    }
    // Each trying again in turn, the later ones would reach the route
    // timeout (504) behind the others' connect timeouts.
    assert!(statuses.iter().all(|s| *s == 502), "{statuses:?}");
    drop(socket);
}

/// An HTTP/2 upstream that refuses every stream (REFUSED_STREAM): the
/// resend of a refused request is a retry like the others, so one request
/// reaches it at most 1 + retries + 1 times.
#[tokio::test]
async fn refused_streams_are_resent_once_a_request_within_its_retries() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let streams = Arc::new(AtomicUsize::new(0));
    let count = streams.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else { return };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    count.fetch_add(1, Ordering::SeqCst);
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    let toml = h2_toml(up, "")
        .replace(
            "upstream = \"grpc\"\n",
            "upstream = \"grpc\"\nretries = 1\nretry_on = [\"connect\", \"reset\", \"503\"]\n",
        )
        .replace("[upstreams.grpc]", "[upstreams.h2refused]")
        .replace("upstream = \"grpc\"", "upstream = \"h2refused\"");
    let gw = TestGateway::from_toml(&toml).await;
    assert_eq!(get(&gw.url("/svc/x")).await.0.status, 502);
    let reached = streams.load(Ordering::SeqCst);
    assert!(reached <= 3, "one GET reached the upstream {reached} times with retries = 1");
}
