//! The built-in demo: the slow upstream ("service A" of the benchmarks:
//! `GET /a` waits the configured delay and answers `ok`, whatever the
//! query; `GET /hello` and `GET /healthz` answer at once; `GET /-/count`
//! answers how many requests for `/a` arrived), which tests, benchmarks and
//! the embedded default use,
//! and the embedded default's files, carried in the binary so that it runs
//! from any directory on any machine.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

/// The files the embedded default's `file` and `dir` routes serve, by
/// their path relative to its base folder.
pub const FILES: [(&str, &[u8]); 2] = [
    ("public/demo.txt", include_bytes!("../config/public/demo.txt")),
    ("public/index.html", include_bytes!("../config/public/index.html")),
];

/// A private folder holding [`FILES`], for the embedded default's relative
/// paths to resolve against; it is removed when dropped. Written at start
/// rather than served from memory, so the demo's routes take the same path
/// through the file server as any other.
pub fn files() -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix("gateway-demo-").tempdir()?;
    write_files(dir.path())?;
    Ok(dir)
}

/// Writes [`FILES`] under `dir`.
pub fn write_files(dir: &Path) -> std::io::Result<()> {
    for (name, bytes) in FILES {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, bytes)?;
    }
    Ok(())
}

/// The key whose address the embedded default's demo upstream listens on.
pub const URL_KEY: &str = "upstreams.service_a.url";

/// How the slow upstream answers.
#[derive(Debug, Clone, Default)]
pub struct Upstream {
    /// How long `GET /a` waits before it answers.
    pub delay: Duration,
    /// A `Cache-Control` value for `/a`'s answers (`gateway upstream
    /// --cache-control`); none when unset.
    pub cache_control: Option<HeaderValue>,
}

async fn answer(req: Request<Incoming>, upstream: &Upstream, count: &AtomicU64) -> Response<Full<Bytes>> {
    let mut cache_control = None;
    // Matched on the path alone: `/a?k=1` is `/a`.
    let (status, body) = match req.uri().path() {
        "/a" => {
            // Counted on arrival: the benchmarks read how many requests
            // reached the upstream (`benches/compare`'s slow-upstream-cached).
            count.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(upstream.delay).await;
            cache_control = upstream.cache_control.clone();
            (StatusCode::OK, Bytes::from_static(b"ok"))
        }
        "/hello" => (StatusCode::OK, Bytes::from_static(b"hello")),
        // For the gateway's health checks (`[upstreams.NAME.health]`), with
        // the path the documentation's examples use.
        "/healthz" => (StatusCode::OK, Bytes::from_static(b"ok\n")),
        "/-/count" => (StatusCode::OK, Bytes::from(format!("{}\n", count.load(Ordering::Relaxed)))),
        _ => (StatusCode::NOT_FOUND, Bytes::from_static(b"not found\n")),
    };
    let mut builder = Response::builder().status(status).header(header::CONTENT_TYPE, "text/plain");
    if let Some(value) = cache_control {
        builder = builder.header(header::CACHE_CONTROL, value);
    }
    builder.body(Full::new(body)).expect("valid response")
}

/// Serves the slow upstream on `listener` until `shutdown` resolves.
pub async fn serve(listener: TcpListener, upstream: Upstream, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let delay = upstream.delay;
    let upstream = Arc::new(upstream);
    let count = Arc::new(AtomicU64::new(0));
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = crate::net::accept(&listener) => accepted,
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (upstream, count) = (upstream.clone(), count.clone());
        let service = service_fn(move |req| {
            let (upstream, count) = (upstream.clone(), count.clone());
            async move { Ok::<_, Infallible>(answer(req, &upstream, &count).await) }
        });
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service).into_owned());
        tokio::spawn(conn);
    }
    drop(listener);
    let _ = tokio::time::timeout(delay + Duration::from_secs(1), graceful.shutdown()).await;
}
