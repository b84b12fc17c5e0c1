//! Helpers of the cache tests: a gateway whose route `/c` caches, in front
//! of an upstream written in the test that counts the requests it sees.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{TestBody, TestGateway, TestUpstream, full, proxy_toml, send};

/// A gateway whose route `/c` caches with `cache` in front of `handler`,
/// and the count of requests the upstream saw.
pub async fn cached<F, Fut>(cache: &str, handler: F) -> (TestGateway, Arc<AtomicUsize>)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<TestBody>> + Send + 'static,
{
    cached_as("c", cache, handler).await
}

/// As [`cached`], the route (and its prefix) named `name`: a test that reads
/// the route's metrics needs a name no other test in its binary uses (the
/// metrics are the process's).
pub async fn cached_as<F, Fut>(name: &str, cache: &str, handler: F) -> (TestGateway, Arc<AtomicUsize>)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<TestBody>> + Send + 'static,
{
    counted(handler, |up| proxy_toml(up, name, &format!("cache = {{ {cache} }}"), "")).await
}

/// As [`cached`] with `cache = {}`, and `server` added to `[server]`.
pub async fn cached_with_server<F, Fut>(server: &str, handler: F) -> (TestGateway, Arc<AtomicUsize>)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<TestBody>> + Send + 'static,
{
    counted(handler, |up| proxy_toml(up, "c", "cache = {}", server)).await
}

/// A gateway configured by `toml` for the upstream `handler` answers from,
/// and the count of requests the upstream saw.
async fn counted<F, Fut>(handler: F, toml: impl FnOnce(SocketAddr) -> String) -> (TestGateway, Arc<AtomicUsize>)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<TestBody>> + Send + 'static,
{
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let up = TestUpstream::start(move |req| {
        s.fetch_add(1, Ordering::SeqCst);
        handler(req)
    })
    .await;
    (TestGateway::from_toml(&toml(up.addr)).await, seen)
}

pub fn answer(status: u16, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Response<TestBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    for (n, v) in headers {
        r.headers_mut().append(http::HeaderName::from_bytes(n.as_bytes()).unwrap(), v.parse().unwrap());
    }
    r
}

/// An upstream answering every request the same.
pub fn fixed(
    status: u16,
    headers: &'static [(&'static str, &'static str)],
) -> impl Fn(Request<Incoming>) -> std::future::Ready<Response<TestBody>> + Clone + Send + Sync + 'static {
    move |_| std::future::ready(answer(status, headers, "body"))
}

pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> (http::response::Parts, Bytes) {
    let mut req = Request::get(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    send(req.body(full(Bytes::new())).unwrap()).await
}

pub fn cache_status(parts: &http::response::Parts) -> &str {
    parts.headers.get("cache-status").map_or("", |v| v.to_str().unwrap())
}

pub fn seen(n: &AtomicUsize) -> usize {
    n.load(Ordering::SeqCst)
}

/// An upstream that waits `delay` and answers `headers`, its body the
/// number of the request.
pub fn slow(
    delay: Duration,
    headers: &'static [(&'static str, &'static str)],
) -> impl Fn(Request<Incoming>) -> std::pin::Pin<Box<dyn Future<Output = Response<TestBody>> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    let n = Arc::new(AtomicUsize::new(0));
    move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            answer(200, headers, format!("answer {i}"))
        })
    }
}
