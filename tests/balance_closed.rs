//! Round robin with an endpoint closed (failing its health checks), end to
//! end: the closed endpoint's share is spread over the open ones by their
//! weights, not handed to the next endpoint in the list.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use http::{Request, Response};

/// An upstream that answers its health checks and counts the other
/// requests it serves.
async fn checked_upstream() -> (TestUpstream, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let s = served.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let s = s.clone();
        async move {
            if req.uri().path() != "/health" {
                s.fetch_add(1, Ordering::SeqCst);
            }
            Response::new(full("served"))
        }
    })
    .await;
    (up, served)
}

/// `requests` requests through a round-robin upstream whose endpoints weigh
/// `weights`, the first of them refusing connections (so failing its health
/// checks); what each of the others served.
async fn served_with_the_first_closed(weights: &[u32], requests: usize) -> Vec<usize> {
    let mut urls = vec![format!("http://{}", refused_addr().await)];
    let mut ups = Vec::new();
    for _ in 1..weights.len() {
        let (up, served) = checked_upstream().await;
        urls.push(format!("http://{}", up.addr));
        ups.push((up, served));
    }
    let list: Vec<String> =
        urls.iter().zip(weights).map(|(u, w)| format!("{{ url = \"{u}\", weight = {w} }}")).collect();
    let toml = format!(
        "[upstreams.rr]\nendpoints = [{}]\nbalance = \"round_robin\"\n\
         [upstreams.rr.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"1s\"\n\
         unhealthy_after = 1\nhealthy_after = 1\n\
         [[routes]]\nname = \"rr\"\nprefix = \"/rr\"\nupstream = \"rr\"\n",
        list.join(", ")
    );
    let gw = TestGateway::from_toml(&toml).await;
    let up = gw.app.upstreams().into_iter().find(|u| u.config.name == "rr").expect("the upstream is there");
    let deadline = Instant::now() + Duration::from_secs(5);
    while up.endpoints()[0].is_healthy() {
        assert!(Instant::now() < deadline, "the refusing endpoint not unhealthy within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..requests {
        assert_eq!(get(&gw.url("/rr")).await.0.status, 200);
    }
    ups.iter().map(|(_, served)| served.load(Ordering::SeqCst)).collect()
}

#[tokio::test]
async fn round_robin_spreads_a_closed_endpoints_share_by_weight() {
    // Equal weights: the two open endpoints take half each (150 / 150, not
    // 200 / 100 with the closed one's turns all going to its neighbour).
    let got = served_with_the_first_closed(&[1, 1, 1], 300).await;
    assert!(got.iter().all(|n| (145..=155).contains(n)), "even: {got:?}");
    // The closed endpoint weighs 100: the one of weight 1 next to it keeps
    // its 1 in 101 (3 of 303), not half.
    let got = served_with_the_first_closed(&[100, 1, 100], 303).await;
    assert!(got[0] <= 6 && got[1] >= 297, "1 : 100: {got:?}");
}
