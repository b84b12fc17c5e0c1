//! Routing by host, header and query (docs/routing.md), end to end on real
//! sockets: HTTP/1.1 `Host` in its spellings, HTTP/2 `:authority`, the
//! precedence rules, and files refused for routes that can never be chosen.

mod common;

use bytes::Bytes;
use common::{TestGateway, full, h2_client, send};
use gateway::config::{self, Source};
use http::Request;
use http_body_util::BodyExt;

/// Routes that answer their own name, so a test sees which was chosen.
fn answering(routes: &[(&str, &str, &str)]) -> String {
    let mut toml = String::from("[server]\n");
    for (name, prefix, extra) in routes {
        toml.push_str(&format!(
            "[[routes]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nrespond = {{ status = 200, body = \"{name}\" }}\n\
             {extra}\n"
        ));
    }
    toml
}

/// The body of `GET target` with `Host: host` (when given) and headers.
async fn chosen(gw: &TestGateway, host: Option<&str>, target: &str, headers: &[(&str, &str)]) -> String {
    let mut req = Request::get(gw.url(target));
    if let Some(host) = host {
        req = req.header("host", host);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (parts, body) = send(req.body(full(Bytes::new())).unwrap()).await;
    let body = String::from_utf8_lossy(&body).into_owned();
    if parts.status == 404 {
        return "404".to_owned();
    }
    assert_eq!(parts.status, 200, "{host:?} {target}: {body}");
    body
}

fn host_routes() -> String {
    answering(&[
        ("exact", "/", "hosts = [\"api.example.com\", \"[::1]\"]"),
        ("wild", "/", "hosts = [\"*.example.com\"]"),
        ("deeper", "/", "hosts = [\"*.eu.example.com\"]"),
        ("api-any", "/api", ""),
        ("fallback", "/", ""),
    ])
}

#[tokio::test]
async fn hosts_choose_in_every_spelling_a_client_sends() {
    let gw = TestGateway::from_toml(&host_routes()).await;
    let cases: &[(Option<&str>, &str, &str)] = &[
        (Some("api.example.com"), "/x", "exact"),
        (Some("API.Example.COM"), "/x", "exact"),
        (Some("api.example.com."), "/x", "exact"),
        (Some("api.example.com:8443"), "/x", "exact"),
        (Some("api.example.com.:8443"), "/api/x", "exact"),
        (Some("[::1]:8080"), "/x", "exact"),
        (Some("[::1]"), "/x", "exact"),
        (Some("www.example.com"), "/x", "wild"),
        (Some("a.b.example.com"), "/x", "wild"),
        (Some("a.eu.example.com"), "/x", "deeper"),
        (Some("x.y.eu.example.com:81"), "/x", "deeper"),
        (Some("eu.example.com"), "/x", "wild"),
        (Some("example.com"), "/x", "fallback"),
        (Some("example.com"), "/api/v1", "api-any"),
        (Some("notexample.com"), "/x", "fallback"),
        (Some("127.0.0.1"), "/x", "fallback"),
        (Some("[::2]"), "/x", "fallback"),
    ];
    for (host, target, want) in cases {
        assert_eq!(chosen(&gw, *host, target, &[]).await, *want, "Host {host:?} {target}");
    }
}

#[tokio::test]
async fn http2_authority_chooses_the_host() {
    let gw = TestGateway::from_toml(&host_routes()).await;
    let (mut sender, _conn) = h2_client(gw.addr).await;
    for (authority, want) in [("API.example.com:9", "exact"), ("a.eu.example.com", "deeper"), ("other", "fallback")] {
        let req = Request::get(format!("http://{authority}/x")).body(full(Bytes::new())).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "{authority}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], want.as_bytes(), ":authority {authority}");
    }
}

/// A condition on a forwarding field is met only by a trusted proxy's: an
/// untrusted client's `X-Forwarded-Proto: https` or `X-Forwarded-Ssl: on`
/// never reaches the upstream (it gets the gateway's `http`, or none), so
/// it may not choose the route either (the "HTTPS behind the balancer"
/// route of an app that redirects the rest), nor its `Forwarded`, which
/// the upstream does not get either.
#[tokio::test]
async fn a_forwarding_field_chooses_a_route_only_from_a_trusted_proxy() {
    let routes = answering(&[
        ("tls", "/app", "headers = { \"x-forwarded-proto\" = \"https\" }"),
        ("ssl", "/app", "headers = { \"x-forwarded-ssl\" = \"on\" }"),
        ("fwd", "/app", "headers = { \"forwarded\" = \"*\" }"),
        ("plain", "/app", ""),
    ]);
    let cases: [(&[(&str, &str)], &str); 5] = [
        (&[("x-forwarded-proto", "https")], "tls"),
        (&[("x_forwarded_proto", "https")], "tls"),
        (&[("x-forwarded-ssl", "on")], "ssl"),
        (&[("forwarded", "proto=https")], "fwd"),
        (&[], "plain"),
    ];
    let untrusted =
        TestGateway::from_toml(&routes.replace("[server]\n", "[server]\ntrusted_proxies = [\"10.0.0.0/8\"]\n")).await;
    let trusted =
        TestGateway::from_toml(&routes.replace("[server]\n", "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n")).await;
    for (headers, want) in cases {
        assert_eq!(chosen(&untrusted, Some("h"), "/app/x", headers).await, "plain", "untrusted {headers:?}");
        // The underscore spelling is not the trusted proxy's field either.
        let want = if headers.first().is_some_and(|(n, _)| n.contains('_')) { "plain" } else { want };
        assert_eq!(chosen(&trusted, Some("h"), "/app/x", headers).await, want, "trusted {headers:?}");
    }
}

#[tokio::test]
async fn headers_and_query_choose_in_file_order_and_fall_back_to_shorter_prefixes() {
    let toml = answering(&[
        ("canary", "/api", "headers = { \"x-canary\" = \"1\" }"),
        ("v2", "/api", "query = { v = \"2\" }"),
        ("beta", "/api", "headers = { \"x-beta\" = \"*\", \"x-opt-out\" = false }"),
        ("pattern", "/api", "headers = { \"x-user\" = { regex = \"[a-f0-9]{4}\" } }"),
        ("flagged", "/api/deep", "query = { debug = true }"),
        ("api", "/api", ""),
        ("root", "/", ""),
    ]);
    let gw = TestGateway::from_toml(&toml).await;
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        ("/api/x", &[("x-canary", "1")], "canary"),
        ("/api/x", &[("X-Canary", "1")], "canary"),
        ("/api/x?v=2", &[("x-canary", "1")], "canary"),
        ("/api/x?v=2", &[("x-canary", "0")], "v2"),
        ("/api/x?a=1&v=2", &[], "v2"),
        ("/api/x?v=%32", &[], "v2"),
        ("/api/x?vv=2", &[], "api"),
        ("/api/x", &[("x-beta", "")], "beta"),
        ("/api/x", &[("x-beta", "yes"), ("x-opt-out", "1")], "api"),
        ("/api/x", &[("x-user", "beef")], "pattern"),
        ("/api/x", &[("x-user", "beefy")], "api"),
        ("/api/x", &[("x-user", "xbeef")], "api"),
        ("/api/deep/x?debug", &[], "flagged"),
        ("/api/deep/x?debug=0", &[], "flagged"),
        ("/api/deep/x", &[("x-canary", "1")], "canary"),
        ("/api/deep/x", &[], "api"),
        ("/other", &[("x-canary", "1")], "root"),
    ];
    for (target, headers, want) in cases {
        assert_eq!(chosen(&gw, Some("h"), target, headers).await, *want, "{target} {headers:?}");
    }
    // The same over HTTP/2, whose header names come lower case.
    let (mut sender, _conn) = h2_client(gw.addr).await;
    for (target, headers, want) in cases {
        let mut req = Request::get(format!("http://h{target}"));
        for (k, v) in *headers {
            req = req.header(*k, *v);
        }
        let resp = sender.send_request(req.body(full(Bytes::new())).unwrap()).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], want.as_bytes(), "HTTP/2 {target} {headers:?}");
    }
}

#[tokio::test]
async fn methods_answer_405_on_the_chosen_route_and_do_not_choose() {
    let toml = answering(&[
        ("read", "/api", "hosts = [\"h.example\"]\nmethods = [\"GET\"]"),
        ("any", "/", "hosts = [\"h.example\"]"),
        ("elsewhere", "/api", ""),
    ]);
    let gw = TestGateway::from_toml(&toml).await;
    let req = Request::post(gw.url("/api/x")).header("host", "h.example").body(full("x")).unwrap();
    let (parts, _) = send(req).await;
    assert_eq!(parts.status, 405);
    assert_eq!(parts.headers["allow"], "GET");
    assert_eq!(chosen(&gw, Some("h.example"), "/api/x", &[]).await, "read");
    let req = Request::post(gw.url("/api/x")).header("host", "g.example").body(full("x")).unwrap();
    assert_eq!(send(req).await.0.status, 200, "another host's route takes POST");
}

#[tokio::test]
async fn a_host_without_routes_for_the_path_is_404_without_a_catch_all() {
    let toml = answering(&[("only", "/a", "hosts = [\"h.example\"]")]);
    let gw = TestGateway::from_toml(&toml).await;
    assert_eq!(chosen(&gw, Some("h.example"), "/a/b", &[]).await, "only");
    assert_eq!(chosen(&gw, Some("h.example"), "/b", &[]).await, "404");
    assert_eq!(chosen(&gw, Some("g.example"), "/a", &[]).await, "404");
}

fn load(toml: &str) -> Result<gateway::config::Config, String> {
    let base = std::env::temp_dir();
    config::load(&Source::Inline { text: toml.to_owned(), base_dir: base }).map_err(|e| e.to_string())
}

#[test]
fn routes_that_can_never_be_chosen_are_refused_naming_both() {
    type Routes<'a> = &'a [(&'a str, &'a str, &'a str)];
    let refused: &[(Routes, &str)] = &[
        (&[("a", "/api", ""), ("b", "/api", "")], "routes[1].prefix"),
        (&[("a", "/api", ""), ("b", "/api/", "headers = { x = \"1\" }")], "routes[1].prefix"),
        (&[("a", "/api", "headers = { x = \"*\" }"), ("b", "/api", "headers = { x = \"1\", y = \"2\" }")], "routes[1]"),
        (&[("a", "/", "hosts = [\"H.example\"]"), ("b", "/", "hosts = [\"g.example\", \"h.example.\"]")], "routes[1]"),
        (&[("a", "/", "hosts = [\"*.example\"]"), ("b", "/", "hosts = [\"*.EXAMPLE\"]")], "routes[1]"),
        (
            &[("a", "/", "query = { v = \"2\" }"), ("b", "/", "query = { v = \"2\" }\nmethods = [\"POST\"]")],
            "routes[1]",
        ),
    ];
    for (routes, key) in refused {
        let err = load(&answering(routes)).expect_err("must be refused");
        assert!(err.contains(key), "{err}");
        assert!(err.contains("\"a\"") && err.contains("\"b\"") && err.contains("never be chosen"), "{err}");
    }
    let accepted: &[&[(&str, &str, &str)]] = &[
        &[("a", "/api", "headers = { x = \"1\" }"), ("b", "/api", "")],
        &[("a", "/api", "headers = { x = \"1\" }"), ("b", "/api", "headers = { x = \"2\" }")],
        &[("a", "/", "hosts = [\"h.example\"]"), ("b", "/", "hosts = [\"*.h.example\"]"), ("c", "/", "")],
        &[("a", "/", "headers = { x = false }"), ("b", "/", "headers = { x = \"*\" }")],
    ];
    for routes in accepted {
        load(&answering(routes)).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn bad_matchers_are_refused_with_their_key() {
    let cases: &[(&str, &str)] = &[
        ("hosts = [\"h.example:80\"]", "routes[0].hosts[0]"),
        ("hosts = [\"*\"]", "routes[0].hosts[0]"),
        ("hosts = []", "routes[0].hosts"),
        ("hosts = [\"a.example\", \"A.example\"]", "routes[0].hosts[1]"),
        ("headers = { \"bad name\" = \"1\" }", "routes[0].headers.bad…"),
        ("headers = { host = \"1\" }", "routes[0].headers.host"),
        ("headers = { x = { regex = \"(\" } }", "routes[0].headers.x"),
        ("query = { v = { regex = \"a{100000}\" } }", "routes[0].query.v"),
    ];
    for (extra, key) in cases {
        let err = load(&answering(&[("a", "/", extra)])).expect_err(extra);
        assert!(err.contains(key), "{extra}: {err}");
    }
}

/// Counts the requests each of `n` upstreams saw.
async fn counted_upstreams(
    n: usize,
) -> (Vec<common::TestUpstream>, Vec<std::sync::Arc<std::sync::atomic::AtomicUsize>>) {
    let mut ups = Vec::new();
    let mut counts = Vec::new();
    for _ in 0..n {
        let (up, seen) = common::counting_upstream().await;
        ups.push(up);
        counts.push(seen);
    }
    (ups, counts)
}

fn seen(counts: &[std::sync::Arc<std::sync::atomic::AtomicUsize>]) -> Vec<usize> {
    counts.iter().map(|c| c.load(std::sync::atomic::Ordering::SeqCst)).collect()
}

#[tokio::test]
async fn endpoint_weights_share_requests_in_both_balancers() {
    for (balance, requests) in [("round_robin", 400), ("least_request", 2000)] {
        let (ups, counts) = counted_upstreams(2).await;
        let toml = format!(
            "[upstreams.pool]\nendpoints = [{{ url = \"http://{}\", weight = 3 }}, \"http://{}\"]\nbalance = \"{balance}\"\n\
             [[routes]]\nname = \"pool\"\nprefix = \"/\"\nupstream = \"pool\"\n",
            ups[0].addr, ups[1].addr
        );
        let gw = TestGateway::from_toml(&toml).await;
        for _ in 0..requests {
            assert_eq!(common::get(&gw.url("/x")).await.0.status, 200);
        }
        let got = seen(&counts);
        let share = got[0] as f64 / requests as f64;
        match balance {
            "round_robin" => assert_eq!(got, vec![300, 100], "{balance}"),
            _ => assert!((0.72..=0.78).contains(&share), "{balance}: {got:?}"),
        }
    }
}

#[test]
fn endpoint_weights_are_checked() {
    for (endpoint, key) in [
        ("{ url = \"http://127.0.0.1:1\", weight = 0 }", "upstreams.pool.endpoints[0].weight"),
        ("{ url = \"http://127.0.0.1:1\", weight = 10001 }", "upstreams.pool.endpoints[0].weight"),
        ("{ url = \"http://127.0.0.1:1\", wieght = 2 }", "upstreams.pool.endpoints"),
    ] {
        let toml = format!("[upstreams.pool]\nendpoints = [{endpoint}]\n");
        let err = load(&toml).expect_err(endpoint);
        assert!(err.contains(key), "{endpoint}: {err}");
    }
}

fn split_toml(ups: &[common::TestUpstream], weights: (u32, u32), extra: &str) -> String {
    format!(
        "[upstreams.v1]\nurl = \"http://{}\"\n[upstreams.v2]\nurl = \"http://{}\"\n\
         [[routes]]\nname = \"api\"\nprefix = \"/\"\n\
         split = [{{ upstream = \"v1\", weight = {} }}, {{ upstream = \"v2\", weight = {} }}]\n{extra}\n",
        ups[0].addr, ups[1].addr, weights.0, weights.1
    )
}

/// Sends `n` requests from 8 clients at once.
async fn load_gateway(gw: &TestGateway, n: usize) {
    let url = gw.url("/x");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let client = common::client();
                for _ in 0..n / 8 {
                    let req = Request::get(&url).body(full(Bytes::new())).unwrap();
                    let resp = client.request(req).await.unwrap();
                    assert_eq!(resp.status(), 200);
                    resp.into_body().collect().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn a_split_shares_requests_by_weight() {
    let (ups, counts) = counted_upstreams(2).await;
    let gw = TestGateway::from_toml(&split_toml(&ups, (95, 5), "")).await;
    load_gateway(&gw, 10_000).await;
    let got = seen(&counts);
    assert_eq!(got[0] + got[1], 10_000);
    let share = got[1] as f64 / 10_000.0;
    assert!((0.03..=0.07).contains(&share), "5% within 2 points: {got:?}");
}

/// Which upstream each of `users` lands on (by the body: v1 answers `ok`
/// from the first upstream; the counts tell them apart).
async fn landings(
    gw: &TestGateway,
    counts: &[std::sync::Arc<std::sync::atomic::AtomicUsize>],
    users: &[String],
    how: &str,
) -> Vec<usize> {
    let mut out = Vec::new();
    for user in users {
        let before = seen(counts);
        let req = Request::get(gw.url("/x"));
        let req = match how {
            "header" => req.header("x-user", user),
            _ => req.header("cookie", format!("theme=dark; sid={user}")),
        };
        assert_eq!(send(req.body(full(Bytes::new())).unwrap()).await.0.status, 200);
        let after = seen(counts);
        out.push(if after[0] > before[0] { 0 } else { 1 });
    }
    out
}

#[tokio::test]
async fn a_sticky_split_keeps_each_user_on_one_version_across_a_reload() {
    for (sticky, how) in [("header:x-user", "header"), ("cookie:sid", "cookie")] {
        let (ups, counts) = counted_upstreams(2).await;
        let dir = tempfile::tempdir().unwrap();
        let extra = format!("sticky = \"{sticky}\"");
        let gw = TestGateway::from_file(dir.path(), &split_toml(&ups, (70, 30), &extra)).await;
        let users: Vec<String> = (0..200).map(|i| format!("user-{i}")).collect();
        let first = landings(&gw, &counts, &users, how).await;
        let on_v2 = first.iter().sum::<usize>();
        assert!((30..=90).contains(&on_v2), "{sticky}: about 30% of users on v2: {on_v2}");
        assert_eq!(landings(&gw, &counts, &users, how).await, first, "{sticky}: the same users, the same versions");
        std::fs::write(
            dir.path().join("gateway.toml"),
            split_toml(&ups, (70, 30), &format!("{extra}\ntimeout = \"9s\"")),
        )
        .unwrap();
        gw.app.reload().unwrap();
        assert_eq!(landings(&gw, &counts, &users, how).await, first, "{sticky}: a reload keeps them");
        std::fs::write(dir.path().join("gateway.toml"), split_toml(&ups, (60, 40), &extra)).unwrap();
        gw.app.reload().unwrap();
        let moved = landings(&gw, &counts, &users, how).await;
        assert!(first.iter().zip(&moved).all(|(a, b)| a <= b), "{sticky}: v2 growing takes users only from v1");
    }
}

#[test]
fn bad_splits_are_refused_with_their_key() {
    let ups = "[upstreams.v1]\nurl = \"http://127.0.0.1:1\"\n[upstreams.v2]\nurl = \"http://127.0.0.1:2\"\n";
    let route = |extra: &str| format!("{ups}[[routes]]\nname = \"r\"\nprefix = \"/\"\n{extra}\n");
    let two = "split = [{ upstream = \"v1\", weight = 1 }, { upstream = \"v2\", weight = 1 }]";
    let cases: Vec<(String, &str)> = vec![
        (route("split = [{ upstream = \"v1\", weight = 1 }]"), "routes[0].split"),
        (
            route("split = [{ upstream = \"v1\", weight = 1 }, { upstream = \"v3\", weight = 1 }]"),
            "routes[0].split[1].upstream",
        ),
        (
            route("split = [{ upstream = \"v1\", weight = 1 }, { upstream = \"v1\", weight = 1 }]"),
            "routes[0].split[1].upstream",
        ),
        (route("split = [{ upstream = \"v1\", weight = 0 }, { upstream = \"v2\", weight = 0 }]"), "routes[0].split"),
        (route(&format!("{two}\nupstream = \"v1\"")), "routes[0].split: route \"r\" sets upstream and split"),
        (route(&format!("{two}\nsticky = \"query:x\"")), "routes[0].sticky"),
        (route(&format!("{two}\ncache = {{}}")), "routes[0].cache"),
        (route("upstream = \"v1\"\nsticky = \"header:x\""), "routes[0].sticky"),
    ];
    for (toml, key) in cases {
        let err = load(&toml).expect_err(&toml);
        assert!(err.contains(key), "{toml}: {err}");
    }
    load(&route(two)).unwrap();
}

/// The status and `Location` of a raw HTTP/1.1 exchange of `head`.
async fn redirected(gw: &TestGateway, head: &str) -> (u16, Option<String>, String) {
    let mut bytes = head.as_bytes().to_vec();
    bytes.extend_from_slice(b"Connection: close\r\n\r\n");
    let raw = common::raw(gw.addr, &bytes, std::time::Duration::from_secs(5)).await;
    let location = raw
        .text
        .lines()
        .find_map(|l| l.strip_prefix("location: ").or_else(|| l.strip_prefix("Location: ")))
        .map(str::to_owned);
    (raw.status(), location, raw.text)
}

#[tokio::test]
async fn redirects_write_the_request_into_the_location_safely() {
    let toml = "[server]\nmerge_slashes = false\n\
                [[routes]]\nname = \"to-https\"\nprefix = \"/\"\nhosts = [\"www.example.com\"]\n\
                redirect = { status = 308, location = \"https://{host}{uri}\" }\n\
                [[routes]]\nname = \"moved\"\nprefix = \"/old\"\nredirect = { status = 301, location = \"{uri}\" }\n\
                [[routes]]\nname = \"default-status\"\nprefix = \"/tmp\"\nredirect = { location = \"{scheme}://{host}:{port}/new?{query}\" }\n\
                [[routes]]\nname = \"login\"\nprefix = \"/q\"\nredirect = { status = 302, location = \"/login?next={uri}&v=1\" }\n\
                [[routes]]\nname = \"relative\"\nprefix = \"/\"\nredirect = { status = 302, location = \"{uri}\" }\n";
    let gw = TestGateway::from_toml(toml).await;
    let cases: &[(&str, u16, &str)] = &[
        ("GET /a/b?x=1&y=%20 HTTP/1.1\r\nHost: WWW.example.com:8080\r\n", 308, "https://www.example.com/a/b?x=1&y=%20"),
        ("POST /a HTTP/1.1\r\nHost: www.example.com.\r\nContent-Length: 0\r\n", 308, "https://www.example.com/a"),
        (
            "GET /a%0d%0aSet-Cookie:%20x HTTP/1.1\r\nHost: www.example.com\r\n",
            308,
            "https://www.example.com/a%0D%0ASet-Cookie:%20x",
        ),
        ("GET //evil.example/x HTTP/1.1\r\nHost: www.example.com\r\n", 308, "https://www.example.com//evil.example/x"),
        ("GET /old//evil.example HTTP/1.1\r\nHost: h\r\n", 301, "/old//evil.example"),
        ("GET /tmp/x?a=b HTTP/1.1\r\nHost: h.example:81\r\n", 308, "http://h.example:81/new?a=b"),
        ("GET /tmp HTTP/1.1\r\nHost: h.example\r\n", 308, "http://h.example:80/new?"),
        ("GET //evil.example/x HTTP/1.1\r\nHost: h\r\n", 302, "/evil.example/x"),
        ("GET ///evil.example HTTP/1.1\r\nHost: h\r\n", 302, "/evil.example"),
        ("GET /%2F%2Fevil.example HTTP/1.1\r\nHost: h\r\n", 302, "/%2F%2Fevil.example"),
        // A query parameter's value: the client's `&next=` stays inside it.
        ("GET /q?x=a&next=//evil HTTP/1.1\r\nHost: h\r\n", 302, "/login?next=/q%3Fx%3Da%26next%3D//evil&v=1"),
    ];
    for (head, status, location) in cases {
        let (got, loc, text) = redirected(&gw, head).await;
        assert_eq!((got, loc.as_deref()), (*status, Some(*location)), "{head:?}\n{text}");
        let injected = text.lines().any(|l| l.to_ascii_lowercase().starts_with("set-cookie"));
        assert!(!injected, "no header injected: {text}");
    }
    // An IP literal that is no IPv6 address or IPvFuture, or one with an
    // IPv6 zone ID, is no host a URL may hold: 400, never a Location.
    let (got, loc, _) = redirected(&gw, "GET /tmp HTTP/1.1\r\nHost: [V1.x]:81\r\n").await;
    assert_eq!((got, loc.as_deref()), (308, Some("http://[v1.x]:81/new?")));
    for host in ["[fe80::1%25eth0]", "[fe80::1%25eth0]:81", "[abc]", "[1.2.3.4]", "[vg.x]"] {
        let (got, loc, text) = redirected(&gw, &format!("GET /tmp HTTP/1.1\r\nHost: {host}\r\n")).await;
        assert_eq!((got, loc), (400, None), "{host}\n{text}");
    }
    // Browsers read `/\` as `//`: such a target is refused, never redirected.
    let (got, loc, text) = redirected(&gw, "GET /\\evil.example HTTP/1.1\r\nHost: h\r\n").await;
    assert_eq!((got, loc), (400, None), "{text}");
}

#[test]
fn redirect_status_and_location_are_checked() {
    for (redirect, key) in [
        ("{ status = 200, location = \"/\" }", "routes[0].redirect.status"),
        ("{ status = 304, location = \"/\" }", "routes[0].redirect.status"),
        ("{ status = 301, location = \"https://{hots}/\" }", "routes[0].redirect.location"),
        ("{ status = 301, location = \"a b\" }", "routes[0].redirect.location"),
    ] {
        let toml = format!("[[routes]]\nname = \"r\"\nprefix = \"/\"\nredirect = {redirect}\n");
        let err = load(&toml).expect_err(redirect);
        assert!(err.contains(key), "{redirect}: {err}");
    }
}

#[test]
fn the_routing_page_examples_load() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/routing.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match (&mut current, line.trim()) {
            (None, "```toml") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(blocks.len() >= 5, "the page's examples: {}", blocks.len());
    for block in blocks {
        load(&block).unwrap_or_else(|e| panic!("{e}\n{block}"));
    }
}
