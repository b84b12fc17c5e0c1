//! Test helpers: a gateway on port 0 in-process, upstreams written in the
//! test, and a small client.
#![allow(dead_code)]

pub mod cached;
pub mod counting;
pub mod limits;
pub mod parked;
pub mod pki;
pub mod process;
pub mod raw;
#[allow(unused_imports)] // Each test binary uses some.
pub use raw::{Raw, closed_within, one_response, raw, read_for, read_responses};
pub mod redis_server;
pub mod scripted;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gateway::config::{self, Config, Source};
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub type TestBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

pub fn full(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

/// Loads `toml` as a config whose relative paths resolve against `base_dir`,
/// listening on port 0.
pub fn config(toml: &str, base_dir: &Path) -> Config {
    let mut c = config::load(&Source::Inline { text: toml.to_owned(), base_dir: base_dir.to_path_buf() })
        .unwrap_or_else(|e| panic!("test config is invalid: {e}"));
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    c
}

/// A gateway running in this process.
pub struct TestGateway {
    pub addr: SocketAddr,
    /// The admin listener's address, when the config has one.
    pub admin: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<()>,
    /// The application, to reload it.
    pub app: Arc<gateway::server::App>,
}

impl TestGateway {
    pub async fn start(config: Config) -> TestGateway {
        // RUST_LOG=gateway=debug shows the gateway's log in failing tests.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let g = gateway::Gateway::bind(config).await.expect("bind gateway");
        let (addr, admin, app) = (g.local_addr(), g.admin_addr(), g.app());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(g.serve(async move {
            let _ = stopped.await;
        }));
        TestGateway { addr, admin, stop: Some(stop), task, app }
    }

    pub async fn from_toml(toml: &str) -> TestGateway {
        Self::start(config(toml, Path::new(env!("CARGO_MANIFEST_DIR")))).await
    }

    /// Writes `toml` as the config file `gateway.toml` in `dir` and starts
    /// a gateway from it (on a free port), for tests that reload it.
    pub async fn from_file(dir: &Path, toml: &str) -> TestGateway {
        let path = dir.join("gateway.toml");
        std::fs::write(&path, toml).unwrap();
        let mut c = config::load(&Source::File(path)).unwrap_or_else(|e| panic!("{e}"));
        c.server.listen = "127.0.0.1:0".parse().unwrap();
        Self::start(c).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Begins a graceful shutdown.
    pub fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// An upstream written in the test: serves `handler` and counts the TCP
/// connections it accepts.
pub struct TestUpstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
}

impl TestUpstream {
    pub async fn start<F, Fut>(handler: F) -> TestUpstream
    where
        F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Response<TestBody>> + Send + 'static,
    {
        // A deep backlog, as a real server has: std's 128 drops SYNs when a
        // test opens hundreds of connections at once.
        let listener = gateway::net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let handler = handler.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let handler = handler.clone();
                        async move { Ok::<_, Infallible>(handler(req).await) }
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        TestUpstream { addr, connections }
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// An HTTP/2 (prior knowledge) connection to `addr`, with the task driving it.
pub async fn h2_client(
    addr: SocketAddr,
) -> (hyper::client::conn::http2::SendRequest<TestBody>, JoinHandle<hyper::Result<()>>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    (sender, tokio::spawn(conn))
}

/// A client without connection pooling surprises: one pooled client per test.
pub fn client() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends a request and collects the whole response.
pub async fn send(req: Request<TestBody>) -> (http::response::Parts, Bytes) {
    let resp = client().request(req).await.expect("request reaches the gateway");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("whole body").to_bytes();
    (parts, bytes)
}

pub async fn get(url: &str) -> (http::response::Parts, Bytes) {
    send(Request::get(url).body(full(Bytes::new())).unwrap()).await
}

/// Fetches `/metrics` from `addr` as text.
pub async fn metrics_text(addr: SocketAddr) -> String {
    let (_, body) = get(&format!("http://{addr}/metrics")).await;
    String::from_utf8(body.to_vec()).unwrap()
}

/// The value of the sample `name{labels}` whose labels include every pair in
/// `labels`, from Prometheus text.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        if n != name {
            return None;
        }
        let all = labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        all.then(|| value.parse().ok()).flatten()
    })
}

/// A free port with nothing listening on it.
pub async fn refused_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], process::free_port()))
}

/// A misbehaving upstream written in the test: runs `peer` on every
/// accepted connection, each in its own task. Returns its address.
pub async fn raw_upstream<F, Fut>(peer: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = gateway::net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(peer(stream));
        }
    });
    addr
}

/// An upstream that answers `ok` and counts the requests it saw.
pub async fn counting_upstream() -> (TestUpstream, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let s = s.clone();
        async move {
            s.fetch_add(1, Ordering::SeqCst);
            let body =
                http_body_util::BodyExt::collect(req.into_body()).await.map(|b| b.to_bytes()).unwrap_or_default();
            Response::new(full(if body.is_empty() { Bytes::from_static(b"ok") } else { body }))
        }
    })
    .await;
    (up, seen)
}

pub fn proxy_toml(up: SocketAddr, name: &str, extra_route: &str, extra_server: &str) -> String {
    format!(
        "[server]\n{extra_server}\n[upstreams.{name}]\nurl = \"http://{up}\"\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nupstream = \"{name}\"\n{extra_route}\n\
         [[routes]]\nname = \"{name}_health\"\nprefix = \"/alive\"\nrespond = {{ status = 200, body = \"alive\" }}\n"
    )
}

pub async fn still_serving(gw: &TestGateway) {
    let (parts, body) = get(&gw.url("/alive")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"alive"[..]), "a healthy route must still answer");
}

pub fn rejected(m: &str, route: &str, reason: &str) -> f64 {
    sample(m, "gateway_rejected_total", &[("route", route), ("reason", reason)]).unwrap_or(0.0)
}

/// A raw HTTP/2 client (the `h2` crate) on `addr`: manual flow control with
/// the given initial stream window, PINGs on demand.
pub async fn raw_h2(addr: SocketAddr, window: u32) -> (h2::client::SendRequest<Bytes>, h2::PingPong) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    // As browsers and gRPC clients do: small frames go at once, not behind
    // the peer's delayed ACK.
    tcp.set_nodelay(true).unwrap();
    let (client, mut connection) =
        h2::client::Builder::new().initial_window_size(window).handshake::<_, Bytes>(tcp).await.unwrap();
    let ping_pong = connection.ping_pong().expect("one ping_pong per connection");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    (client.ready().await.unwrap(), ping_pong)
}

/// An upstream that reads a request and closes without a word; counts the
/// connections it accepts.
pub async fn slamming_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    let addr = raw_upstream(move |mut s| {
        a.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
        }
    })
    .await;
    (addr, accepted)
}

/// `toml` must fail to load (in-process, relative paths from the temp dir)
/// with an error naming `key`.
pub fn assert_refused_at_load(toml: &str, key: &str) {
    let source = Source::Inline { text: toml.to_owned(), base_dir: std::env::temp_dir() };
    let err = config::load(&source).expect_err(toml).to_string();
    assert!(err.contains(key), "{toml}: {err}");
}

/// Runs `gateway check` (the binary `bin`) on each `(toml, key)`: each must
/// exit 64 naming its key.
pub fn assert_refused_by_check(bin: &str, cases: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    for (toml, key) in cases {
        let path = dir.path().join("gw.toml");
        std::fs::write(&path, toml).unwrap();
        let out = std::process::Command::new(bin).args(["check", "--config"]).arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{toml}: {stderr}");
        assert!(stderr.contains(key), "{toml}: {stderr}");
    }
}

/// The status of `GET path` on a gateway process at `addr`, over a blocking
/// socket (for tests that drive the binary); `None` while it does not answer.
pub fn process_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    std::io::Write::write_all(
        &mut s,
        format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).ok()?;
    out.get(9..12)?.parse::<u16>().ok()
}

/// Waits (up to 5 s) for [`process_status`] to say `want`.
pub fn process_status_becomes(addr: &str, path: &str, want: u16) -> bool {
    (0..250).any(|_| {
        process_status(addr, path) == Some(want) || {
            std::thread::sleep(Duration::from_millis(20));
            false
        }
    })
}

/// A configuration with one upstream `name` of several endpoints and one
/// route `/name` to it, with extra keys for each.
pub fn endpoints_toml(name: &str, addrs: &[SocketAddr], extra_upstream: &str, extra_route: &str) -> String {
    let list: Vec<String> = addrs.iter().map(|a| format!("\"http://{a}\"")).collect();
    format!(
        "[upstreams.{name}]\nendpoints = [{}]\n{extra_upstream}\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nupstream = \"{name}\"\n{extra_route}\n",
        list.join(", ")
    )
}

/// Reads from `s` until a request head's end (bytes past it, if any, come
/// with it); `None` if the stream ends or fails first.
pub async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<Vec<u8>> {
    let (mut buf, mut head) = ([0u8; 4096], Vec::new());
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(head)
}

/// The field lines of a raw head (after the request line), as bytes.
pub fn field_lines(head: &[u8]) -> Vec<Vec<u8>> {
    let text = &head[..head.len() - 4];
    text.split(|b| *b == b'\n').skip(1).map(|l| l.strip_suffix(b"\r").unwrap_or(l).to_vec()).collect()
}

/// The request line of a raw head.
pub fn request_line(head: &[u8]) -> String {
    let end = head.iter().position(|b| *b == b'\r').unwrap();
    String::from_utf8_lossy(&head[..end]).into_owned()
}

/// Runs `f`, failing the test if it takes longer than ten seconds.
pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), f).await.expect("test took too long")
}

/// An upstream that answers every request head with `answer` (a 101, say),
/// then echoes what it reads. The head is read a byte at a time, so that
/// nothing after it is taken with it.
pub async fn switching_upstream(answer: &'static [u8]) -> SocketAddr {
    raw_upstream(move |mut s: TcpStream| async move {
        let (mut head, mut b) = (Vec::new(), [0u8; 1]);
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut b).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(b[0]);
        }
        let _ = s.write_all(answer).await;
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    })
    .await
}
