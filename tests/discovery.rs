//! Discovered upstreams against a DNS server in the test (`discovery/dns.rs`)
//! whose answers change while the gateway runs: every address is an
//! endpoint, load spreads over them, a removed one gets no new requests
//! while its request in flight completes, an added one gets its share;
//! SERVFAIL keeps the set, NXDOMAIN empties it after `max_ttl`; the TTL
//! decides when the name is asked again; SRV gives ports; AAAA works.

mod common;
#[path = "discovery/dns.rs"]
mod dns;
#[path = "discovery/upstreams.rs"]
mod upstreams;

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use common::*;
use dns::{Reply, TestDns};
use gateway::discovery::{Resolution, Source};
use hickory_proto::rr::RecordType;
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::time::Instant;
use upstreams::*;

#[tokio::test]
async fn three_addresses_are_three_endpoints_that_follow_the_answer() {
    let dns = TestDns::start().await;
    let (port, ups) = on_one_port(&["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]).await;
    dns.addresses("app.test", &["127.0.0.1", "127.0.0.2", "127.0.0.3"], 1);
    let discover = format!("dns = \"app.test:{port}\", interval = \"300ms\", min_ttl = \"100ms\"");
    let gw = gateway(&dns, "spread", &discover, "balance = \"round_robin\"").await;
    let now = wait_for_endpoints(&gw, "spread", 3).await;
    assert_eq!(
        now,
        (1..=3).map(|i| format!("127.0.0.{i}:{port}")).collect::<Vec<_>>(),
        "the endpoint label is the address"
    );

    for _ in 0..30 {
        let (status, body) = status_and_body(gw.url("/x")).await;
        assert_eq!(status, 200);
        // The Host is the name, not the address.
        assert!(body.ends_with(&format!(" app.test:{port}")), "{body}");
    }
    assert_eq!(counts(&ups), [10, 10, 10, 0], "round robin over the three addresses");

    // One request in flight on each; then 127.0.0.3 leaves the answer.
    let slow: Vec<_> = (0..3).map(|_| tokio::spawn(status_and_body(gw.url("/slow")))).collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    while ups[..3].iter().any(|s| s.in_flight.load(SeqCst) == 0) {
        assert!(Instant::now() < deadline, "the slow requests did not each reach an upstream");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    dns.addresses("app.test", &["127.0.0.1", "127.0.0.2"], 1);
    wait_for_endpoints(&gw, "spread", 2).await;
    let before = counts(&ups);
    for _ in 0..20 {
        assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    }
    let after = counts(&ups);
    assert_eq!(after[2], before[2], "the removed address got new requests");
    assert_eq!(after[0] + after[1], before[0] + before[1] + 20);
    let mut finished: Vec<String> = Vec::new();
    for s in slow {
        let (status, body) = s.await.unwrap();
        assert_eq!(status, 200, "a request in flight on a removed endpoint must complete: {body}");
        finished.push(body);
    }
    assert!(finished.iter().any(|b| b.starts_with(&format!("127.0.0.3:{port} "))), "{finished:?}");
    // Its last request done, the removed endpoint's idle connection closes.
    let deadline = Instant::now() + Duration::from_secs(3);
    while ups[2].closed.load(SeqCst) < ups[2].accepted.load(SeqCst) {
        assert!(Instant::now() < deadline, "the removed endpoint's idle connections stayed open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // An address added to the answer gets its share.
    dns.addresses("app.test", &["127.0.0.1", "127.0.0.2", "127.0.0.4"], 1);
    wait_for_endpoints(&gw, "spread", 3).await;
    for _ in 0..30 {
        assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    }
    assert_eq!(ups[3].requests.load(SeqCst), 10, "the added address takes its turn");

    // What the status endpoints will show.
    let up = gw.app.upstreams().into_iter().find(|u| u.config.name == "spread").unwrap();
    let status = up.discovery();
    assert_eq!(status.source, Source::Dns);
    assert_eq!(status.source.as_str(), "dns");
    assert_eq!(status.name.as_deref(), Some(format!("app.test:{port}").as_str()));
    assert_eq!(status.result, Some(Resolution::Found { addresses: 3 }));
    assert!(status.last_resolution.is_some() && status.last_success.is_some());
    let m = metrics_text(gw.addr).await;
    assert!(
        sample(&m, "gateway_discovery_resolutions_total", &[("upstream", "spread"), ("result", "ok")]).unwrap() >= 3.0
    );
    assert!(sample(&m, "gateway_discovery_last_success_timestamp_seconds", &[("upstream", "spread")]).unwrap() > 1.0e9);
    assert_eq!(sample(&m, "gateway_upstream_endpoints", &[("upstream", "spread"), ("state", "healthy")]), Some(3.0));
}

/// Waits until the gateway asks for `name`'s A records again, and a moment
/// more for the answer to go out; an instant from before the query came
/// (the gateway takes the answer after it).
async fn asked_again(dns: &TestDns, name: &str) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut before = Instant::now();
    let seen = dns.queries(name, RecordType::A);
    loop {
        let now = Instant::now();
        if dns.queries(name, RecordType::A) > seen {
            break;
        }
        assert!(now < deadline, "{name} was not asked again");
        before = now;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The test server counts a query, then reads its zone for the answer.
    tokio::time::sleep(Duration::from_millis(50)).await;
    before
}

#[tokio::test]
async fn servfail_keeps_the_set_and_nxdomain_empties_it_after_max_ttl() {
    let dns = TestDns::start().await;
    let (port, ups) = on_one_port(&["127.0.0.1"]).await;
    dns.addresses("gone.test", &["127.0.0.1"], 1);
    let discover =
        format!("dns = \"gone.test:{port}\", interval = \"200ms\", min_ttl = \"100ms\", max_ttl = \"1500ms\"");
    let health = "health = { path = \"/health\", interval = \"200ms\" }";
    let gw = gateway(&dns, "gone", &discover, health).await;
    wait_for_endpoints(&gw, "gone", 1).await;
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    assert_eq!(status_and_body(gw.url("/readyz")).await.0, 200);

    // The DNS fails for longer than max_ttl: the set stays.
    dns.all("gone.test", Reply::ServFail);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(endpoints(&gw, "gone").len(), 1, "SERVFAIL must keep the last good set");
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    let up = gw.app.upstreams().into_iter().find(|u| u.config.name == "gone").unwrap();
    assert!(matches!(up.discovery().result, Some(Resolution::Failed { .. })), "{:?}", up.discovery());
    let m = metrics_text(gw.addr).await;
    assert!(
        sample(&m, "gateway_discovery_resolutions_total", &[("upstream", "gone"), ("result", "error")]).unwrap() >= 3.0
    );

    // Back, then gone for good, right after an answer with addresses:
    // kept until max_ttl after that answer.
    dns.addresses("gone.test", &["127.0.0.1"], 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let last_found = asked_again(&dns, "gone.test").await;
    dns.all("gone.test", Reply::NxDomain);
    let gone = Instant::now();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200, "emptied before max_ttl");
    let deadline = gone + Duration::from_secs(4);
    loop {
        let (status, _) = status_and_body(gw.url("/x")).await;
        if status == 503 {
            break;
        }
        assert_eq!(status, 200);
        assert!(Instant::now() < deadline, "NXDOMAIN did not empty the set after max_ttl");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        last_found.elapsed() >= Duration::from_millis(1495),
        "emptied {:?} after the last answer with addresses, before max_ttl",
        last_found.elapsed()
    );
    let (status, body) = status_and_body(gw.url("/readyz")).await;
    assert_eq!((status, body.contains("gone")), (503, true), "{body}");
    let m = metrics_text(gw.addr).await;
    assert!(
        sample(&m, "gateway_upstream_errors_total", &[("upstream", "gone"), ("kind", "unavailable")]).unwrap() >= 1.0
    );
    assert!(
        sample(&m, "gateway_discovery_resolutions_total", &[("upstream", "gone"), ("result", "not_found")]).unwrap()
            >= 1.0
    );
    assert!(ups[0].requests.load(SeqCst) >= 3);
}

#[tokio::test]
async fn the_name_is_asked_again_at_its_ttl() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1"]).await;
    dns.addresses("ttl.test", &["127.0.0.1"], 2);
    let discover = format!("dns = \"ttl.test:{port}\", interval = \"30s\", min_ttl = \"100ms\", max_ttl = \"30s\"");
    let gw = gateway(&dns, "ttl", &discover, "").await;
    wait_for_endpoints(&gw, "ttl", 1).await;
    let asked = dns.queries("ttl.test", RecordType::A);
    assert_eq!(asked, 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(dns.queries("ttl.test", RecordType::A), 1, "asked again before the TTL of 2 s");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(dns.queries("ttl.test", RecordType::A), 2, "not asked again at the TTL");
    drop(gw);
}

#[tokio::test]
async fn srv_records_give_each_endpoint_its_port() {
    let dns = TestDns::start().await;
    let bind = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let (a, b, c) = (bind().await, bind().await, bind().await);
    let ports: Vec<u16> = [&a, &b, &c].iter().map(|l| l.local_addr().unwrap().port()).collect();
    let ups: Vec<Arc<Seen>> = [a, b, c].into_iter().map(serve).collect();
    dns.srv(
        "_http._tcp.svc.test",
        &[(10, 1, ports[0], "a.svc.test."), (10, 1, ports[1], "b.svc.test."), (20, 1, ports[2], "c.svc.test.")],
        5,
    );
    for target in ["a.svc.test", "b.svc.test", "c.svc.test"] {
        dns.addresses(target, &["127.0.0.1"], 5);
    }
    let gw = gateway(&dns, "srv", "srv = \"_http._tcp.svc.test\"", "balance = \"round_robin\"").await;
    let now = wait_for_endpoints(&gw, "srv", 2).await;
    assert_eq!(
        now,
        vec![format!("127.0.0.1:{}", ports[0].min(ports[1])), format!("127.0.0.1:{}", ports[0].max(ports[1]))]
    );
    for _ in 0..10 {
        let (status, body) = status_and_body(gw.url("/x")).await;
        assert_eq!(status, 200);
        let port = body.split(' ').next().unwrap().rsplit(':').next().unwrap();
        assert!(body.ends_with(&format!(" svc.test:{port}")), "the Host is the service's name: {body}");
    }
    assert_eq!(counts(&ups), [5, 5, 0], "the lowest priority's records, each on its port");
    assert_eq!(gw.app.upstreams()[0].discovery().source, Source::Srv);
}

#[tokio::test]
async fn aaaa_records_are_endpoints_too() {
    let dns = TestDns::start().await;
    let listener = TcpListener::bind("[::1]:0").await.expect("IPv6 loopback");
    let port = listener.local_addr().unwrap().port();
    let seen = serve(listener);
    dns.addresses("v6.test", &["::1"], 5);
    let gw = gateway(&dns, "six", &format!("dns = \"v6.test:{port}\""), "").await;
    assert_eq!(wait_for_endpoints(&gw, "six", 1).await, vec![format!("[::1]:{port}")]);
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    assert_eq!(seen.requests.load(SeqCst), 1);
    let m = metrics_text(gw.addr).await;
    let endpoint = format!("[::1]:{port}");
    assert_eq!(
        sample(&m, "gateway_upstream_connections_opened_total", &[("upstream", "six"), ("endpoint", &endpoint)]),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_name_that_does_not_resolve_yet_is_no_error_and_answers_503() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1"]).await;
    let gw =
        gateway(&dns, "later", &format!("dns = \"later.test:{port}\", interval = \"200ms\", min_ttl = \"100ms\""), "")
            .await;
    assert_eq!(status_and_body(gw.url("/x")).await.0, 503, "no address yet");
    assert_eq!(status_and_body(gw.url("/readyz")).await.0, 503, "not ready with nowhere to send requests");
    dns.addresses("later.test", &["127.0.0.1"], 1);
    wait_for_endpoints(&gw, "later", 1).await;
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200, "served once the name resolves");
    assert_eq!(status_and_body(gw.url("/readyz")).await.0, 200);
}

/// A reload that changes a discovered upstream's settings keeps the
/// addresses it had (no 503 while the name is asked again), and one that
/// removes the upstream stops its lookups.
#[tokio::test]
async fn a_reload_keeps_the_addresses_and_a_removed_upstream_stops_asking() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1", "127.0.0.2"]).await;
    dns.addresses("keep.test", &["127.0.0.1", "127.0.0.2"], 30);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    let toml = |connect: &str, interval: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[resolver]\nnameservers = [\"{}\"]\n\
             [upstreams.keep]\ndiscover = {{ dns = \"keep.test:{port}\", interval = \"{interval}\" }}\nconnect_timeout = \"{connect}\"\n\
             [[routes]]\nname = \"keep\"\nprefix = \"/\"\nupstream = \"keep\"\n",
            dns.addr
        )
    };
    std::fs::write(&path, toml("1s", "30s")).unwrap();
    let c = gateway::config::load(&gateway::config::Source::File(path.clone())).unwrap();
    let gw = TestGateway::start(c).await;
    wait_for_endpoints(&gw, "keep", 2).await;
    // The DNS now fails: only the addresses carried over can serve.
    dns.all("keep.test", Reply::ServFail);
    std::fs::write(&path, toml("2s", "20s")).unwrap();
    gw.app.reload().unwrap();
    assert_eq!(endpoints(&gw, "keep").len(), 2, "a reload that changes settings forgot the addresses");
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    // Removed from the file: its lookups stop.
    std::fs::write(&path, "[server]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    gw.app.reload().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = dns.queries("keep.test", RecordType::A);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(dns.queries("keep.test", RecordType::A), asked, "a removed upstream's name is still asked");
}

/// `gateway_upstream_endpoints{state}`: an endpoint failing its checks is
/// `unhealthy`, one ejected is `ejected`, the rest `healthy`.
#[tokio::test]
async fn endpoints_are_counted_by_state() {
    let (good, _) = counting_upstream().await;
    // Passes its checks, fails every request: ejected after one.
    let bad = TestUpstream::start(|req: Request<Incoming>| async move {
        let mut r = Response::new(full("bad"));
        if req.uri().path() != "/health" {
            *r.status_mut() = http::StatusCode::BAD_GATEWAY;
        }
        r
    })
    .await;
    let refused = refused_addr().await;
    let toml = format!(
        "[server]\n[upstreams.states]\nendpoints = [\"http://{}\", \"http://{}\", \"http://{refused}\"]\n\
         balance = \"round_robin\"\nhealth = {{ path = \"/health\", interval = \"100ms\", unhealthy_after = 1 }}\n\
         outlier = {{ consecutive_failures = 1, ejection_time = \"60s\" }}\n\
         [[routes]]\nname = \"states\"\nprefix = \"/\"\nupstream = \"states\"\n",
        good.addr, bad.addr
    );
    let gw = TestGateway::from_toml(&toml).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..4 {
        get(&gw.url("/x")).await;
    }
    let m = metrics_text(gw.addr).await;
    let state = |s: &str| sample(&m, "gateway_upstream_endpoints", &[("upstream", "states"), ("state", s)]);
    assert_eq!((state("healthy"), state("unhealthy"), state("ejected")), (Some(1.0), Some(1.0), Some(1.0)), "{m}");
}

/// A static upstream says so to the status endpoints.
#[tokio::test]
async fn a_static_upstream_is_static() {
    let (up, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "fixed", "", "")).await;
    let status = gw.app.upstreams()[0].discovery();
    assert_eq!((status.source.as_str(), status.name, status.result), ("static", None, None));
}

#[test]
fn bad_discover_keys_exit_64_naming_the_key() {
    let base = "[server]\nlisten = \"127.0.0.1:0\"\n[upstreams.u]\n";
    let route = "[[routes]]\nname = \"r\"\nprefix = \"/\"\nupstream = \"u\"\n";
    let case = |upstream: &str| format!("{base}{upstream}\n{route}");
    let cases = [
        (case("url = \"http://127.0.0.1:1\"\ndiscover = { dns = \"a.test:80\" }"), "upstreams.u.url"),
        (case("discover = { dns = \"a.test:80\", srv = \"_x._tcp.a.test\" }"), "upstreams.u.discover"),
        (case("discover = { }"), "upstreams.u.discover"),
        (case("discover = { dns = \"a.test:http\" }"), "upstreams.u.discover.dns"),
        (case("discover = { dns = \"a..test:80\" }"), "upstreams.u.discover.dns"),
        (case("discover = { dns = \"10.0.0.1:80\" }"), "upstreams.u.discover.dns"),
        (case("discover = { dns = \"a.test:80\", scheme = \"ftp\" }"), "upstreams.u.discover.scheme"),
        (case("discover = { dns = \"a.test:80\", min_ttl = \"2m\" }"), "upstreams.u.discover.min_ttl"),
        (case("discover = { dns = \"a.test:80\", interval = \"0s\" }"), "upstreams.u.discover.interval"),
        (case("discover = { dns = \"a.test:80\", ttl = \"1s\" }"), "discover"),
        (case("discover = { dns = \"a.test:80\" }\ntls_ca_file = \"x.pem\""), "upstreams.u.tls_ca_file"),
        (case("discover = { dns = \"a.test:80\" }\nprotocol = \"auto\""), "upstreams.u.protocol"),
        (
            format!("[resolver]\nnameservers = [\"dns.local\"]\n{}", case("discover = { dns = \"a.test:80\" }")),
            "resolver.nameservers[0]",
        ),
        (format!("[resolver]\nattempts = 0\n{}", case("discover = { dns = \"a.test:80\" }")), "resolver.attempts"),
    ];
    let cases: Vec<(&str, &str)> = cases.iter().map(|(t, k)| (t.as_str(), *k)).collect();
    assert_refused_by_check(env!("CARGO_BIN_EXE_gateway"), &cases);
}

/// `gateway check` says when a discovered name does not resolve, and
/// that is no configuration error.
#[tokio::test]
async fn check_says_when_a_name_does_not_resolve() {
    let dns = TestDns::start().await;
    dns.addresses("yes.test", &["127.0.0.1"], 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[resolver]\nnameservers = [\"{}\"]\ntimeout = \"500ms\"\n\
         [upstreams.yes]\ndiscover = {{ dns = \"yes.test:80\" }}\n[upstreams.no]\ndiscover = {{ dns = \"no.test:80\" }}\n\
         [[routes]]\nname = \"y\"\nprefix = \"/y\"\nupstream = \"yes\"\n[[routes]]\nname = \"n\"\nprefix = \"/n\"\nupstream = \"no\"\n",
        dns.addr
    );
    std::fs::write(&path, toml).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("upstream yes: dns yes.test:80 resolves to 127.0.0.1:80"), "{stdout}");
    assert!(stdout.contains("upstream no: dns no.test:80 is not resolvable now (not found)"), "{stdout}");
}

#[tokio::test]
async fn the_admin_status_shows_a_discovered_upstream() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1", "127.0.0.2"]).await;
    dns.addresses("shown.test", &["127.0.0.1", "127.0.0.2"], 1);
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n\
         [resolver]\nnameservers = [\"{}\"]\ntimeout = \"500ms\"\nattempts = 1\n\
         [upstreams.shown]\ndiscover = {{ dns = \"shown.test:{port}\", interval = \"300ms\", min_ttl = \"100ms\" }}\n\
         [[routes]]\nname = \"shown\"\nprefix = \"/\"\nupstream = \"shown\"\n",
        dns.addr
    );
    let gw = TestGateway::from_toml(&toml).await;
    wait_for_endpoints(&gw, "shown", 2).await;
    let (parts, body) = get(&format!("http://{}/-/upstreams", gw.admin.unwrap())).await;
    assert_eq!(parts.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let u = &v[0];
    assert_eq!(u["name"], "shown", "{v}");
    assert_eq!(u["source"], "dns", "{v}");
    assert_eq!(u["lookup"], format!("shown.test:{port}"), "{v}");
    assert_eq!(u["last_resolution"]["result"], serde_json::json!({ "result": "ok", "addresses": 2 }), "{v}");
    assert!(u["last_success"].is_string(), "{v}");
    let addresses: Vec<&str> =
        u["endpoints"].as_array().unwrap().iter().map(|e| e["address"].as_str().unwrap()).collect();
    assert_eq!(addresses.len(), 2, "{v}");
    assert!(addresses.iter().all(|a| a.ends_with(&format!(":{port}"))), "{v}");
}

/// Answers that can never be an upstream (0.0.0.0, ::, multicast,
/// broadcast; an SRV record on port 0) are left out and counted by reason;
/// loopback (a sidecar) is kept.
#[tokio::test]
async fn records_that_can_never_be_an_upstream_are_skipped_and_counted() {
    let dns = TestDns::start().await;
    let (port, _ups) = on_one_port(&["127.0.0.1"]).await;
    let odd = ["127.0.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "::", "ff02::1"];
    // Asked once in the test: each skipped record is counted once.
    dns.addresses("odd.test", &odd, 60);
    let gw = gateway(&dns, "odd", &format!("dns = \"odd.test:{port}\", interval = \"60s\""), "").await;
    assert_eq!(wait_for_endpoints(&gw, "odd", 1).await, [format!("127.0.0.1:{port}")]);
    assert_eq!(status_and_body(gw.url("/x")).await.0, 200);
    let m = metrics_text(gw.addr).await;
    let skipped = |upstream: &str, reason: &str| {
        sample(&m, "gateway_discovery_skipped_total", &[("upstream", upstream), ("reason", reason)]).unwrap_or(0.0)
    };
    assert_eq!((skipped("odd", "unspecified"), skipped("odd", "multicast")), (2.0, 2.0), "{m}");
    assert_eq!(skipped("odd", "broadcast"), 1.0, "{m}");

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let srv_port = listener.local_addr().unwrap().port();
    serve(listener);
    dns.srv("_http._tcp.zero.test", &[(10, 1, srv_port, "a.zero.test."), (10, 1, 0, "b.zero.test.")], 60);
    dns.addresses("a.zero.test", &["127.0.0.1"], 60);
    dns.addresses("b.zero.test", &["127.0.0.1"], 60);
    let gw = gateway(&dns, "zero", "srv = \"_http._tcp.zero.test\", interval = \"60s\"", "").await;
    assert_eq!(wait_for_endpoints(&gw, "zero", 1).await, [format!("127.0.0.1:{srv_port}")]);
    let m = metrics_text(gw.addr).await;
    let port_zero = sample(&m, "gateway_discovery_skipped_total", &[("upstream", "zero"), ("reason", "port_zero")]);
    assert_eq!(port_zero, Some(1.0), "{m}");
}
