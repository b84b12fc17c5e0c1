//! The built-in slow upstream ("service A" of the benchmarks): `GET /a` waits
//! the configured delay and answers `ok`; `GET /hello` answers at once.
//! Tests, benchmarks and the embedded demo use it.

use std::convert::Infallible;
use std::future::Future;
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
            accepted = crate::accept(&listener) => accepted,
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
