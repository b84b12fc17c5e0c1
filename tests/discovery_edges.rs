//! Discovery where answers are partial or odd, against the tests' DNS
//! server (`discovery/dns.rs`): a name gone from A while AAAA fails, a
//! reload while a name is gone, SRV targets that do not answer, SRV
//! priorities whose lowest has no address; records that are not the
//! name's, link-local addresses, an SRV target of `.`; more addresses
//! than an upstream holds.

mod common;
#[path = "discovery/dns.rs"]
mod dns;
#[path = "discovery/upstreams.rs"]
mod upstreams;

use std::time::Duration;

use common::*;
use dns::{Reply, TestDns};
use gateway::discovery::Resolution;
use hickory_proto::rr::rdata::{A, CNAME};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::time::Instant;
use upstreams::*;

fn resolution(gw: &TestGateway, name: &str) -> Option<Resolution> {
    let up = gw.app.upstreams().into_iter().find(|u| u.config.name == name).expect("the upstream is there");
    up.discovery().result
}

/// A answers NXDOMAIN (or no records) while AAAA fails (SERVFAIL, or no
/// answer at all): what answered applies, so the address goes after
/// `max_ttl` as for a name not found, not kept for ever as for a failed
/// lookup.
#[tokio::test]
async fn a_name_gone_from_a_while_aaaa_fails_goes_after_max_ttl() {
    let cases = [
        ("nx-servfail", Reply::NxDomain, Reply::ServFail),
        ("empty-silent", Reply::Records { data: vec![], ttl: 1 }, Reply::Silent),
    ];
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1"]).await;
    let mut gateways = Vec::new();
    for (case, _, _) in &cases {
        let host = format!("{case}.test");
        dns.addresses(&host, &["127.0.0.1"], 1);
        let discover = format!("dns = \"{host}:{port}\", interval = \"200ms\", min_ttl = \"100ms\", max_ttl = \"2s\"");
        let gw = gateway(&dns, case, &discover, "").await;
        wait_for_endpoints(&gw, case, 1).await;
        gateways.push(gw);
    }
    for (case, a, aaaa) in &cases {
        dns.set(&format!("{case}.test"), RecordType::A, a.clone());
        dns.set(&format!("{case}.test"), RecordType::AAAA, aaaa.clone());
    }
    // Not at once: a name gone keeps its addresses until max_ttl.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for ((case, _, _), gw) in cases.iter().zip(&gateways) {
        assert_eq!(endpoints(gw, case).len(), 1, "{case}: emptied before max_ttl");
    }
    for ((case, _, _), gw) in cases.iter().zip(&gateways) {
        wait_for_count(gw, case, 0, Duration::from_secs(6)).await;
        assert_eq!(status_and_body(gw.url("/x")).await.0, 503, "{case}");
        match resolution(gw, case) {
            Some(Resolution::Partial { addresses: 0, reason }) => {
                assert!(reason.starts_with("AAAA"), "{case}: {reason}")
            }
            other => panic!("{case}: {other:?}"),
        }
    }
}

/// The gateway on `path`, whose upstream `reload` is discovered with
/// `discover` through `dns`.
fn reload_toml(dns: &TestDns, discover: &str, timeout: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\
         [resolver]\nnameservers = [\"{}\"]\ntimeout = \"{timeout}\"\nattempts = 1\n\
         [upstreams.reload]\ndiscover = {{ {discover} }}\n\
         [[routes]]\nname = \"reload\"\nprefix = \"/\"\nupstream = \"reload\"\n",
        dns.addr
    )
}

/// A reload that changes a discovered upstream's settings, or
/// `[resolver]`, while its name is gone: the new lookups still keep the
/// addresses until `max_ttl` after the name last had them, not one lookup.
#[tokio::test]
async fn a_reload_while_a_name_is_gone_still_waits_for_max_ttl() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1"]).await;
    dns.addresses("reload.test", &["127.0.0.1"], 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    let discover = |interval: &str| {
        format!("dns = \"reload.test:{port}\", interval = \"{interval}\", min_ttl = \"100ms\", max_ttl = \"3s\"")
    };
    std::fs::write(&path, reload_toml(&dns, &discover("200ms"), "500ms")).unwrap();
    let c = gateway::config::load(&gateway::config::Source::File(path.clone())).unwrap();
    let gw = TestGateway::start(c).await;
    wait_for_endpoints(&gw, "reload", 1).await;

    dns.all("reload.test", Reply::NxDomain);
    // The upstream's settings, then the resolver's.
    for (interval, timeout) in [("300ms", "500ms"), ("300ms", "400ms")] {
        std::fs::write(&path, reload_toml(&dns, &discover(interval), timeout)).unwrap();
        gw.app.reload().unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(endpoints(&gw, "reload").len(), 1, "emptied after a reload ({interval}, {timeout})");
        assert_eq!(resolution(&gw, "reload"), Some(Resolution::NotFound), "it was asked since");
    }
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    wait_for_count(&gw, "reload", 0, Duration::from_secs(5)).await;
}

/// SRV targets are looked up at once: the DNS holds its answers back until
/// every target has been asked, so a gateway asking them one after another
/// (each waiting for its answer) would first get all but the last wrong.
#[tokio::test]
async fn srv_targets_are_looked_up_at_once() {
    let dns = TestDns::start().await;
    let ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"];
    let (port, _ups) = on_one_port(&ips).await;
    let targets: Vec<String> = (1..=ips.len()).map(|i| format!("t{i}.many.test")).collect();
    for (target, ip) in targets.iter().zip(ips) {
        dns.addresses(target, &[ip], 60);
    }
    let records: Vec<(u16, u16, u16, &str)> = targets.iter().map(|t| (10, 1, port, t.as_str())).collect();
    dns.srv("_http._tcp.many.test", &records, 60);
    dns.hold_until_all_asked(&targets.iter().map(String::as_str).collect::<Vec<_>>());
    let discover = "srv = \"_http._tcp.many.test\", interval = \"60s\", min_ttl = \"1s\"";
    let gw = gateway(&dns, "many", discover, "").await;
    let deadline = Instant::now() + Duration::from_secs(8);
    let first = loop {
        let now = endpoints(&gw, "many");
        if !now.is_empty() {
            break now;
        }
        assert!(Instant::now() < deadline, "no endpoint");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(first.len(), ips.len(), "the first lookup's set: {first:?}");
    assert_eq!(resolution(&gw, "many"), Some(Resolution::Found { addresses: ips.len() }));
    let m = metrics_text(gw.addr).await;
    let partial = sample(&m, "gateway_discovery_resolutions_total", &[("upstream", "many"), ("result", "partial")]);
    assert_eq!(partial, Some(0.0), "no target failed");
}

/// RFC 2782: the lowest priority the client can reach. Priorities whose
/// targets have no usable address (NXDOMAIN, only 0.0.0.0, port 0) are
/// passed over for the next; once the lowest has an address again, it is
/// the one used.
#[tokio::test]
async fn srv_passes_over_priorities_without_an_address() {
    let dns = TestDns::start().await;
    let (port, ups) = on_one_port(&["127.0.0.1", "127.0.0.2"]).await;
    dns.srv(
        "_http._tcp.prio.test",
        &[
            (1, 1, 0, "z.prio.test"),
            (5, 1, port, "c.prio.test"),
            (10, 1, port, "a.prio.test"),
            (20, 1, port, "b.prio.test"),
        ],
        1,
    );
    dns.addresses("z.prio.test", &["127.0.0.1"], 1);
    dns.addresses("c.prio.test", &["0.0.0.0"], 1);
    dns.addresses("b.prio.test", &["127.0.0.2"], 1);
    let discover = "srv = \"_http._tcp.prio.test\", interval = \"200ms\", min_ttl = \"100ms\"";
    let gw = gateway(&dns, "prio", discover, "").await;
    assert_eq!(wait_for_endpoints(&gw, "prio", 1).await, [format!("127.0.0.2:{port}")]);
    for _ in 0..3 {
        assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    }
    assert_eq!(counts(&ups), [0, 3]);

    // The lowest priority with a target reachable has an address again.
    dns.addresses("a.prio.test", &["127.0.0.1"], 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while endpoints(&gw, "prio") != [format!("127.0.0.1:{port}")] {
        assert!(Instant::now() < deadline, "still {:?}", endpoints(&gw, "prio"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn skipped(m: &str, upstream: &str, reason: &str) -> f64 {
    sample(m, "gateway_discovery_skipped_total", &[("upstream", upstream), ("reason", reason)]).unwrap_or(0.0)
}

fn a(ip: &str) -> RData {
    RData::A(A(ip.parse().unwrap()))
}

/// Records in the answer for another name than the one asked, with no
/// CNAME leading to it, are not the name's: left out, counted
/// `other_name`. A CNAME chain's records are the name's.
#[tokio::test]
async fn records_of_another_name_are_left_out_and_a_cname_chain_is_followed() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1", "127.0.0.2", "127.0.0.3"]).await;
    let records = vec![("odd.test".to_owned(), a("127.0.0.1")), ("evil.test".to_owned(), a("127.0.0.2"))];
    dns.set("odd.test", RecordType::A, Reply::Owned { records, ttl: 60 });
    dns.set("odd.test", RecordType::AAAA, Reply::Records { data: vec![], ttl: 60 });
    let gw = gateway(&dns, "odd", &format!("dns = \"odd.test:{port}\", interval = \"60s\""), "").await;
    assert_eq!(wait_for_endpoints(&gw, "odd", 1).await, [format!("127.0.0.1:{port}")]);
    assert!(skipped(&metrics_text(gw.addr).await, "odd", "other_name") >= 1.0);

    let cname = RData::CNAME(CNAME(Name::from_ascii("real.test.").unwrap()));
    let records = vec![("alias.test".to_owned(), cname), ("real.test".to_owned(), a("127.0.0.3"))];
    dns.set("alias.test", RecordType::A, Reply::Owned { records, ttl: 60 });
    dns.set("alias.test", RecordType::AAAA, Reply::Records { data: vec![], ttl: 60 });
    let gw = gateway(&dns, "alias", &format!("dns = \"alias.test:{port}\", interval = \"60s\""), "").await;
    assert_eq!(wait_for_endpoints(&gw, "alias", 1).await, [format!("127.0.0.3:{port}")]);
    assert_eq!(skipped(&metrics_text(gw.addr).await, "alias", "other_name"), 0.0);
}

/// Link-local addresses (169.254.169.254, where clouds serve instance
/// credentials; fe80::/10) from DNS are never endpoints: left out,
/// counted `link_local`.
#[tokio::test]
async fn link_local_addresses_are_left_out() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1"]).await;
    dns.addresses("ll.test", &["169.254.169.254", "127.0.0.1", "fe80::1"], 60);
    let gw = gateway(&dns, "ll", &format!("dns = \"ll.test:{port}\", interval = \"60s\""), "").await;
    assert_eq!(wait_for_endpoints(&gw, "ll", 1).await, [format!("127.0.0.1:{port}")]);
    assert!(skipped(&metrics_text(gw.addr).await, "ll", "link_local") >= 2.0);
}

/// RFC 2782: an SRV target of `.` means no service at this name: not
/// looked up, counted `no_service`; the next priority serves.
#[tokio::test]
async fn an_srv_target_of_dot_is_no_service() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1"]).await;
    dns.srv("_http._tcp.dot.test", &[(10, 1, port, "."), (20, 1, port, "b.dot.test")], 60);
    dns.addresses("b.dot.test", &["127.0.0.1"], 60);
    let gw = gateway(&dns, "dot", "srv = \"_http._tcp.dot.test\", interval = \"60s\"", "").await;
    assert_eq!(wait_for_endpoints(&gw, "dot", 1).await, [format!("127.0.0.1:{port}")]);
    assert!(skipped(&metrics_text(gw.addr).await, "dot", "no_service") >= 1.0);
    assert_eq!(dns.queries(".", RecordType::A) + dns.queries(".", RecordType::AAAA), 0, "the root was asked");
}

/// An upstream holds at most 1024 endpoints (`MAX_ENDPOINTS`): an SRV name
/// of 18 targets of 60 addresses each (1080) gives the 1024 lowest, and
/// the 56 others are counted `too_many`.
#[tokio::test]
async fn a_name_with_more_addresses_than_an_upstream_holds_gives_the_lowest() {
    let dns = TestDns::start().await;
    let mut records = Vec::new();
    for t in 0..18u8 {
        let target = format!("t{t}.cap.test");
        let ips: Vec<String> = (0..60).map(|i| format!("127.1.{t}.{i}")).collect();
        dns.addresses(&target, &ips.iter().map(String::as_str).collect::<Vec<_>>(), 60);
        records.push(target);
    }
    let srv: Vec<(u16, u16, u16, &str)> = records.iter().map(|t| (10, 1, 8080, t.as_str())).collect();
    dns.srv("_http._tcp.cap.test", &srv, 60);
    let gw = gateway(&dns, "cap", "srv = \"_http._tcp.cap.test\", interval = \"60s\"", "").await;
    let got = wait_for_count(&gw, "cap", 1024, Duration::from_secs(10)).await;
    assert_eq!(got.first().map(String::as_str), Some("127.1.0.0:8080"));
    // 17 targets whole (1020 addresses), and the 4 lowest of the last.
    assert_eq!(got.last().map(String::as_str), Some("127.1.17.3:8080"));
    assert_eq!(resolution(&gw, "cap"), Some(Resolution::Found { addresses: 1080 }));
    assert!(skipped(&metrics_text(gw.addr).await, "cap", "too_many") >= 56.0);
}

/// An answer holding only another name's records (A or SRV) never
/// reaches the gateway: hickory's resolver finds none of the name's
/// records in it and reports "no records", dropping the answer, so the
/// lookup is `not_found` and `other_name` stays 0, as docs/behaviour.md
/// says. The address is never used.
#[tokio::test]
async fn an_answer_of_only_another_names_records_is_not_found() {
    let dns = TestDns::start().await;
    let records = vec![("victim.test".to_owned(), a("127.0.0.2"))];
    dns.set("only.test", RecordType::A, Reply::Owned { records, ttl: 60 });
    dns.set("only.test", RecordType::AAAA, Reply::Records { data: vec![], ttl: 60 });
    let gw = gateway(&dns, "only", "dns = \"only.test:8080\", interval = \"60s\"", "").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while resolution(&gw, "only").is_none() {
        assert!(Instant::now() < deadline, "no lookup finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(resolution(&gw, "only"), Some(Resolution::NotFound));
    assert!(endpoints(&gw, "only").is_empty());
    assert_eq!(skipped(&metrics_text(gw.addr).await, "only", "other_name"), 0.0);

    let srv = RData::SRV(hickory_proto::rr::rdata::SRV::new(10, 1, 8080, Name::from_ascii("t.victim.test.").unwrap()));
    let records = vec![("_http._tcp.victim.test".to_owned(), srv)];
    dns.set("_http._tcp.only-srv.test", RecordType::SRV, Reply::Owned { records, ttl: 60 });
    dns.addresses("t.victim.test", &["127.0.0.2"], 60);
    let gw = gateway(&dns, "osrv", "srv = \"_http._tcp.only-srv.test\", interval = \"60s\"", "").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while resolution(&gw, "osrv").is_none() {
        assert!(Instant::now() < deadline, "no lookup finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(resolution(&gw, "osrv"), Some(Resolution::NotFound));
    assert!(endpoints(&gw, "osrv").is_empty());
    assert_eq!(skipped(&metrics_text(gw.addr).await, "osrv", "other_name"), 0.0);
}
