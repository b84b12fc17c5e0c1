//! SRV records' weights (RFC 2782) become the endpoints' weights, against
//! the tests' DNS server (`discovery/dns.rs`): requests spread in their
//! proportion, a record of weight 0 among heavier ones gets almost none,
//! even beside records scaled down to the bound, and a change of weight in
//! the DNS applies without the set churning.

mod common;
#[path = "discovery/dns.rs"]
mod dns;
#[path = "discovery/upstreams.rs"]
mod upstreams;

use std::time::Duration;

use common::*;
use dns::TestDns;
use tokio::time::Instant;
use upstreams::*;

/// Each endpoint's address and weight, now.
fn weights(gw: &TestGateway, name: &str) -> Vec<(String, u32)> {
    let up = gw.app.upstreams().into_iter().find(|u| u.config.name == name).expect("the upstream is there");
    up.endpoints().iter().map(|e| (e.config.url.clone(), e.config.weight)).collect()
}

/// Waits (5 s at most) until the endpoints weigh `want`, in address order.
async fn wait_for_weights(gw: &TestGateway, name: &str, want: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now: Vec<u32> = weights(gw, name).into_iter().map(|(_, w)| w).collect();
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name}: weights {now:?}, not {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn srv_weights_share_requests_and_follow_the_dns() {
    let dns = TestDns::start().await;
    let (port, ups) = on_one_port(&["127.0.0.1", "127.0.0.2", "127.0.0.3"]).await;
    let records = |a: u16, b: u16| [(10, a, port, "a.w.test."), (10, b, port, "b.w.test."), (10, 0, port, "c.w.test.")];
    dns.srv("_http._tcp.w.test", &records(3, 1), 1);
    for (target, ip) in [("a.w.test", "127.0.0.1"), ("b.w.test", "127.0.0.2"), ("c.w.test", "127.0.0.3")] {
        dns.addresses(target, &[ip], 60);
    }
    let discover = "srv = \"_http._tcp.w.test\", interval = \"200ms\", min_ttl = \"100ms\"";
    let gw = gateway(&dns, "w", discover, "balance = \"round_robin\"").await;
    wait_for_endpoints(&gw, "w", 3).await;
    // 3 : 1 in the smallest numbers, the record of weight 0 a hundredth of
    // the lightest.
    wait_for_weights(&gw, "w", &[300, 100, 1]).await;
    for _ in 0..401 {
        assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    }
    let got = counts(&ups);
    assert!((290..=310).contains(&got[0]) && (90..=110).contains(&got[1]) && got[2] <= 2, "3 : 1 : almost 0: {got:?}");

    // The DNS reweighs: the same endpoints, their new weights.
    let before = weights(&gw, "w");
    dns.srv("_http._tcp.w.test", &records(1, 1), 1);
    wait_for_weights(&gw, "w", &[100, 100, 1]).await;
    let after = weights(&gw, "w");
    assert_eq!(
        before.iter().map(|(a, _)| a).collect::<Vec<_>>(),
        after.iter().map(|(a, _)| a).collect::<Vec<_>>(),
        "one entry an address"
    );
    let before = counts(&ups);
    for _ in 0..402 {
        assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    }
    let got: Vec<usize> = counts(&ups).iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!((190..=210).contains(&got[0]) && (190..=210).contains(&got[1]) && got[2] <= 4, "1 : 1 : almost 0: {got:?}");
}

#[tokio::test]
async fn a_record_of_weight_0_stays_a_hundredth_of_the_lightest_beside_one_scaled_down() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1", "127.0.0.2", "127.0.0.3"]).await;
    let records = [(10, 65535, port, "a.x.test."), (10, 1, port, "b.x.test."), (10, 0, port, "c.x.test.")];
    dns.srv("_http._tcp.x.test", &records, 60);
    for (target, ip) in [("a.x.test", "127.0.0.1"), ("b.x.test", "127.0.0.2"), ("c.x.test", "127.0.0.3")] {
        dns.addresses(target, &[ip], 60);
    }
    let gw = gateway(&dns, "x", "srv = \"_http._tcp.x.test\"", "").await;
    wait_for_endpoints(&gw, "x", 3).await;
    // 65535 : 1 does not fit under 10,000 beside a record of 0 weighing
    // 1: the record of 1 stays at 100, not 1 like the record of 0.
    wait_for_weights(&gw, "x", &[10_000, 100, 1]).await;
}
