//! Path normalisation before routing: a route's policy cannot be bypassed
//! with `//`, dot segments or percent-encoding, and the upstream receives the
//! normalised path.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use http::Request;

/// Held by the tests that make or count `bad_path` rejections on the
/// `unmatched` route, which every gateway in this test binary shares: one
/// test's 400s must not land between another's readings.
static COUNTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `/api` proxies to an upstream that echoes the request line; `/api/admin`
/// is refused with 403; `/b` rewrites to `/a` on the same upstream.
fn policy_toml(up: SocketAddr, extra_server: &str) -> String {
    format!(
        r#"
[server]
{extra_server}
[upstreams.echo]
url = "http://{up}"

[[routes]]
name = "api"
prefix = "/api"
upstream = "echo"

[[routes]]
name = "admin"
prefix = "/api/admin"
respond = {{ status = 403, body = "forbidden" }}

[[routes]]
name = "b"
prefix = "/b"
upstream = "echo"
rewrite = "/a"
"#
    )
}

async fn echo() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        http::Response::new(full(format!("{}", req.uri())))
    })
    .await
}

/// Sends `target` exactly as written (no client-side normalisation) and
/// returns the status and body.
async fn raw_get(addr: SocketAddr, target: &str) -> (u16, String) {
    let r = raw(
        addr,
        format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        Duration::from_secs(3),
    )
    .await;
    let body = r.text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (r.status(), body)
}

#[tokio::test]
async fn route_policy_cannot_be_bypassed_with_slashes_dots_or_encoding() {
    let up = echo().await;
    let gw = TestGateway::from_toml(&policy_toml(up.addr, "")).await;
    for target in [
        "/api/admin",
        "/api//admin",
        "/api/./admin",
        "/api/x/../admin",
        "/api/%61dmin",
        "/api/%2e/admin",
        "/api/x/%2E%2E/admin",
        "//api///admin/",
        "/api/admin/.",
        "/api/ADMIN/../admin",
    ] {
        assert_eq!(raw_get(gw.addr, target).await, (403, "forbidden".to_owned()), "{target}");
    }
    assert_eq!(up.connections(), 0, "nothing may reach the upstream");
}

#[tokio::test]
async fn a_dot_segment_with_a_parameter_is_400_not_routed_past_a_policy() {
    let _one_at_a_time = COUNTING.lock().await;
    // `..;` is `..` to servers that strip `;` parameters (Tomcat, Jetty):
    // routed as written it would reach /api/admin past its policy.
    let up = echo().await;
    let gw = TestGateway::from_toml(&policy_toml(up.addr, "")).await;
    for target in ["/api/x/..;/admin", "/api/x/%2e%2e;/admin", "/api/.;/admin", "/x/..;jsessionid=1/api/admin"] {
        assert_eq!(raw_get(gw.addr, target).await.0, 400, "{target}");
    }
    assert_eq!(up.connections(), 0, "nothing may reach the upstream");
}

/// A server that splits segments at `%2F` (Werkzeug and other WSGI
/// servers decode it) or drops `;` parameters (Tomcat, Jetty) reads
/// `/api/admin%2Fx` and `/api/admin;x/y` as under `/api/admin`: routed on
/// their segments as written, they reached it through the open `/api`.
/// They now choose the route such a server would (here the 403), or, when
/// the path does not carry that route's prefix as written, 400; a path
/// with parameters outside any guarded prefix is served as before.
#[tokio::test]
async fn route_policy_cannot_be_bypassed_with_an_encoded_slash_or_parameters() {
    let _one_at_a_time = COUNTING.lock().await;
    let up = echo().await;
    let gw = TestGateway::from_toml(&policy_toml(up.addr, "")).await;
    for (target, want) in [
        ("/api/admin%2Fx", 403),
        ("/api/admin%2fx", 403),
        ("/api/admin;x/y", 403),
        ("/api/admin;jsessionid=1", 403),
        ("/api%2Fadmin", 400),
        ("/api;v=1/admin", 400),
        ("/api/x%2F..%2Fadmin", 400),
    ] {
        assert_eq!(raw_get(gw.addr, target).await.0, want, "{target}");
    }
    assert_eq!(up.connections(), 0, "nothing may reach the upstream");
    let served =
        [("/api;jsessionid=1/x", "/api;jsessionid=1/x"), ("/api/x%2Fy", "/api/x%2Fy"), ("/b;s=1/y", "/a;s=1/y")];
    for (sent, want) in served {
        assert_eq!(raw_get(gw.addr, sent).await, (200, want.to_owned()), "{sent}");
    }
}

#[tokio::test]
async fn the_upstream_receives_the_normalised_path() {
    let up = echo().await;
    let gw = TestGateway::from_toml(&policy_toml(up.addr, "")).await;
    let cases = [
        ("/api//x///y", "/api/x/y"),
        ("/api/x/./y/../z?q=/../a", "/api/x/z?q=/../a"),
        ("/api/%7euser/%41%42", "/api/~user/AB"),
        ("/api/a%2fb", "/api/a%2Fb"),
        ("/api/a%5cb", "/api/a%5Cb"),
        ("/api/sp%20ace", "/api/sp%20ace"),
        ("/api/%e2%82%ac", "/api/%E2%82%AC"),
        ("/b/x/../y", "/a/y"),
    ];
    for (sent, want) in cases {
        assert_eq!(raw_get(gw.addr, sent).await, (200, want.to_owned()), "{sent}");
    }
}

#[tokio::test]
async fn a_raw_backslash_is_refused_whatever_the_settings() {
    let _one_at_a_time = COUNTING.lock().await;
    // WHATWG URL parsers (Node, Deno, Bun) read `\` as `/`: `/api/x/..\admin`
    // would be `/api/admin` to such an upstream.
    let up = echo().await;
    for server in ["", "reject_encoded_slash = true"] {
        let gw = TestGateway::from_toml(&policy_toml(up.addr, server)).await;
        for target in ["/api/x/..\\admin", "/api/x\\..\\admin", "/api\\admin", "/api/a\\b"] {
            assert_eq!(raw_get(gw.addr, target).await.0, 400, "{target} ({server})");
        }
    }
    assert_eq!(up.connections(), 0);
}

#[tokio::test]
async fn a_rewrite_cannot_be_escaped_with_dot_segments() {
    let up = echo().await;
    let gw = TestGateway::from_toml(&policy_toml(up.addr, "")).await;
    // /b/../internal/secret is /internal/secret: no route, never /a/../internal/secret.
    assert_eq!(raw_get(gw.addr, "/b/../internal/secret").await.0, 404);
    assert_eq!(raw_get(gw.addr, "/b/%2e%2e/internal").await.0, 404);
    assert_eq!(up.connections(), 0);
}

#[tokio::test]
async fn climbing_above_the_root_or_a_refused_encoded_slash_is_400_and_counted() {
    let _one_at_a_time = COUNTING.lock().await;
    let up = echo().await;
    let gw = TestGateway::from_toml(&policy_toml(up.addr, "")).await;
    let before = rejected(&metrics_text(gw.addr).await, "unmatched", "bad_path");
    for target in ["/..", "/../api/x", "/api/../../x", "/api/%2e%2e/%2E%2E/x"] {
        assert_eq!(raw_get(gw.addr, target).await.0, 400, "{target}");
    }
    assert_eq!(up.connections(), 0);
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "unmatched", "bad_path") - before, 4.0, "{m}");

    // merge_slashes off keeps them; reject_encoded_slash refuses %2F and %5C.
    let gw = TestGateway::from_toml(&policy_toml(up.addr, "merge_slashes = false\nreject_encoded_slash = true")).await;
    assert_eq!(raw_get(gw.addr, "/api/x//y").await, (200, "/api/x//y".to_owned()));
    assert_eq!(raw_get(gw.addr, "/api/a%2Fb").await.0, 400);
    assert_eq!(raw_get(gw.addr, "/api/a%5cb").await.0, 400);
    // Dot segments are still removed.
    assert_eq!(raw_get(gw.addr, "/api/x/../admin").await.0, 403);
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "unmatched", "bad_path") - before, 6.0, "{m}");
}
