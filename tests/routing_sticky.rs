//! A sticky split that sets its own cookie (docs/routing.md#weighted-splits-and-sticky-canaries),
//! end to end: a client without the cookie is given one, safe and naming
//! no upstream, that keeps it on its version on every later request and
//! across a reload.

mod common;

use bytes::Bytes;
use common::{TestGateway, TestUpstream, assert_refused_at_load, full, send};
use http::{Request, Response};

/// An upstream answering `NAME cookie:VALUE`, VALUE the `Cookie` it got.
async fn naming(name: &'static str) -> TestUpstream {
    TestUpstream::start(move |req: Request<hyper::body::Incoming>| async move {
        let cookie = req.headers().get("cookie").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        Response::new(full(format!("{name} cookie:{cookie}")))
    })
    .await
}

fn toml(v1: &TestUpstream, v2: &TestUpstream, extra: &str) -> String {
    format!(
        "[upstreams.v1]\nurl = \"http://{}\"\n[upstreams.v2]\nurl = \"http://{}\"\n\
         [[routes]]\nname = \"api\"\nprefix = \"/\"\n\
         split = [{{ upstream = \"v1\", weight = 50 }}, {{ upstream = \"v2\", weight = 50 }}]\n\
         sticky = {{ cookie = \"gw_v\", set = true, max_age = \"1day\" }}\n{extra}\n",
        v1.addr, v2.addr
    )
}

/// The version that answers `GET /x` with these cookies, what it saw of
/// them, and the `Set-Cookie` fields of the answer.
async fn ask(gw: &TestGateway, cookie: Option<&str>) -> (String, String, Vec<String>) {
    let mut req = Request::get(gw.url("/x"));
    if let Some(cookie) = cookie {
        req = req.header("cookie", cookie);
    }
    let (parts, body) = send(req.body(full(Bytes::new())).unwrap()).await;
    assert_eq!(parts.status, 200);
    let set: Vec<String> = parts.headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_owned()).collect();
    let body = String::from_utf8(body.to_vec()).unwrap();
    let (version, seen) = body.split_once(" cookie:").unwrap();
    (version.to_owned(), seen.to_owned(), set)
}

#[tokio::test]
async fn a_new_client_gets_a_cookie_that_keeps_it_on_its_version_across_a_reload() {
    let (v1, v2) = (naming("v1").await, naming("v2").await);
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::from_file(dir.path(), &toml(&v1, &v2, "")).await;
    let mut users = Vec::new();
    for _ in 0..100 {
        let (version, seen, set) = ask(&gw, Some("theme=dark")).await;
        assert_eq!(set.len(), 1, "{set:?}");
        let field = &set[0];
        let key = field.strip_prefix("gw_v=").and_then(|f| f.split(';').next()).unwrap().to_owned();
        assert!(key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{field}");
        assert_eq!(field, &format!("gw_v={key}; Path=/; HttpOnly; SameSite=Lax; Max-Age=86400"));
        // The upstream sees the cookie the client will send from now on.
        assert_eq!(seen, format!("theme=dark; gw_v={key}"));
        users.push((format!("gw_v={key}"), version));
    }
    let on_v2 = users.iter().filter(|(_, v)| v == "v2").count();
    assert!((25..=75).contains(&on_v2), "about half on each version: {on_v2}");
    keep(&gw, &users).await;
    std::fs::write(dir.path().join("gateway.toml"), toml(&v1, &v2, "timeout = \"9s\"")).unwrap();
    gw.app.reload().unwrap();
    keep(&gw, &users).await;
}

/// Each user, sending its cookie among others, stays on its version and
/// is given no new cookie.
async fn keep(gw: &TestGateway, users: &[(String, String)]) {
    for (cookie, version) in users {
        let (now, seen, set) = ask(gw, Some(&format!("a=1; {cookie}"))).await;
        assert_eq!((&now, set.len()), (version, 0), "{cookie}: its version, no new cookie");
        assert_eq!(seen, format!("a=1; {cookie}"));
    }
}

/// A client sending the cookie empty (`gw_v=`) is given a key, and the
/// upstream sees one `gw_v`, the new key, among its other cookies as they
/// were. Before, it saw `gw_v=; gw_v=KEY`, and a parser that takes the
/// first saw the empty one.
#[tokio::test]
async fn an_empty_cookie_is_replaced_not_kept_beside_the_new_key() {
    let (v1, v2) = (naming("v1").await, naming("v2").await);
    let gw = TestGateway::from_toml(&toml(&v1, &v2, "")).await;
    for (sent, others) in [("gw_v=", ""), ("a=1; gw_v=; b=2", "a=1; b=2; "), ("gw_v=;a=1", "a=1; ")] {
        let (version, seen, set) = ask(&gw, Some(sent)).await;
        assert_eq!(set.len(), 1, "{sent}: {set:?}");
        let key = set[0].strip_prefix("gw_v=").and_then(|f| f.split(';').next()).unwrap();
        assert_eq!(seen, format!("{others}gw_v={key}"), "{sent}");
        let (again, _, set) = ask(&gw, Some(&seen)).await;
        assert_eq!((again, set.len()), (version, 0), "{sent}: what the upstream saw keeps the version");
    }
}

#[tokio::test]
async fn without_set_no_cookie_is_given() {
    let (v1, v2) = (naming("v1").await, naming("v2").await);
    let text = toml(&v1, &v2, "").replace(", set = true, max_age = \"1day\"", "");
    let gw = TestGateway::from_toml(&text).await;
    let (_, seen, set) = ask(&gw, None).await;
    assert_eq!((seen.as_str(), set.len()), ("", 0));
}

#[test]
fn sticky_tables_are_checked_with_their_key() {
    let ups = "[upstreams.v1]\nurl = \"http://127.0.0.1:1\"\n[upstreams.v2]\nurl = \"http://127.0.0.1:2\"\n";
    let split = "split = [{ upstream = \"v1\", weight = 1 }, { upstream = \"v2\", weight = 1 }]";
    for (sticky, key) in [
        ("{ cookie = \"a\", header = \"b\" }", "routes[0].sticky"),
        ("{ set = true }", "routes[0].sticky"),
        ("{ header = \"x-user\", set = true }", "routes[0].sticky.set"),
        ("{ cookie = \"a\", max_age = \"1h\" }", "routes[0].sticky.max_age"),
        ("{ cookie = \"a\", set = true, max_age = \"soon\" }", "routes[0].sticky.max_age"),
        ("{ cookie = \"a;b\", set = true }", "routes[0].sticky"),
    ] {
        let toml = format!("{ups}[[routes]]\nname = \"r\"\nprefix = \"/\"\n{split}\nsticky = {sticky}\n");
        assert_refused_at_load(&toml, key);
    }
}

/// A client sending the cookie twice, empty first (`gw_v=; gw_v=KEY`), is
/// routed by `KEY`, and the upstream sees that pair alone beside the other
/// cookies: before, it saw `gw_v=; gw_v=KEY`, and a parser that takes the
/// first read it empty. The same with `set` or without.
#[tokio::test]
async fn the_upstream_sees_only_the_cookie_the_route_was_chosen_by() {
    let (v1, v2) = (naming("v1").await, naming("v2").await);
    for text in [toml(&v1, &v2, ""), toml(&v1, &v2, "").replace(", set = true, max_age = \"1day\"", "")] {
        let gw = TestGateway::from_toml(&text).await;
        let (version, seen, _) = ask(&gw, Some("gw_v=abc")).await;
        assert_eq!(seen, "gw_v=abc");
        for sent in ["gw_v=; gw_v=abc", "a=1; gw_v=;b=2; gw_v=abc; gw_v=def"] {
            let (now, seen, set) = ask(&gw, Some(sent)).await;
            assert_eq!((&now, set.len()), (&version, 0), "{sent}");
            let want = if sent.starts_with("a=1") { "a=1; b=2; gw_v=abc" } else { "gw_v=abc" };
            assert_eq!(seen, want, "{sent}");
        }
    }
}
