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
    let cases: &[(&str, &[(&str, &str)], &str)] = &[
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
    let refused: &[(&[(&str, &str, &str)], &str)] = &[
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
        ("headers = { \"bad name\" = \"1\" }", "routes[0].headers.bad name"),
        ("headers = { host = \"1\" }", "routes[0].headers.host"),
        ("headers = { x = { regex = \"(\" } }", "routes[0].headers.x"),
        ("query = { v = { regex = \"a{100000}\" } }", "routes[0].query.v"),
    ];
    for (extra, key) in cases {
        let err = load(&answering(&[("a", "/", extra)])).expect_err(extra);
        assert!(err.contains(key), "{extra}: {err}");
    }
}
