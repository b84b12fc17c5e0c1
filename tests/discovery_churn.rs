//! Discovered upstreams whose answers churn, against the tests' DNS server
//! (`discovery/dns.rs`): endpoints that stay keep their state across a
//! change of the set, and an address one answer leaves out stays for its
//! TTL rather than leaving and coming back as a new endpoint; a part of a
//! lookup that fails (AAAA, one SRV target) keeps its last good addresses
//! without holding back the parts that answered.

mod common;
#[path = "discovery/dns.rs"]
mod dns;
#[path = "discovery/upstreams.rs"]
mod upstreams;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dns::{Reply, TestDns};
use gateway::discovery::Resolution;
use gateway::upstream::endpoint::Endpoint;
use hickory_proto::rr::RecordType;
use tokio::net::TcpListener;
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
    let asked = dns.queries("churn.test", RecordType::A);
    dns.addresses("churn.test", &["127.0.0.1"], 2);
    let mut fewest = 2;
    let deadline = Instant::now() + Duration::from_secs(3);
    while dns.queries("churn.test", RecordType::A) < asked + 2 {
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

/// Upstreams on 127.0.0.1 and [::1], on one port.
async fn dual_stack() -> u16 {
    loop {
        let v4 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = v4.local_addr().unwrap().port();
        if let Ok(v6) = TcpListener::bind(format!("[::1]:{port}")).await {
            serve(v4);
            serve(v6);
            return port;
        }
    }
}

/// AAAA failing while A answers: the IPv6 addresses stay (longer than
/// their TTL), and a change in the A records still applies.
#[tokio::test]
async fn a_failing_aaaa_keeps_its_addresses_and_a_still_applies() {
    let dns = TestDns::start().await;
    let port = dual_stack().await;
    let (_, _more) = on_one_port(&["127.0.0.2"]).await;
    dns.addresses("dual.test", &["127.0.0.1", "::1"], 1);
    let discover = format!("dns = \"dual.test:{port}\", interval = \"300ms\", min_ttl = \"100ms\"");
    let gw = gateway(&dns, "dual", &discover, "").await;
    wait_for_endpoints(&gw, "dual", 2).await;

    dns.set("dual.test", RecordType::AAAA, Reply::ServFail);
    let asked = dns.queries("dual.test", RecordType::AAAA);
    // Several lookups, for longer than the records' TTL of 1 s.
    let deadline = Instant::now() + Duration::from_secs(10);
    while dns.queries("dual.test", RecordType::AAAA) < asked + 20 {
        assert!(Instant::now() < deadline, "the name was not asked again");
        assert!(endpoints(&gw, "dual").contains(&format!("[::1]:{port}")), "a failing AAAA dropped its address");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let up = gw.app.upstreams().into_iter().find(|u| u.config.name == "dual").unwrap();
    assert!(matches!(up.discovery().result, Some(Resolution::Partial { addresses: 2, .. })), "{:?}", up.discovery());
    let m = metrics_text(gw.addr).await;
    let partial = sample(&m, "gateway_discovery_resolutions_total", &[("upstream", "dual"), ("result", "partial")]);
    assert!(partial.unwrap_or(0.0) >= 1.0, "{m}");

    // The part that answers is not held back.
    dns.set(
        "dual.test",
        RecordType::A,
        Reply::Records { data: ["127.0.0.1", "127.0.0.2"].into_iter().map(a_record).collect(), ttl: 1 },
    );
    let now = wait_for_endpoints(&gw, "dual", 3).await;
    assert!(now.contains(&format!("[::1]:{port}")), "{now:?}");
}

fn a_record(ip: &str) -> hickory_proto::rr::RData {
    hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A(ip.parse().unwrap()))
}

/// One SRV target's address lookup failing keeps that target's endpoint,
/// and a target added meanwhile is taken (the set was frozen before).
#[tokio::test]
async fn a_failing_srv_target_keeps_its_endpoint_and_the_others_apply() {
    let dns = TestDns::start().await;
    let bind = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let (a, b, c) = (bind().await, bind().await, bind().await);
    let ports: Vec<u16> = [&a, &b, &c].iter().map(|l| l.local_addr().unwrap().port()).collect();
    [a, b, c].into_iter().for_each(|l| drop(serve(l)));
    let records = |n: usize| -> Vec<(u16, u16, u16, &str)> {
        let targets = ["a.svc.test.", "b.svc.test.", "c.svc.test."];
        (0..n).map(|i| (10, 1, ports[i], targets[i])).collect()
    };
    dns.srv("_http._tcp.svc.test", &records(2), 1);
    for target in ["a.svc.test", "b.svc.test", "c.svc.test"] {
        dns.addresses(target, &["127.0.0.1"], 1);
    }
    let discover = "srv = \"_http._tcp.svc.test\", interval = \"300ms\", min_ttl = \"100ms\"";
    let gw = gateway(&dns, "srv", discover, "").await;
    wait_for_endpoints(&gw, "srv", 2).await;

    dns.all("b.svc.test", Reply::ServFail);
    dns.srv("_http._tcp.svc.test", &records(3), 1);
    let now = wait_for_endpoints(&gw, "srv", 3).await;
    let mut want: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    want.sort_by_key(|u| u.parse::<std::net::SocketAddr>().unwrap());
    assert_eq!(now, want, "the failing target's endpoint and the new one");
    // And b's endpoint outlives its TTL while its lookups fail.
    let asked = dns.queries("b.svc.test", RecordType::A);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dns.queries("b.svc.test", RecordType::A) < asked + 20 {
        assert!(Instant::now() < deadline, "the target was not asked again");
        assert!(endpoints(&gw, "srv").contains(&format!("127.0.0.1:{}", ports[1])), "the failing target was dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The per-endpoint series of an address that left the set are no longer
/// exported (they were for ever: with pod churn, without bound); those of
/// the endpoints there are stay.
#[tokio::test]
async fn a_departed_endpoints_series_leave_metrics() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1", "127.0.0.2"]).await;
    dns.addresses("gone.test", &["127.0.0.1", "127.0.0.2"], 1);
    let discover = format!("dns = \"gone.test:{port}\", interval = \"300ms\", min_ttl = \"100ms\"");
    let extra = "balance = \"round_robin\"\noutlier = { consecutive_failures = 5 }";
    let gw = gateway(&dns, "leaving", &discover, extra).await;
    wait_for_endpoints(&gw, "leaving", 2).await;
    for _ in 0..4 {
        assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    }
    let families = [
        "gateway_upstream_endpoint_healthy",
        "gateway_upstream_endpoint_ejected",
        "gateway_upstream_ejections_total",
        "gateway_upstream_connections_opened_total",
    ];
    let (stays, leaves) = (format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}"));
    let m = metrics_text(gw.addr).await;
    for family in families {
        for endpoint in [&stays, &leaves] {
            let labels = [("upstream", "leaving"), ("endpoint", endpoint.as_str())];
            assert!(sample(&m, family, &labels).is_some(), "{family} {endpoint} missing before:\n{m}");
        }
    }
    assert_eq!(
        sample(&m, "gateway_upstream_connections_opened_total", &[("upstream", "leaving"), ("endpoint", &leaves)]),
        Some(1.0)
    );

    dns.addresses("gone.test", &["127.0.0.1"], 1);
    wait_for_endpoints(&gw, "leaving", 1).await;
    let m = metrics_text(gw.addr).await;
    for family in families {
        let labels = [("upstream", "leaving"), ("endpoint", stays.as_str())];
        assert!(sample(&m, family, &labels).is_some(), "{family} of the endpoint that stayed is gone:\n{m}");
        let labels = [("upstream", "leaving"), ("endpoint", leaves.as_str())];
        assert_eq!(sample(&m, family, &labels), None, "{family} of the departed endpoint is still exported");
    }
}
