//! A route whose upstream is the gateway itself (a discovered name that
//! resolves to its own address, as an edge tier pointed at its own
//! Service): the request's second pass finds the gateway's own name in
//! `Via` and is answered 508 Loop Detected, so a request goes round once,
//! not until descriptors run out; and the gateway keeps serving.

mod common;
#[path = "discovery/dns.rs"]
mod dns;
#[path = "discovery/upstreams.rs"]
mod upstreams;

use common::*;
use dns::TestDns;
use upstreams::wait_for_endpoints;

/// A gateway with route `/round` (named `route`: the metrics are the
/// process's) to the SRV name `_http._tcp.self.test`, which `dns` will
/// point at the gateway's own port, and route `/hello`.
async fn gateway(dns: &TestDns, route: &str, server: &str) -> TestGateway {
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server}\n\
         [resolver]\nnameservers = [\"{}\"]\ntimeout = \"500ms\"\nattempts = 1\n\
         [upstreams.self]\ndiscover = {{ srv = \"_http._tcp.self.test\", interval = \"200ms\", min_ttl = \"100ms\" }}\n\
         [[routes]]\nname = \"{route}\"\nprefix = \"/round\"\nupstream = \"self\"\ntimeout = \"5s\"\n\
         [[routes]]\nname = \"hello\"\nprefix = \"/hello\"\nrespond = {{ status = 200, body = \"hello\" }}\n",
        dns.addr
    );
    let gw = TestGateway::from_toml(&toml).await;
    dns.addresses("self.test", &["127.0.0.1"], 1);
    dns.srv("_http._tcp.self.test", &[(0, 0, gw.addr.port(), "self.test")], 1);
    wait_for_endpoints(&gw, "self", 1).await;
    gw
}

#[tokio::test]
async fn a_route_back_to_the_gateway_itself_is_cut_at_the_second_pass() {
    let dns = TestDns::start().await;
    let gw = gateway(&dns, "round", "").await;
    bounded(async {
        let (parts, body) = get(&gw.url("/round/x")).await;
        assert_eq!(parts.status, 508, "{}", String::from_utf8_lossy(&body));
        // The first pass relays what the second answered, with its own entry.
        let via = parts.headers["via"].to_str().unwrap();
        assert!(via.starts_with("1.1 gateway-") && !via.contains(','), "{via}");

        // Three at once, and again: each goes round once.
        let at_once: Vec<_> = (0..3).map(|_| tokio::spawn(get_status(gw.url("/round/y")))).collect();
        for r in at_once {
            assert_eq!(r.await.unwrap(), 508);
        }
        assert_eq!(get(&gw.url("/hello")).await.0.status, 200, "the gateway keeps serving");
        let m = metrics_text(gw.addr).await;
        let passes = sample(&m, "http_server_requests_total", &[("route", "round"), ("status", "508")]);
        assert_eq!(passes, Some(8.0), "two passes a request");
        let cut = sample(&m, "gateway_rejected_total", &[("route", "round"), ("reason", "loop_detected")]);
        assert_eq!(cut, Some(4.0), "one cut a request");
    })
    .await;
}

#[tokio::test]
async fn a_named_gateway_knows_its_name_in_any_case() {
    let dns = TestDns::start().await;
    let gw = gateway(&dns, "named", "via = \"Edge-1\"").await;
    bounded(async {
        let (parts, _) = get(&gw.url("/round/x")).await;
        assert_eq!(parts.status, 508);
        assert_eq!(parts.headers["via"], "1.1 Edge-1");
        // A client naming it (it is in every response) is refused as a loop.
        let req = http::Request::get(gw.url("/round/z")).header("via", "1.1 edge-1").body(full("")).unwrap();
        assert_eq!(send(req).await.0.status, 508);
        // Another hop's name is no loop: the request goes round once more.
        let req = http::Request::get(gw.url("/round/z")).header("via", "1.0 edge-2").body(full("")).unwrap();
        let (parts, _) = send(req).await;
        assert_eq!(parts.status, 508);
        assert_eq!(parts.headers["via"], "1.1 Edge-1");
    })
    .await;
}

async fn get_status(url: String) -> u16 {
    get(&url).await.0.status.as_u16()
}
