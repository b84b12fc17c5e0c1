//! Upstreams and a gateway for the discovery tests: upstreams on loopback
//! addresses that say who they are, a gateway whose upstream is discovered
//! through the tests' DNS server, and waits on its endpoints.
// Shared by discovery.rs, discovery_churn.rs and discovery_edges.rs, which
// use different parts.
#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::common::*;
use super::dns::TestDns;

/// What one test upstream saw.
#[derive(Default)]
pub struct Seen {
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub accepted: AtomicUsize,
    pub closed: AtomicUsize,
}

/// An upstream on `listener` that answers its own address and the `Host`
/// it was sent (`addr host`); `/slow` takes 3 s.
pub fn serve(listener: TcpListener) -> Arc<Seen> {
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let me = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            s.accepted.fetch_add(1, SeqCst);
            let s = s.clone();
            tokio::spawn(async move {
                let conn = s.clone();
                let svc = service_fn(move |req: Request<Incoming>| {
                    let s = s.clone();
                    async move {
                        s.requests.fetch_add(1, SeqCst);
                        s.in_flight.fetch_add(1, SeqCst);
                        if req.uri().path() == "/slow" {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        s.in_flight.fetch_sub(1, SeqCst);
                        let host = req.headers().get("host").and_then(|h| h.to_str().ok()).unwrap_or("").to_owned();
                        Ok::<_, Infallible>(Response::new(full(format!("{me} {host}"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                conn.closed.fetch_add(1, SeqCst);
            });
        }
    });
    seen
}

/// Upstreams on each of `ips`, all on one port (A records carry no port).
pub async fn on_one_port(ips: &[&str]) -> (u16, Vec<Arc<Seen>>) {
    'again: loop {
        let first = TcpListener::bind(format!("{}:0", ips[0])).await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for ip in &ips[1..] {
            match TcpListener::bind(format!("{ip}:{port}")).await {
                Ok(l) => listeners.push(l),
                Err(_) => continue 'again,
            }
        }
        return (port, listeners.into_iter().map(serve).collect());
    }
}

/// A gateway whose upstream `name` is discovered with `discover` (the
/// inside of `discover = { ... }`) through `dns`, on route `/`.
pub async fn gateway(dns: &TestDns, name: &str, discover: &str, extra: &str) -> TestGateway {
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\
         [resolver]\nnameservers = [\"{}\"]\ntimeout = \"500ms\"\nattempts = 1\n\
         [upstreams.{name}]\ndiscover = {{ {discover} }}\n{extra}\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/\"\nupstream = \"{name}\"\nhost = \"upstream\"\ntimeout = \"10s\"\n",
        dns.addr
    );
    TestGateway::from_toml(&toml).await
}

/// The endpoints (`endpoint` labels) the upstream has now.
pub fn endpoints(gw: &TestGateway, name: &str) -> Vec<String> {
    let up = gw.app.upstreams().into_iter().find(|u| u.config.name == name).expect("the upstream is there");
    up.endpoints().iter().map(|e| e.config.url.clone()).collect()
}

/// Waits (5 s at most) until the upstream has `n` endpoints.
pub async fn wait_for_endpoints(gw: &TestGateway, name: &str, n: usize) -> Vec<String> {
    wait_for_count(gw, name, n, Duration::from_secs(5)).await
}

/// Waits (`within` at most) until the upstream has `n` endpoints.
pub async fn wait_for_count(gw: &TestGateway, name: &str, n: usize, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let now = endpoints(gw, name);
        if now.len() == n {
            return now;
        }
        assert!(Instant::now() < deadline, "{name}: still {now:?}, not {n} endpoints");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn status_and_body(url: String) -> (u16, String) {
    let (parts, body) = get(&url).await;
    (parts.status.as_u16(), String::from_utf8_lossy(&body).into_owned())
}

pub fn counts(seen: &[Arc<Seen>]) -> Vec<usize> {
    seen.iter().map(|s| s.requests.load(SeqCst)).collect()
}
