//! Discovered upstreams whose answers churn, against the tests' DNS server
//! (`discovery/dns.rs`): endpoints that stay keep their state across a
//! change of the set, and an address one answer leaves out stays for its
//! TTL rather than leaving and coming back as a new endpoint.

mod common;
#[path = "discovery/dns.rs"]
mod dns;
#[path = "discovery/upstreams.rs"]
mod upstreams;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dns::TestDns;
use gateway::upstream::endpoint::Endpoint;
use tokio::time::Instant;
use upstreams::*;

/// The upstream's endpoint at `url` now.
fn endpoint(gw: &TestGateway, name: &str, url: &str) -> Option<Arc<Endpoint>> {
    let up = gw.app.upstreams().into_iter().find(|u| u.config.name == name)?;
    up.endpoints().iter().find(|e| e.config.url == url).cloned()
}

/// An endpoint whose address stays in the answer is the same endpoint
/// after the set changed around it: its pool, health and ejection go on.
#[tokio::test]
async fn endpoints_that_stay_keep_their_state_when_the_set_changes() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1", "127.0.0.2", "127.0.0.3"]).await;
    dns.addresses("stay.test", &["127.0.0.1", "127.0.0.2"], 1);
    let discover = format!("dns = \"stay.test:{port}\", interval = \"300ms\", min_ttl = \"100ms\"");
    let gw = gateway(&dns, "stay", &discover, "").await;
    wait_for_endpoints(&gw, "stay", 2).await;
    let first = endpoint(&gw, "stay", &format!("127.0.0.1:{port}")).unwrap();
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    dns.addresses("stay.test", &["127.0.0.1", "127.0.0.2", "127.0.0.3"], 1);
    wait_for_endpoints(&gw, "stay", 3).await;
    let after = endpoint(&gw, "stay", &format!("127.0.0.1:{port}")).unwrap();
    assert!(Arc::ptr_eq(&first, &after), "the endpoint that stayed was built anew");
}

/// A server that leaves an address out of one answer (a rotating or
/// truncated subset) does not take it out of the set: it stays for its
/// TTL, the same endpoint; left out for longer, it goes.
#[tokio::test]
async fn an_address_left_out_of_one_answer_stays_for_its_ttl() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1", "127.0.0.2"]).await;
    let both = ["127.0.0.1", "127.0.0.2"];
    dns.addresses("churn.test", &both, 2);
    let discover = format!("dns = \"churn.test:{port}\", interval = \"300ms\", min_ttl = \"100ms\"");
    let gw = gateway(&dns, "churn", &discover, "").await;
    wait_for_endpoints(&gw, "churn", 2).await;
    let second = format!("127.0.0.2:{port}");
    let held = endpoint(&gw, "churn", &second).unwrap();

    // Left out of an answer or two (asked every 300 ms), then back.
    let asked = dns.queries("churn.test", hickory_proto::rr::RecordType::A);
    dns.addresses("churn.test", &["127.0.0.1"], 2);
    let mut fewest = 2;
    let deadline = Instant::now() + Duration::from_secs(3);
    while dns.queries("churn.test", hickory_proto::rr::RecordType::A) < asked + 2 {
        assert!(Instant::now() < deadline, "the name was not asked again");
        fewest = fewest.min(endpoints(&gw, "churn").len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    dns.addresses("churn.test", &both, 2);
    for _ in 0..30 {
        fewest = fewest.min(endpoints(&gw, "churn").len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fewest, 2, "the address left out of an answer left the set");
    let now = endpoint(&gw, "churn", &second).unwrap();
    assert!(Arc::ptr_eq(&held, &now), "the address came back as a new endpoint");

    // Left out for good: gone once its TTL has passed.
    dns.addresses("churn.test", &["127.0.0.1"], 2);
    wait_for_endpoints(&gw, "churn", 1).await;
}
