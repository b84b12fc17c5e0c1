//! What a rate limit's bucket is kept for, end to end: the local buckets
//! at `max_keys` under a flood of distinct keys.

mod common;

use bytes::Bytes;
use common::*;
use http::Request;

/// A GET with `headers`: the status.
async fn status(url: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = Request::get(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    send(req.body(full(Bytes::new())).unwrap()).await.0.status.as_u16()
}

fn respond_route(name: &str, limit: &str) -> String {
    format!("[server]\n[[routes]]\nname = \"{name}\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n{limit}\n")
}

#[tokio::test]
async fn at_max_keys_a_new_key_still_gets_its_own_burst_and_a_busy_one_stays_limited() {
    let limit = "rate_limit = { rate = \"1/m\", burst = 3, key = \"header:X-Key\", max_keys = 50 }";
    let gw = TestGateway::from_toml(&respond_route("rl_full", limit)).await;
    let url = gw.url("/");
    // The flood: many more one-off keys than the store holds.
    for i in 0..400 {
        status(&url, &[("x-key", &format!("flood-{i}"))]).await;
    }
    let mut fresh = Vec::new();
    for _ in 0..4 {
        fresh.push(status(&url, &[("x-key", "fresh")]).await);
    }
    assert_eq!(fresh, [200, 200, 200, 429], "a new key has its own bucket (burst 3), not one shared by the flood");
    let mut busy = Vec::new();
    for _ in 0..12 {
        busy.push(status(&url, &[("x-key", "busy")]).await);
    }
    let allowed = busy.iter().filter(|s| **s == 200).count();
    assert!((3..=5).contains(&allowed) && busy[6..].iter().all(|s| *s == 429), "a key that keeps asking: {busy:?}");
    let m = metrics_text(gw.addr).await;
    let evicted = sample(&m, "gateway_rate_limit_keys_evicted_total", &[("route", "rl_full")]).unwrap_or(0.0);
    assert!(evicted >= 300.0, "the keys let go at max_keys are counted: {evicted}");
}
