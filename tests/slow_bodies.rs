//! A client that never finishes its request body costs nobody else
//! anything: it gets its own answer (408, counted as
//! `rejected{reason="body_timeout"}`), the upstream's endpoints get no
//! verdict (no ejection, no upstream error), and it holds no `max_requests`
//! slot or queue place while its body trickles in. Tried on every path: the
//! route deadline and the body idle timeout, bodies read ahead or streamed,
//! Content-Length and chunked, HTTP/1 and HTTP/2 clients, HTTP/1 and HTTP/2
//! upstreams, retries, and an ejected endpoint's trial request.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// How the slow client sends its unfinished body.
#[derive(Debug, Clone, Copy)]
enum Client {
    /// HTTP/1.1, `Content-Length: 100` and four bytes.
    Length,
    /// HTTP/1.1, chunked, one chunk and no last chunk.
    Chunked,
    /// HTTP/2, `content-length: 100` and four bytes, no END_STREAM.
    Http2,
}

/// An HTTP/2-only (prior knowledge) upstream that reads the whole request
/// body and answers `ok`; counts the requests it saw.
async fn h2c_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    count.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, Infallible>(Response::new(full("ok")))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// Sends the slow client's request to `path` and returns the status it gets
/// (0 if none within `wait`).
async fn slow_request(gw: SocketAddr, path: &str, client: Client, wait: Duration) -> u16 {
    match client {
        Client::Length | Client::Chunked => {
            let head = match client {
                Client::Length => format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabcd"),
                _ => format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n"),
            };
            let mut s = TcpStream::connect(gw).await.unwrap();
            s.write_all(head.as_bytes()).await.unwrap();
            read_for(&mut s, wait).await.status()
        }
        Client::Http2 => {
            let (mut h2, _ping) = raw_h2(gw, 65535).await;
            let req = Request::post(format!("http://{gw}{path}")).header("content-length", "100").body(()).unwrap();
            let (response, mut body) = h2.send_request(req, false).unwrap();
            body.send_data(Bytes::from_static(b"abcd"), false).unwrap();
            let status = tokio::time::timeout(wait, response).await;
            // Keep the stream open (the body unfinished) until answered.
            drop(body);
            status.ok().and_then(|r| r.ok()).map_or(0, |r| r.status().as_u16())
        }
    }
}

/// One case: an upstream of two endpoints with outlier detection, a route
/// with a 600 ms timeout and `route_extra`; four slow clients at once; then
/// what each got and what the upstream was charged with.
async fn case(name: &str, h2_upstream: bool, client: Client, route_extra: &str) {
    let (a, b, seen) = if h2_upstream {
        let ((a, sa), (b, sb)) = (h2c_upstream().await, h2c_upstream().await);
        (a, b, vec![sa, sb])
    } else {
        let ((ua, sa), (ub, sb)) = (counting_upstream().await, counting_upstream().await);
        (ua.addr, ub.addr, vec![sa, sb])
    };
    let protocol = if h2_upstream { "protocol = \"h2c\"\n" } else { "" };
    let toml = format!(
        "[upstreams.{name}]\nendpoints = [\"http://{a}\", \"http://{b}\"]\n{protocol}\
         outlier = {{ consecutive_failures = 2, ejection_time = \"30s\" }}\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nupstream = \"{name}\"\ntimeout = \"600ms\"\n{route_extra}\n"
    );
    let gw = TestGateway::from_toml(&toml).await;
    let path = format!("/{name}/upload");
    let addr = gw.addr;
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move { slow_request(addr, &path, client, Duration::from_secs(3)).await })
        })
        .collect();
    for s in slow {
        assert_eq!(s.await.unwrap(), 408, "{name} ({client:?}): the client's unfinished body is its own 408");
    }
    let m = metrics_text(gw.addr).await;
    let upstream = [("upstream", name)];
    assert_eq!(sample(&m, "gateway_upstream_ejections_total", &upstream).unwrap_or(0.0), 0.0, "{name}: ejected");
    for kind in ["timeout", "reset", "body", "body_timeout"] {
        let charged = sample(&m, "gateway_upstream_errors_total", &[("upstream", name), ("kind", kind)]);
        assert_eq!(charged.unwrap_or(0.0), 0.0, "{name}: counted as the upstream's {kind}");
    }
    assert_eq!(rejected(&m, name, "body_timeout"), 4.0, "{name}: counted as the client's body_timeout");
    // Both endpoints still take traffic.
    for _ in 0..4 {
        assert_eq!(get(&gw.url(&format!("/{name}/ok"))).await.0.status, 200, "{name}: an endpoint was ejected");
    }
    let reached: usize = seen.iter().map(|s| s.load(Ordering::SeqCst)).sum();
    assert!(reached >= 4, "{name}: the healthy requests reached the upstream");
}

#[tokio::test]
async fn an_unfinished_body_read_ahead_is_the_clients_408_at_the_route_deadline() {
    case("sb_ahead", false, Client::Length, "").await;
}

#[tokio::test]
async fn an_unfinished_streamed_body_is_the_clients_408_at_the_route_deadline() {
    case("sb_stream", false, Client::Length, "request_buffer = \"0\"").await;
}

#[tokio::test]
async fn an_unfinished_chunked_body_is_the_clients_408() {
    case("sb_chunked", false, Client::Chunked, "request_buffer = \"0\"").await;
    case("sb_chunked_ahead", false, Client::Chunked, "").await;
}

#[tokio::test]
async fn an_http2_clients_unfinished_body_is_its_own_408() {
    case("sb_h2client", false, Client::Http2, "request_buffer = \"0\"").await;
    case("sb_h2client_ahead", false, Client::Http2, "").await;
}

#[tokio::test]
async fn an_unfinished_body_to_an_http2_upstream_is_the_clients_408() {
    case("sb_h2up", true, Client::Length, "request_buffer = \"0\"").await;
}

#[tokio::test]
async fn a_stalled_body_past_body_timeout_is_the_clients_408() {
    case("sb_idle", false, Client::Length, "request_buffer = \"0\"\nbody_timeout = \"200ms\"").await;
    case("sb_idle_ahead", false, Client::Length, "body_timeout = \"200ms\"").await;
}

#[tokio::test]
async fn a_retrying_route_neither_retries_nor_charges_an_unfinished_body() {
    case("sb_retry", false, Client::Length, "request_buffer = \"0\"\nretries = 1\nretry_on = [\"connect\", \"reset\"]")
        .await;
}

/// An ejected endpoint's trial taken by a client whose body never ends is
/// no verdict: the trial is free again, and the next request brings the
/// endpoint back.
#[tokio::test]
async fn a_trial_request_with_an_unfinished_body_gives_no_verdict() {
    let failing = Arc::new(AtomicUsize::new(1));
    let f = failing.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let f = f.clone();
        async move {
            let _ = req.into_body().collect().await;
            let mut r = Response::new(full("up"));
            if f.load(Ordering::SeqCst) == 1 {
                *r.status_mut() = http::StatusCode::BAD_GATEWAY;
            }
            r
        }
    })
    .await;
    let toml = format!(
        "[upstreams.sb_trial]\nurl = \"http://{}\"\noutlier = {{ consecutive_failures = 1, ejection_time = \"300ms\" }}\n\
         [[routes]]\nname = \"sb_trial\"\nprefix = \"/t\"\nupstream = \"sb_trial\"\ntimeout = \"600ms\"\nrequest_buffer = \"0\"\n",
        up.addr
    );
    let gw = TestGateway::from_toml(&toml).await;
    assert_eq!(get(&gw.url("/t/x")).await.0.status, 502);
    assert_eq!(get(&gw.url("/t/x")).await.0.status, 503, "ejected");
    tokio::time::sleep(Duration::from_millis(400)).await;
    failing.store(0, Ordering::SeqCst);
    // The trial goes to a client that never finishes its body.
    assert_eq!(slow_request(gw.addr, "/t/up", Client::Length, Duration::from_secs(3)).await, 408);
    // Not ejected again: the next request is the trial, and it succeeds.
    assert_eq!(get(&gw.url("/t/x")).await.0.status, 200, "the unfinished body's trial ejected the endpoint again");
    assert_eq!(get(&gw.url("/t/x")).await.0.status, 200);
}

/// Five clients that send one byte of a 1000-byte body hold no slot and no
/// queue place: a legitimate request is served at once.
#[tokio::test]
async fn unfinished_bodies_hold_no_slot_and_no_queue_place() {
    let (up, seen) = counting_upstream().await;
    let toml = format!(
        "[upstreams.sb_slots]\nurl = \"http://{}\"\nmax_requests = 2\nqueue = 3\n\
         [[routes]]\nname = \"sb_slots\"\nprefix = \"/s\"\nupstream = \"sb_slots\"\ntimeout = \"2s\"\n",
        up.addr
    );
    let gw = TestGateway::from_toml(&toml).await;
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"POST /s/up HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nz").await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..3 {
        let started = tokio::time::Instant::now();
        let (parts, body) = get(&gw.url("/s/ok")).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"ok"[..]), "request {i} was turned away");
        assert!(started.elapsed() < Duration::from_millis(1500), "request {i} waited for the slow bodies");
    }
    assert_eq!(seen.load(Ordering::SeqCst), 3, "the unfinished bodies never reached the upstream");
    for mut s in held {
        assert_eq!(read_for(&mut s, Duration::from_secs(4)).await.status(), 408);
    }
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "sb_slots", "queue_full"), 0.0);
    assert_eq!(rejected(&m, "sb_slots", "body_timeout"), 5.0);
}

/// A body larger than `request_buffer` streams: it takes its slot once its
/// first `request_buffer` bytes are in, and reaches the upstream whole.
#[tokio::test]
async fn a_body_past_the_buffer_streams_whole_once_its_first_bytes_are_in() {
    let (up, _) = counting_upstream().await;
    let toml = format!(
        "[upstreams.sb_big]\nurl = \"http://{}\"\nmax_requests = 1\nqueue = 0\n\
         [[routes]]\nname = \"sb_big\"\nprefix = \"/big\"\nupstream = \"sb_big\"\nrequest_buffer = \"1KiB\"\n",
        up.addr
    );
    let gw = TestGateway::from_toml(&toml).await;
    for body in [vec![b'q'; 10_000], vec![b'r'; 1024], vec![b's'; 1025], Vec::new()] {
        let req = Request::post(gw.url("/big/echo")).body(full(body.clone())).unwrap();
        let (parts, got) = send(req).await;
        assert_eq!(parts.status, 200);
        let want: &[u8] = if body.is_empty() { b"ok" } else { &body };
        assert_eq!(&got[..], want, "a {}-byte body", body.len());
    }
    // Chunked, read ahead in full (under the buffer) and past it.
    for n in [100usize, 5000] {
        let chunked = format!(
            "POST /big/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{n:x}\r\n{}\r\n0\r\n\r\n",
            "c".repeat(n)
        );
        let r = raw(gw.addr, chunked.as_bytes(), Duration::from_secs(3)).await;
        assert_eq!(r.status(), 200, "{}", r.text);
        assert!(r.text.contains(&"c".repeat(n)), "chunked body of {n} bytes not echoed whole");
    }
}

/// An upstream that gives up on a body the client is still trickling (its
/// own body timeout) is not charged with it: the client gets its 408.
#[tokio::test]
async fn an_upstream_that_gives_up_on_a_trickling_body_is_not_charged() {
    let addr = raw_upstream(|mut s| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    })
    .await;
    let toml = format!(
        "[upstreams.sb_gaveup]\nurl = \"http://{addr}\"\noutlier = {{ consecutive_failures = 1, ejection_time = \"30s\" }}\n\
         [[routes]]\nname = \"sb_gaveup\"\nprefix = \"/g\"\nupstream = \"sb_gaveup\"\ntimeout = \"5s\"\nrequest_buffer = \"0\"\n"
    );
    let gw = TestGateway::from_toml(&toml).await;
    for client in [Client::Length, Client::Chunked] {
        assert_eq!(slow_request(gw.addr, "/g/up", client, Duration::from_secs(3)).await, 408, "{client:?}");
    }
    let m = metrics_text(gw.addr).await;
    let reset = sample(&m, "gateway_upstream_errors_total", &[("upstream", "sb_gaveup"), ("kind", "reset")]);
    assert_eq!(reset.unwrap_or(0.0), 0.0, "counted as the upstream's reset");
    assert_eq!(sample(&m, "gateway_upstream_ejections_total", &[("upstream", "sb_gaveup")]).unwrap_or(0.0), 0.0);
    assert_eq!(rejected(&m, "sb_gaveup", "body_timeout"), 2.0);
}

/// An upstream that resets while a client sends its body at full speed
/// failed on its own: 502 and its reset, not the client's 408.
#[tokio::test]
async fn an_upstream_that_resets_a_fast_upload_is_charged_with_it() {
    let addr = raw_upstream(|mut s| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 16384];
        let mut got = 0usize;
        while got < 100_000 {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
        }
        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    })
    .await;
    let toml = format!(
        "[upstreams.sb_fast]\nurl = \"http://{addr}\"\n\
         [[routes]]\nname = \"sb_fast\"\nprefix = \"/f\"\nupstream = \"sb_fast\"\ntimeout = \"5s\"\n"
    );
    let gw = TestGateway::from_toml(&toml).await;
    // Clients on threads of their own, writing as fast as the socket takes
    // it, as a real uploader does (not interleaved with the gateway's task).
    let addr = gw.addr;
    let statuses = tokio::task::spawn_blocking(move || {
        (0..20)
            .map(|_| {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                let mut request = b"POST /f/up HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n".to_vec();
                request.extend(std::iter::repeat_n(b'u', 900_000));
                let _ = s.write_all(&request);
                let mut head = [0u8; 12];
                let _ = s.read_exact(&mut head);
                String::from_utf8_lossy(&head[9..12]).into_owned()
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(!statuses.iter().any(|s| s == "408"), "a fast client was blamed for the upstream's reset: {statuses:?}");
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "sb_fast", "body_timeout"), 0.0);
}
