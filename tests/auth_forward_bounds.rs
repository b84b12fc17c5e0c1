//! Forward auth's bounds: a request with two `Authorization` lines is
//! refused before the service is asked (the service would read one copy,
//! the upstream maybe the other), and no more than `max_concurrent` asks
//! are under way at once, however many requests come.

mod auth_common;
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use auth_common::*;
use common::*;
use http::{Request, Response};
use hyper::body::Incoming;

/// What the counting auth service saw.
#[derive(Default)]
struct Asks {
    /// Held now.
    held: AtomicUsize,
    /// The most held at once.
    most: AtomicUsize,
    /// In all.
    all: AtomicUsize,
}

impl Asks {
    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    fn all(&self) -> usize {
        self.all.load(Ordering::SeqCst)
    }
}

/// An auth service that allows everything after `delay`, counting the asks.
async fn counting_service(delay: Duration) -> (TestUpstream, Arc<Asks>) {
    let counts = Arc::new(Asks::default());
    let c = counts.clone();
    let up = TestUpstream::start(move |_req: Request<Incoming>| {
        let c = c.clone();
        async move {
            let now = c.held.fetch_add(1, Ordering::SeqCst) + 1;
            c.most.fetch_max(now, Ordering::SeqCst);
            c.all.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            c.held.fetch_sub(1, Ordering::SeqCst);
            Response::builder().header("x-user", "ann").body(full("")).unwrap()
        }
    })
    .await;
    (up, counts)
}

fn forward(auth: std::net::SocketAddr, extra: &str) -> String {
    format!("auth = {{ forward = {{ url = \"http://{auth}/verify\", response_headers = [\"x-user\"]{extra} }} }}")
}

#[tokio::test]
async fn two_authorization_lines_are_refused_before_the_service_is_asked() {
    let (up, seen) = recording().await;
    let (auth, counts) = counting_service(Duration::ZERO).await;
    let gw = TestGateway::from_toml(&route(up.addr, "fwd", &forward(auth.addr, ""))).await;
    let two = Request::get(gw.url("/fwd/x"))
        .header("authorization", "Bearer good")
        .header("authorization", "Bearer forged")
        .body(full(""))
        .unwrap();
    assert_eq!(send(two).await.0.status, 400);
    assert_eq!((counts.all(), seen.lock().unwrap().len()), (0, 0), "nothing asked or sent");
    let (parts, _) = get_with(&gw.url("/fwd/x"), &[("authorization", "Bearer good")]).await;
    assert_eq!(parts.status, 200);
    assert_eq!(counts.all(), 1);
}

#[tokio::test]
async fn no_more_than_max_concurrent_asks_are_under_way() {
    let (up, _seen) = recording().await;
    let (auth, counts) = counting_service(Duration::from_millis(150)).await;
    let extra = ", max_concurrent = 2, timeout = \"10s\"";
    let gw = TestGateway::from_toml(&route(up.addr, "fwd", &forward(auth.addr, extra))).await;
    let statuses = at_once(&gw, 12).await;
    assert_eq!(statuses, [200; 12], "all allowed, in turns");
    assert_eq!(counts.all(), 12);
    assert_eq!(counts.most(), 2, "the most asks the service held at once");
}

/// The statuses of `n` requests to `/fwd/x` sent at once.
async fn at_once(gw: &TestGateway, n: usize) -> Vec<u16> {
    let url = gw.url("/fwd/x");
    let asks = (0..n).map(|_| get_with(&url, &[]));
    futures_util::future::join_all(asks).await.into_iter().map(|(parts, _)| parts.status.as_u16()).collect()
}

#[test]
fn max_concurrent_is_checked_at_load() {
    let dir = tempfile::tempdir().unwrap();
    for n in ["0", "100001"] {
        let toml = format!(
            "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = {{ status = 200 }}\n\
             auth = {{ forward = {{ url = 'http://127.0.0.1:1/', max_concurrent = {n} }} }}\n"
        );
        let e = gateway::config::load(&gateway::config::Source::Inline { text: toml, base_dir: dir.path().into() })
            .expect_err(n);
        assert!(e.to_string().contains("max_concurrent: between 1 and 100000"), "{n}: {e}");
    }
}

/// Before, a request waited for a turn the whole `timeout` and asked with
/// whatever was left: under a service slower than the requests came, asks
/// started with milliseconds left were cut at once, each passing its turn
/// on while the service still worked on it. A turn is now waited for half
/// the timeout at most, so every ask made has time to be answered.
#[tokio::test]
async fn no_ask_starts_too_late_to_be_answered() {
    let (up, _seen) = recording().await;
    let (auth, counts) = counting_service(Duration::from_millis(300)).await;
    let extra = ", max_concurrent = 1, timeout = \"2s\"";
    let gw = TestGateway::from_toml(&route(up.addr, "fwd", &forward(auth.addr, extra))).await;
    let statuses = at_once(&gw, 8).await;
    let allowed = statuses.iter().filter(|&&s| s == 200).count();
    assert!(statuses.iter().all(|&s| s == 200 || s == 503), "{statuses:?}");
    assert!((1..8).contains(&allowed), "some in turns, the rest refused: {statuses:?}");
    assert_eq!(counts.all(), allowed, "every ask made was answered in time: {statuses:?}");
}
