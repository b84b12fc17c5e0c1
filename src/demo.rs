//! The built-in demo: the slow upstream ("service A" of the benchmarks:
//! `GET /a` waits the configured delay and answers `ok`; `GET /hello`
//! answers at once), which tests, benchmarks and the embedded default use,
//! and the embedded default's files, carried in the binary so that it runs
//! from any directory on any machine.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
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

async fn answer(req: Request<Incoming>, delay: Duration) -> Response<Full<Bytes>> {
    let (status, body) = match req.uri().path() {
        "/a" => {
            tokio::time::sleep(delay).await;
            (StatusCode::OK, "ok")
        }
        "/hello" => (StatusCode::OK, "hello"),
        _ => (StatusCode::NOT_FOUND, "not found\n"),
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("valid response")
}

/// Serves the slow upstream on `listener` until `shutdown` resolves.
pub async fn serve(listener: TcpListener, delay: Duration, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = crate::net::accept(&listener) => accepted,
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = service_fn(move |req| async move { Ok::<_, Infallible>(answer(req, delay).await) });
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service).into_owned());
        tokio::spawn(conn);
    }
    drop(listener);
    let _ = tokio::time::timeout(delay + Duration::from_secs(1), graceful.shutdown()).await;
}
