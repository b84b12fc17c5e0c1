//! A hostile review of the gateway's own client-facing HTTP/1.1 connection
//! (`server.http1 = "gateway"`) by raw sockets, each case run against a
//! gateway with hyper's connection too: where ours does worse (unsafe,
//! unbounded, hangs, a wrong status, a desync) or differs in a way a
//! client notices, it is a defect. Each test is bounded in time.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{TestGateway, TestUpstream, full, proxy_toml};
use gateway::config::Http1Server;
use http::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the upstream saw, one line per request.
type Seen = Arc<Mutex<Vec<String>>>;

struct Gw {
    gw: TestGateway,
    seen: Seen,
    /// Upstream requests dropped before their answer (the gateway gave up on them).
    cancelled: Arc<AtomicUsize>,
}

/// Counts an upstream request dropped before its answer.
struct Cancel(Arc<AtomicUsize>, bool);

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A gateway with the given HTTP/1.1 connection in front of an upstream
/// that notes every request; `/d/slow` answers after two seconds.
async fn gateway(http1: Http1Server, extra_server: &str) -> Gw {
    let seen: Seen = Arc::default();
    let cancelled = Arc::new(AtomicUsize::new(0));
    let (noted, dropped) = (seen.clone(), cancelled.clone());
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let (noted, dropped) = (noted.clone(), dropped.clone());
        async move {
            let (parts, body) = req.into_parts();
            let line = format!(
                "{} {} host={:?}",
                parts.method,
                parts.uri,
                parts.headers.get_all("host").iter().collect::<Vec<_>>()
            );
            noted.lock().unwrap().push(line.clone());
            let mut guard = Cancel(dropped, false);
            let body = http_body_util::BodyExt::collect(body).await;
            let body = match body {
                Ok(b) => b.to_bytes(),
                Err(e) => Bytes::from(format!("failed: {e}")),
            };
            noted.lock().unwrap().push(format!("  body={body:?}"));
            if parts.uri.path() == "/d/slow" {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            guard.1 = true;
            if parts.uri.path() == "/d/big" {
                return Response::new(full(vec![b'z'; 4 << 20]));
            }
            Response::new(full("ok"))
        }
    })
    .await;
    let toml = proxy_toml(up.addr, "d", "", &format!("max_header_size = \"8KiB\"\n{extra_server}"));
    let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = http1;
    Gw { gw: TestGateway::start(config).await, seen, cancelled }
}

/// The decision a gateway made on a byte stream.
#[derive(Debug, PartialEq)]
struct Decision {
    statuses: Vec<String>,
    closed: bool,
    upstream: Vec<String>,
}

async fn decide(gw: &Gw, bytes: &[u8], wait: Duration) -> Decision {
    gw.seen.lock().unwrap().clear();
    let mut s = TcpStream::connect(gw.gw.addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let raw = common::read_for(&mut s, wait).await;
    let statuses =
        raw.text.split("HTTP/1.").skip(1).map(|rest| rest.get(..14).unwrap_or(rest).replace("\r\n", "|")).collect();
    let upstream = std::mem::take(&mut *gw.seen.lock().unwrap());
    Decision { statuses, closed: raw.closed, upstream }
}

fn streams() -> Vec<Vec<u8>> {
    let s = |t: &str| t.as_bytes().to_vec();
    vec![
        s("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nGET /d/after HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET example.com:80 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET http://other/d/abs HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/nohost HTTP/1.1\r\n\r\n"),
        s("GET /d/twohost HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"),
        s("GET /d/under HTTP/1.1\r\nHost: x\r\nX_Y: 1\r\n\r\n"),
        format!(
            "POST /d/ext HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;{}\r\nhello\r\n0\r\n\r\n",
            "e".repeat(20000)
        )
        .into_bytes(),
        format!(
            "POST /d/zeros HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{}5\r\nhello\r\n0\r\n\r\n",
            "0".repeat(5000)
        )
        .into_bytes(),
        s(
            "POST /d/tfold HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx: a\r\n b\r\n\r\n",
        ),
        s("GET /d/cr HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n"),
        s("GET /d/lfline HTTP/1.1\nHost: x\r\n\r\n"),
        s("GET  /d/twospace HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/lowver http/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/tab HTTP/1.1\r\nHost: x\r\nX\t: a\r\n\r\n"),
        s("GET /d/ws HTTP/1.1\r\nHost: x\r\nX:   spaced   \r\n\r\n"),
        s("GET /d/g1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /d/g2 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s(
            "GET /d/k1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /d/k2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /d/k3 HTTP/1.0\r\n\r\nGET /d/k4 HTTP/1.0\r\n\r\n",
        ),
        s(
            "GET /d/c1 HTTP/1.1\r\nHost: x\r\n\r\nGET /d/c2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /d/c3 HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        s("POST /d/e0 HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n"),
        s("POST /d/e10 HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"),
        s("POST /d/enobody HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"),
        s("POST /d/eother HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\nhi"),
        s("GET /d/up HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n\x01\x05hello"),
        s("HEAD /d/h1 HTTP/1.1\r\nHost: x\r\n\r\nGET /d/h2 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("HEAD /d/big HTTP/1.1\r\nHost: x\r\n\r\n"),
        s(
            "POST /d/tr HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nx-a: 1\r\nx-b: 2\r\n\r\nGET /d/after HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        format!("GET /d/{} HTTP/1.1\r\nHost: x\r\n\r\n", "u".repeat(9000)).into_bytes(),
        format!(
            "GET /d/manysmall HTTP/1.1\r\nHost: x\r\n{}\r\n",
            (0..99).map(|i| format!("a{i}:\r\n")).collect::<String>()
        )
        .into_bytes(),
        s("GET /d/nul\0 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/a HTTP/1.1\r\nHost: x\r\n\r\n\r\n\r\nGET /d/b HTTP/1.1\r\nHost: x\r\n\r\n"),
        s(
            "POST /d/te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        ),
        s("POST /d/tecase HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
        s("POST /d/tesp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  chunked \r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
        s("POST /d/clsp HTTP/1.1\r\nHost: x\r\nContent-Length:  2 \r\n\r\nhi"),
        s("POST /d/cl0 HTTP/1.1\r\nHost: x\r\nContent-Length: 002\r\n\r\nhi"),
        s("GET /d/vt HTTP/1.1\r\nHost: x\r\nX: a\x0bb\r\n\r\n"),
        s("GET /d/del HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n"),
        s("GET /d/utf HTTP/1.1\r\nHost: x\r\nX: caf\u{e9}\r\n\r\n"),
        s("GET /d/pct%00 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/frag#x HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET d/rel HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("POST /d/negchunk HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nhi\r\n0\r\n\r\n"),
        s("POST /d/chunkws HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\nhi\r\n0\r\n\r\n"),
        s("POST /d/chunkmissingcrlf HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiXX0\r\n\r\n"),
        format!(
            "POST /d/ext10k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;{}\r\nhello\r\n0\r\n\r\n",
            "e".repeat(3000)
        )
        .into_bytes(),
        format!(
            "POST /d/ext3x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n",
            format!("1;{}\r\nh\r\n", "e".repeat(3000)).repeat(7)
        )
        .into_bytes(),
        format!(
            "POST /d/tr10k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx: {}\r\n\r\n",
            "t".repeat(10000)
        )
        .into_bytes(),
        format!(
            "POST /d/tr20k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx: {}\r\n\r\n",
            "t".repeat(20000)
        )
        .into_bytes(),
        format!(
            "POST /d/trmany HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n{}\r\n",
            (0..150).map(|i| format!("t{i}: v\r\n")).collect::<String>()
        )
        .into_bytes(),
        s("POST /d/trbad HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx y: 1\r\n\r\n"),
        s("GET /d/sp HTTP/1.1 \r\nHost: x\r\n\r\n"),
        s("GET /d/9 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n"),
        s(
            "POST /d/clte10 HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nhiGET /d/next HTTP/1.0\r\nHost: x\r\n\r\n",
        ),
        s("POST /d/chunk0x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nhi\r\n0\r\n\r\n"),
    ]
}

/// Not a check: prints where the two connections differ.
#[tokio::test]
#[ignore]
async fn explore() {
    let (h, o) = tokio::join!(gateway(Http1Server::Hyper, ""), gateway(Http1Server::Gateway, ""));
    for bytes in streams() {
        let w = Duration::from_millis(400);
        let (a, b) = tokio::join!(decide(&h, &bytes, w), decide(&o, &bytes, w));
        let name = String::from_utf8_lossy(&bytes[..bytes.len().min(60)]).into_owned();
        if a != b {
            println!("DIFF {name:?}\n  hyper: {a:?}\n  own:   {b:?}");
        } else {
            println!("same {name:?}: {a:?}");
        }
    }
}

/// Runs `probe` against a gateway of each kind; prints both outcomes.
macro_rules! both {
    ($extra:expr, $probe:expr) => {{
        let h = gateway(Http1Server::Hyper, $extra).await;
        let a = $probe(&h).await;
        let o = gateway(Http1Server::Gateway, $extra).await;
        let b = $probe(&o).await;
        println!("{}\n  hyper: {a:?}\n  own:   {b:?}", stringify!($probe));
        (a, b)
    }};
}

/// A client that leaves (closes, or half-closes) while its request waits
/// upstream: was the upstream request dropped?
async fn leaves(gw: &Gw, req: &'static str, half: bool) -> (usize, String) {
    let mut s = TcpStream::connect(gw.gw.addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    if half {
        s.shutdown().await.unwrap();
    } else {
        drop(s);
        tokio::time::sleep(Duration::from_millis(700)).await;
        return (gw.cancelled.load(Ordering::SeqCst), String::new());
    }
    let r = common::read_for(&mut s, Duration::from_millis(700)).await;
    (gw.cancelled.load(Ordering::SeqCst), format!("{:?} closed={}", r.text.get(..12), r.closed))
}

#[tokio::test]
#[ignore]
async fn explore_dynamic() {
    let get = "GET /d/slow HTTP/1.1\r\nHost: x\r\n\r\n";
    let post = "POST /d/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";
    let chunked = "POST /d/slow HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";
    let piped = "GET /d/slow HTTP/1.1\r\nHost: x\r\n\r\nGET /d/a HT";
    let half_body = "POST /d/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nhi";
    let exp = "POST /d/slow HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi";
    for req in [get, post, chunked, piped, half_body, exp] {
        for half in [false, true] {
            println!("{req:?} half={half}");
            both!("", |g| leaves(g, req, half));
        }
    }
    // Half a body, then silence (idle timeout short).
    both!("idle_timeout = \"500ms\"\nheader_read_timeout = \"500ms\"", |g: &Gw| {
        let addr = g.gw.addr;
        async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"POST /d/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello").await.unwrap();
            let r = common::read_for(&mut s, Duration::from_secs(3)).await;
            (r.text.get(..12).map(str::to_owned), r.closed)
        }
    });
    // HTTP/1.0 keep-alive pipelined.
    both!("", |g: &Gw| {
        let addr = g.gw.addr;
        async move {
            let r = common::raw(addr, b"GET /d/k1 HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\nGET /d/k2 HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\nGET /d/k3 HTTP/1.0\r\nHost: x\r\n\r\nGET /d/k4 HTTP/1.0\r\nHost: x\r\n\r\n", Duration::from_millis(500)).await;
            (r.text.replace("\r\n", "|"), r.closed)
        }
    });
    // Expect: 100-continue, waiting for the 100 before the body.
    both!("", |g: &Gw| {
        let addr = g.gw.addr;
        async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"PUT /d/e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
                .await
                .unwrap();
            let first = common::read_for(&mut s, Duration::from_millis(500)).await.text;
            s.write_all(b"hiGET /d/next HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
            let rest = common::read_for(&mut s, Duration::from_millis(500)).await;
            (first.replace("\r\n", "|"), rest.text.matches("HTTP/1.1 200").count(), rest.closed)
        }
    });
    // Graceful drain with a request in flight.
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let mut g = gateway(mode, "shutdown_timeout = \"5s\"").await;
        let mut s = TcpStream::connect(g.gw.addr).await.unwrap();
        s.write_all(b"GET /d/slow HTTP/1.1\r\nHost: x\r\n\r\nGET /d/a HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        g.gw.shutdown();
        let r = common::read_for(&mut s, Duration::from_secs(4)).await;
        println!("drain {mode:?}: {:?} closed={}", r.text.replace("\r\n", "|"), r.closed);
    }
    // Pipelining flood, never reading.
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let g = gateway(mode, "send_timeout = \"500ms\"").await;
        let s = TcpStream::connect(g.gw.addr).await.unwrap();
        let one = b"GET /d/big HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
        let started = std::time::Instant::now();
        let mut sent = 0usize;
        let mut s = s;
        let ended = loop {
            match tokio::time::timeout(Duration::from_secs(5), s.write_all(&one)).await {
                Ok(Ok(())) => sent += one.len(),
                Ok(Err(e)) => break format!("error {e}"),
                Err(_) => break "stuck".into(),
            }
            if started.elapsed() > Duration::from_secs(8) {
                break "still taking".into();
            }
        };
        println!(
            "flood {mode:?}: sent {sent} then {ended} after {:?}; upstream saw {}",
            started.elapsed(),
            g.seen.lock().unwrap().len() / 2
        );
    }
}

/// An upstream that answers a head with a 101 and then echoes.
async fn echo_upstream() -> std::net::SocketAddr {
    common::raw_upstream(|mut s: TcpStream| async move {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut b).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(b[0]);
        }
        let _ = s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n").await;
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    })
    .await
}

#[tokio::test]
#[ignore]
async fn explore_more() {
    // Upgrade with bytes right behind the head.
    let up = echo_upstream().await;
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let mut config = common::config(&proxy_toml(up, "ws", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
        config.server.http1 = mode;
        let gw = TestGateway::start(config).await;
        let r = common::raw(
            gw.addr,
            b"GET /ws/t HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\nEARLY BYTES",
            Duration::from_millis(500),
        )
        .await;
        println!("upgrade {mode:?}: {:?} closed={}", r.text.replace("\r\n", "|"), r.closed);
        let mut config = common::config(
            &format!("[metrics]\nlisten = \"127.0.0.1:0\"\n{}", proxy_toml(up, "ws", "", "")),
            Path::new(env!("CARGO_MANIFEST_DIR")),
        );
        config.server.http1 = mode;
        let gw = TestGateway::start(config).await;
        let admin = gw.admin.unwrap();
        let r = common::raw(admin, b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\nGET /healthz HTTP/1.1\r\nHost: h\r\n\r\nGET /metrics HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", Duration::from_millis(500)).await;
        println!(
            "admin {mode:?}: {} responses {:?} closed={}",
            r.text.matches("HTTP/1.1 ").count(),
            r.text.get(..40),
            r.closed
        );
        let r =
            common::raw(admin, b"GET /healthz HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", Duration::from_millis(500))
                .await;
        println!("admin fold {mode:?}: {:?} closed={}", r.text.get(..20), r.closed);
    }
    // Slowloris: a head a byte at a time, every 100 ms, header timeout 500 ms.
    both!("header_read_timeout = \"500ms\"\nidle_timeout = \"2s\"", |g: &Gw| {
        let addr = g.gw.addr;
        async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let started = std::time::Instant::now();
            s.write_all(b"GET /d/a HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
            let _ = common::read_for(&mut s, Duration::from_millis(200)).await;
            let mut cut = None;
            for b in b"GET /d/b HTTP/1.1\r\nHost: x\r\nX: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n" {
                if s.write_all(&[*b]).await.is_err() {
                    cut = Some(started.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let r = common::read_for(&mut s, Duration::from_millis(500)).await;
            (cut.map(|d| d.as_millis() / 100), r.text.get(..12).map(str::to_owned), r.closed)
        }
    });
    // After a body request: the next head trickled.
    both!("header_read_timeout = \"500ms\"\nidle_timeout = \"2s\"", |g: &Gw| {
        let addr = g.gw.addr;
        async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let started = std::time::Instant::now();
            s.write_all(b"POST /d/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiG").await.unwrap();
            let mut cut = None;
            for b in b"ET /d/b HTTP/1.1\r\nHost: x\r\nX: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n" {
                if s.write_all(&[*b]).await.is_err() {
                    cut = Some(started.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let r = common::read_for(&mut s, Duration::from_millis(500)).await;
            (cut.map(|d| d.as_millis() / 100), r.text.matches("HTTP/1.1 200").count(), r.closed)
        }
    });
    // Pipelining flood of small requests, never reading.
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let g = gateway(mode, "send_timeout = \"500ms\"").await;
        let mut s = TcpStream::connect(g.gw.addr).await.unwrap();
        let one = b"GET /d/a HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
        let started = std::time::Instant::now();
        let mut sent = 0usize;
        let ended = loop {
            match tokio::time::timeout(Duration::from_secs(5), s.write_all(&one)).await {
                Ok(Ok(())) => sent += one.len(),
                Ok(Err(e)) => break format!("error {e}"),
                Err(_) => break "stuck".into(),
            }
            if started.elapsed() > Duration::from_secs(10) {
                break "still taking".into();
            }
        };
        println!(
            "small flood {mode:?}: sent {sent} then {ended} after {:?}; upstream saw {}",
            started.elapsed(),
            g.seen.lock().unwrap().len() / 2
        );
    }
}

#[tokio::test]
#[ignore]
async fn explore_responses() {
    use common::scripted::{answer, scripted, then};
    let (up, _) = scripted(|_, _, head| {
        let path = head.split(' ').nth(1).unwrap_or("");
        match path {
            "/r/chunked" => answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
            "/r/trailers" => answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n2\r\nhi\r\n0\r\nx-sum: 9\r\n\r\n"),
            "/r/304" => answer(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\nETag: \"a\"\r\n\r\n"),
            "/r/204" => answer(b"HTTP/1.1 204 No Content\r\n\r\n"),
            "/r/short" => then(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello"), 100, b""),
            "/r/close" => Answer { pieces: vec![(Duration::ZERO, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close".to_vec())], close: true },
            "/r/slowchunks" => then(then(answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n"), 200, b"3\r\nyou\r\n"), 200, b"0\r\n\r\n"),
            _ => answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        }
    })
    .await;
    use common::scripted::Answer;
    let reqs: &[&str] = &[
        "HEAD /r/chunked HTTP/1.1\r\nHost: h\r\n\r\nGET /r/x HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET /r/chunked HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\nGET /r/x HTTP/1.0\r\nHost: h\r\n\r\n",
        "GET /r/trailers HTTP/1.1\r\nHost: h\r\nTE: trailers\r\n\r\n",
        "GET /r/trailers HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET /r/304 HTTP/1.1\r\nHost: h\r\n\r\nGET /r/x HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET /r/204 HTTP/1.1\r\nHost: h\r\n\r\nGET /r/x HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET /r/short HTTP/1.1\r\nHost: h\r\n\r\nGET /r/x HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET /r/close HTTP/1.1\r\nHost: h\r\n\r\nGET /r/x HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET /r/close HTTP/1.0\r\nHost: h\r\n\r\n",
        "GET /r/slowchunks HTTP/1.1\r\nHost: h\r\n\r\nGET /r/x HTTP/1.1\r\nHost: h\r\n\r\n",
        "HEAD /r/slowchunks HTTP/1.1\r\nHost: h\r\n\r\nGET /r/x HTTP/1.1\r\nHost: h\r\n\r\n",
    ];
    let mut got = Vec::new();
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let toml = format!(
            "[upstreams.r]\nurl = \"http://{up}\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"r\"\n"
        );
        let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
        config.server.http1 = mode;
        let gw = TestGateway::start(config).await;
        let mut outs = Vec::new();
        for r in reqs {
            let raw = common::raw(gw.addr, r.as_bytes(), Duration::from_millis(800)).await;
            let text: Vec<String> = raw
                .text
                .split("\r\n")
                .filter(|l| !l.starts_with("date:") && !l.starts_with("x-request-id:") && !l.starts_with("via:"))
                .map(str::to_owned)
                .collect();
            outs.push(format!("{} closed={}", text.join("|"), raw.closed));
        }
        got.push(outs);
    }
    for (i, r) in reqs.iter().enumerate() {
        let tag = if got[0][i] == got[1][i] { "same" } else { "DIFF" };
        println!("{tag} {r:?}\n  hyper: {}\n  own:   {}", got[0][i], got[1][i]);
    }
}

/// A gateway of the given kind with one route, `/r`, to `up`.
async fn routed(up: std::net::SocketAddr, mode: Http1Server, extra_server: &str) -> TestGateway {
    let toml = format!(
        "[server]\n{extra_server}\n[upstreams.r]\nurl = \"http://{up}\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"r\"\n"
    );
    let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = mode;
    TestGateway::start(config).await
}

/// hyper's connection writes a response's trailer fields only to a client
/// that sent `TE: trailers`; so does ours.
#[tokio::test]
async fn trailer_fields_reach_only_a_client_that_asked_for_them() {
    let (up, _) = common::scripted::scripted(|_, _, _| {
        common::scripted::answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n2\r\nhi\r\n0\r\nx-sum: 9\r\n\r\n",
        )
    })
    .await;
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let gw = routed(up, mode, "").await;
        let asked = [
            ("", false),
            ("TE: trailers\r\n", true),
            ("TE: deflate\r\nTE: x, Trailers\r\n", true),
            ("TE: deflate\r\n", false),
        ];
        for (te, want) in asked {
            let req = format!("GET /r/t HTTP/1.1\r\nHost: h\r\n{te}Connection: close\r\n\r\n");
            let r = common::bounded(common::raw(gw.addr, req.as_bytes(), Duration::from_secs(3))).await;
            assert!(r.text.ends_with("0\r\n\r\n") || r.text.ends_with("x-sum: 9\r\n\r\n"), "{mode:?}: {:?}", r.text);
            assert_eq!(r.text.contains("x-sum: 9"), want, "{mode:?} {te:?}: {:?}", r.text);
        }
    }
}
